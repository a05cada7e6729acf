//! The macros that make the C ABI's types from the crate's lists, so that each list
//! is written once (issue 10, "one list, many uses"; rustls-ffi's enum builder is the
//! model): a C enum's integer conversion and name table, a versioned struct's field
//! offsets, the snapshot's conversion.
//!
//! The lists themselves live with what they describe: the status and backend values
//! in [`super::types`], the reuse policies in `pool/config.rs`, the driver calls in
//! `driver/mod.rs`, the snapshot's counters in `pool/snapshot.rs`. A list macro hands
//! its rows to a generator (`list!(generator! { head })` expands to
//! `generator! { head rows }`), so the Rust side and the C side are each generated
//! from the same rows.
//!
//! cbindgen does not expand macros, so every type made here also carries its own
//! Rust source, `RUST_SOURCE`, made by `stringify!` from the very tokens that define
//! it: [`super::cbindgen_sources`] hands them to `tests/c_abi/header.rs`, which gives them
//! to cbindgen together with `src/ffi/`.

/// `s` (which ends with its NUL) as a C string. For constants only: a string that is
/// not one stops the build.
pub(crate) const fn c_str(s: &'static str) -> &'static std::ffi::CStr {
    match std::ffi::CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("not a NUL-terminated string without interior NUL"),
    }
}

/// Defines the item(s) after `Name;` and `Name::RUST_SOURCE`, their source text.
macro_rules! with_rust_source {
    ($name:ident; $($item:tt)*) => {
        $($item)*

        impl $name {
            /// The Rust source of this type, for cbindgen, which does not expand
            /// macros (`tests/c_abi/header.rs`). Not part of the API.
            #[doc(hidden)]
            pub const RUST_SOURCE: &'static str = stringify!($($item)*);
        }
    };
}
pub(crate) use with_rust_source;

