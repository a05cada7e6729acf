//! The library's version at run time, `flare_package_version` and
//! `flare_package_version_string`, to compare with the header's
//! `FLARE_PACKAGE_VERSION` and `FLARE_PACKAGE_VERSION_STRING` (both made from
//! Cargo.toml's version: the macros by `tests/c_abi/headers.rs`, the values here by
//! `CARGO_PKG_VERSION_*`), as zstd's `ZSTD_versionNumber` and `ZSTD_versionString`.

use std::ffi::{c_char, CStr};

use super::generate::c_str;

/// A decimal version component (`"12"`) as a number, at compile time. Not one, or
/// 100 or more (the number `MAJOR * 10000 + MINOR * 100 + PATCH` would be ambiguous):
/// the build stops.
pub(in crate::ffi) const fn component(s: &str) -> u32 {
    let bytes = s.as_bytes();
    assert!(!bytes.is_empty(), "empty version component");
    let mut n = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        assert!(
            bytes[i].is_ascii_digit(),
            "version component is not a number"
        );
        n = n * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    n
}

/// `MAJOR * 10000 + MINOR * 100 + PATCH` (1.2.3 is 10203), the encoding of
/// `FLARE_PACKAGE_VERSION`. MINOR or PATCH of 100 or more, or a number past `u32`,
/// would be ambiguous: the build stops (it is evaluated at compile time).
pub(in crate::ffi) const fn encode(major: u32, minor: u32, patch: u32) -> u32 {
    assert!(
        minor < 100 && patch < 100 && major < 400_000,
        "MINOR and PATCH must stay below 100 for FLARE_PACKAGE_VERSION's encoding"
    );
    major * 10000 + minor * 100 + patch
}

/// `MAJOR * 10000 + MINOR * 100 + PATCH` of Cargo.toml's version (0.2.0 is 200).
pub(crate) const VERSION_NUMBER: u32 = encode(
    component(env!("CARGO_PKG_VERSION_MAJOR")),
    component(env!("CARGO_PKG_VERSION_MINOR")),
    component(env!("CARGO_PKG_VERSION_PATCH")),
);

/// Cargo.toml's version, `"MAJOR.MINOR.PATCH"`, as a C string.
const VERSION_STRING: &CStr = c_str(concat!(env!("CARGO_PKG_VERSION"), "\0"));

/// The version of the library linked at run time, as a number: `MAJOR * 10000 +
/// MINOR * 100 + PATCH` (0.2.0 is 200), the encoding of the header's
/// `FLARE_PACKAGE_VERSION`. A program compiled against a header checks that the
/// library it runs with is of the same MAJOR and at least the header's MINOR
/// (`flare_package_version() / 100 >= FLARE_PACKAGE_VERSION / 100` within one MAJOR:
/// docs/c-guide.md, "ABI stability"). Cannot fail. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_package_version() -> u32 {
    VERSION_NUMBER
}

/// The version of the library linked at run time, `"MAJOR.MINOR.PATCH"` (as the
/// header's `FLARE_PACKAGE_VERSION_STRING`). Static storage, never NULL, never freed.
/// Cannot fail. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_package_version_string() -> *const c_char {
    VERSION_STRING.as_ptr()
}