/// A `#[repr(C)]` enum of the C ABI from a list of rows, numbered 0, 1, ... in row
/// order (checked when the crate is built), with:
/// - `ALL`, every value in number order; `from_raw`, the value with a number as C
///   passes it, if any; `parse`, the same or `Error::InvalidArgument` naming the
///   argument;
/// - `name`, the enumerator's name as C spells it (a static C string).
///
/// Three forms of rows:
/// - `C_NAME = number;`
/// - `C_NAME = number <- ErrorVariant;` with `pub enum X from Error;`: also
///   `X::from_error`, the value a call that failed with that `Error` variant returns
///   (each variant must have one: the match is exhaustive);
/// - `RustVariant = number, C_NAME, "name";` with `pub enum X for RustEnum;` (the
///   rows of a crate enum's list, whose Rust side is generated from the same rows):
///   also `From<X> for RustEnum`. A trailing `@not_in_c { ... }` group of rows (Rust
///   values the C ABI leaves out) is skipped.
macro_rules! c_enum {
    (
        $(#[doc = $doc:literal])*
        pub enum $name:ident for $twin:ident;
        $( $(#[doc = $vdoc:literal])* $rust:ident = $n:literal, $c:ident, $s:literal; )*
        $( @not_in_c { $($rest:tt)* } )?
    ) => {
        $crate::ffi::generate::c_enum! {
            $(#[doc = $doc])*
            pub enum $name;
            $( $(#[doc = $vdoc])* $c = $n; )*
        }

        impl From<$name> for $twin {
            fn from(c: $name) -> Self {
                match c {
                    $( $name::$c => $twin::$rust, )*
                }
            }
        }
    };
    (
        $(#[doc = $doc:literal])*
        pub enum $name:ident from Error;
        $( $(#[doc = $vdoc:literal])* $c:ident = $n:literal $(<- $err:ident)?; )*
    ) => {
        $crate::ffi::generate::c_enum! {
            $(#[doc = $doc])*
            pub enum $name;
            $( $(#[doc = $vdoc])* $c = $n; )*
        }

        impl $name {
            /// The value a call that failed with `e` returns.
            pub(crate) fn from_error(e: &$crate::Error) -> Self {
                match e {
                    $($( $crate::Error::$err { .. } => $name::$c, )?)*
                }
            }
        }
    };
    (
        $(#[doc = $doc:literal])*
        pub enum $name:ident;
        $( $(#[doc = $vdoc:literal])* $c:ident = $n:literal; )*
    ) => {
        $crate::ffi::generate::with_rust_source! { $name;
            $(#[doc = $doc])*
            #[repr(C)]
            #[allow(non_camel_case_types)]
            #[derive(Clone, Copy, Debug, PartialEq, Eq)]
            pub enum $name {
                $( $(#[doc = $vdoc])* $c = $n, )*
            }
        }

        impl $name {
            /// Every value, in number order (0, 1, ...).
            pub const ALL: [$name; [$($n),*].len()] = [$($name::$c),*];

            /// The value numbered `raw` (as C passes it), if there is one.
            pub fn from_raw(raw: u32) -> Option<$name> {
                usize::try_from(raw).ok().and_then(|i| $name::ALL.get(i).copied())
            }

            /// [`Self::from_raw`], or `Error::InvalidArgument` saying that `what` (the
            /// argument or field it came in) is not one.
            pub fn parse(raw: u32, what: &str) -> Result<$name, $crate::Error> {
                $name::from_raw(raw).ok_or_else(|| {
                    $crate::Error::InvalidArgument(format!(
                        "{what} {raw} is not a {} (0..{})",
                        stringify!($name),
                        $name::ALL.len() - 1
                    ))
                })
            }

            /// The enumerator's name as C spells it (the variant's own name,
            /// `"FLARE_..."`). Static storage.
            pub fn name(self) -> &'static std::ffi::CStr {
                match self {
                    $( $name::$c => const {
                        $crate::ffi::generate::c_str(concat!(stringify!($c), "\0"))
                    }, )*
                }
            }
        }

        // `ALL` is in number order: `from_raw` takes a number as an index in it.
        const _: () = assert!($crate::lists::numbered_from_zero(&[$($n),*]));
    };
}
pub(crate) use c_enum;

/// A versioned `#[repr(C)]` struct of the C ABI (its first field `struct_size`), with
/// `FIELD_ENDS`: the end of each field in bytes from the start, in layout order (the
/// prefixes a caller's `struct_size` may cover, [`super::types::struct_prefix`]).
macro_rules! versioned_struct {
    (
        $(#[doc = $doc:literal])*
        #[derive($($derive:ident),*)]
        pub struct $name:ident {
            $( $(#[doc = $fdoc:literal])* pub $f:ident: $t:ty, )*
        }
    ) => {
        $crate::ffi::generate::with_rust_source! { $name;
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive($($derive),*)]
            pub struct $name {
                $( $(#[doc = $fdoc])* pub $f: $t, )*
            }
        }

        impl $name {
            /// The end of each field, bytes from the start, in layout order.
            pub(crate) const FIELD_ENDS: [usize; [$(stringify!($f)),*].len()] =
                [$( std::mem::offset_of!($name, $f) + std::mem::size_of::<$t>() ),*];
        }
    };
}
pub(crate) use versioned_struct;

/// `FlareSnapshot` from the rows of [`crate::pool::snapshot_counters`]: `struct_size`
/// and `scope_open` (a `uint32_t`, 0 or 1), then each counter as a `uint64_t`, in row
/// order; and `from_snapshot`, the C copy of a [`crate::Snapshot`].
macro_rules! c_snapshot {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident;
        $( $(#[doc = $fdoc:literal])* $f:ident $(counts $call:ident)?, )*
    ) => {
        $crate::ffi::generate::versioned_struct! {
            $(#[doc = $doc])*
            #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
            pub struct $name {
                /// `sizeof(FlareSnapshot)`, bytes; set by the caller.
                pub struct_size: u32,
                /// 1 while a retention scope is open, else 0.
                pub scope_open: u32,
                $( $(#[doc = $fdoc])* pub $f: u64, )*
            }
        }

        impl $name {
            /// The C copy of `s`; `struct_size` is this library's size.
            pub(crate) fn from_snapshot(s: &$crate::Snapshot) -> Self {
                $name {
                    struct_size: std::mem::size_of::<$name>() as u32,
                    scope_open: u32::from(s.scope_open),
                    $( $f: s.$f, )*
                }
            }
        }
    };
}
pub(crate) use c_snapshot;
