//! Which function `flare_torch_alloc` calls when an allocation fails, instead of
//! returning NULL, which PyTorch's per-tensor path wraps in a tensor at address 0
//! without checking (pytorch #133280). Issue 34: the Python package's `install()`
//! hands PyTorch's `torchCheckFail` over (`flare_torch_set_oom_handler`), but the
//! pair loaded as PyTorch's documentation shows (`CUDAPluggableAllocator(path,
//! "flare_torch_alloc", "flare_torch_free")` and `change_current_allocator`) never
//! calls the package, so the library finds that function itself. In order:
//!
//! 1. the handler set with `flare_torch_set_oom_handler` (NULL sets none);
//! 2. unless `FLARE_TORCH_OOM=null`: PyTorch's own `c10::detail::torchCheckFail`
//!    found in the process, looked up once, at the first failure: first in the
//!    global scope and this library's own dependencies (`dlsym(RTLD_DEFAULT)`: a C++
//!    program linked with libc10, or a process that loaded it `RTLD_GLOBAL`), then
//!    in `libc10.so` if it is loaded already (`dlopen` with `RTLD_NOLOAD`, which
//!    loads nothing): Python imports PyTorch's libraries `RTLD_LOCAL`, so in a
//!    Python process the global scope does not hold it, but any process in which
//!    PyTorch calls `flare_torch_alloc` has loaded it;
//! 3. none: NULL is returned (a C++ caller without PyTorch, or `FLARE_TORCH_OOM=null`).

use std::ffi::{c_char, c_void, CStr};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The type of an out-of-memory handler (`FlareTorchOomHandler` without the NULL):
/// `c10::detail::torchCheckFail(const char *func, const char *file, uint32_t line,
/// const char *msg)`.
pub(super) type OomFn = unsafe extern "C-unwind" fn(
    func: *const c_char,
    file: *const c_char,
    line: u32,
    msg: *const c_char,
);

/// `c10::detail::torchCheckFail(const char*, const char*, uint32_t, const char*)`
/// mangled (Itanium C++ ABI), as `libc10.so` exports it; the Python package looks up
/// the same name (`TORCH_CHECK_FAIL` in `python/flare_package/__init__.py`).
pub(super) const TORCH_CHECK_FAIL: &CStr = c"_ZN3c106detail14torchCheckFailEPKcS2_jS2_";

/// PyTorch's core library, whose SONAME is this name (matched by `dlopen` among
/// the loaded objects).
#[cfg(target_os = "linux")]
const C10_LIBRARY: &CStr = c"libc10.so";

/// The environment variable that, set to `null`, keeps the library from looking up
/// PyTorch's function (a failure then returns NULL unless a handler is set).
pub(super) const OOM_ENV: &str = "FLARE_TORCH_OOM";

/// The handler set with `flare_torch_set_oom_handler` (`None`: none set).
static EXPLICIT: Mutex<Option<OomFn>> = Mutex::new(None);

/// The process's `torchCheckFail`, looked up at the first failure with no handler
/// set (`None`: not found, or `FLARE_TORCH_OOM=null`).
static PROCESS: OnceLock<Option<OomFn>> = OnceLock::new();

/// Sets the handler (`None`: back to the process's `torchCheckFail`, else NULL).
pub(super) fn set_explicit(handler: Option<OomFn>) {
    *EXPLICIT.lock().unwrap_or_else(PoisonError::into_inner) = handler;
}

/// The function to call for a failed allocation, in the order of the module's
/// documentation; `None`: return NULL. The first call with no handler set reads
/// `FLARE_TORCH_OOM` and looks PyTorch's function up; later ones reuse the answer.
pub(super) fn handler() -> Option<OomFn> {
    let explicit = *EXPLICIT.lock().unwrap_or_else(PoisonError::into_inner);
    choose(explicit, || {
        *PROCESS.get_or_init(|| {
            process_handler(std::env::var(OOM_ENV).ok().as_deref(), find_in_process)
        })
    })
}

/// The order: the handler set, else what `process` gives (called only then).
fn choose(explicit: Option<OomFn>, process: impl FnOnce() -> Option<OomFn>) -> Option<OomFn> {
    explicit.or_else(process)
}

/// The process's handler given `FLARE_TORCH_OOM`'s value (`None`: unset): none when
/// it turns the lookup off (`find` is then not called), else what `find` finds.
fn process_handler(oom_env: Option<&str>, find: impl FnOnce() -> Option<OomFn>) -> Option<OomFn> {
    if lookup_disabled(oom_env) {
        None
    } else {
        find()
    }
}

/// Whether `FLARE_TORCH_OOM`'s value (`None`: unset) turns the lookup off: `null`,
/// spaces around it allowed, as the Python package reads it.
fn lookup_disabled(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "null")
}

/// PyTorch's `torchCheckFail` in this process, if there is one (module
/// documentation, step 2).
#[cfg(unix)]
fn find_in_process() -> Option<OomFn> {
    let f = find_symbol(TORCH_CHECK_FAIL)?;
    // SAFETY: `f` is the non-NULL address of the function named by TORCH_CHECK_FAIL.
    // Its Itanium mangling fixes the parameters (`const char*`, `const char*`,
    // `unsigned int`, `const char*`: `PKcS2_jS2_`), which a C++ function on the
    // Itanium ABI takes as a C function does; the return type is not in the name of a
    // non-template function, and PyTorch declares it `[[noreturn]] void`
    // (`c10/util/Exception.h`), which `OomFn`'s `()` matches. It throws
    // `c10::Error`, an unwind that `OomFn`'s `C-unwind` allows (see
    // `flare_torch_alloc`).
    Some(unsafe { std::mem::transmute::<*mut c_void, OomFn>(f.as_ptr()) })
}

/// No dynamic loader to ask: the step is skipped.
#[cfg(not(unix))]
fn find_in_process() -> Option<OomFn> {
    None
}

/// The address of `name` in the global scope, else (Linux) in `libc10.so` if it is
/// loaded.
#[cfg(unix)]
fn find_symbol(name: &CStr) -> Option<NonNull<c_void>> {
    let global = in_global_scope(name);
    #[cfg(target_os = "linux")]
    let global = global.or_else(|| in_loaded_library(C10_LIBRARY, name));
    global
}

/// `dlsym(RTLD_DEFAULT, name)`: the global scope and this library's dependencies.
#[cfg(unix)]
fn in_global_scope(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only searches the
    // loaded objects' symbol tables; it loads and runs nothing.
    NonNull::new(unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) })
}

/// `name` in `library` if that is loaded already (matched by file name or SONAME),
/// which may be outside the global scope (loaded `RTLD_LOCAL`); never loads it. A
/// handle that found the symbol is kept open (so the library stays loaded while
/// its function is kept), one that did not is closed.
#[cfg(target_os = "linux")]
fn in_loaded_library(library: &CStr, name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: `RTLD_NOLOAD` returns a handle only for an object already loaded and
    // loads nothing, so no constructor runs; the name is NUL-terminated.
    let lib = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        return None;
    }
    // SAFETY: `lib` is a live handle from `dlopen`; the name is NUL-terminated.
    let f = NonNull::new(unsafe { libc::dlsym(lib, name.as_ptr()) });
    if f.is_none() {
        // SAFETY: `lib` came from `dlopen` above (one reference of ours, taken by
        // that call) and nothing found through it is kept.
        unsafe { libc::dlclose(lib) };
    }
    f
}

#[cfg(all(test, not(flare_loom)))]
mod tests {
    use super::*;

    thread_local! {
        /// Which stand-in ran last on this thread.
        static RAN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    /// Stand-ins for handlers: each says it ran (function pointers cannot be told
    /// apart by address: one function may have several).
    unsafe extern "C-unwind" fn one(_: *const c_char, _: *const c_char, _: u32, _: *const c_char) {
        RAN.with(|r| r.set(1));
    }
    unsafe extern "C-unwind" fn two(_: *const c_char, _: *const c_char, _: u32, _: *const c_char) {
        RAN.with(|r| r.set(2));
    }
    const ONE: OomFn = one;
    const TWO: OomFn = two;

    /// Which stand-in `f` is (1 or 2), found by calling it; `None` for none.
    fn which(f: Option<OomFn>) -> Option<u32> {
        let f = f?;
        RAN.with(|r| r.set(0));
        // SAFETY: `f` is `one` or `two`, which read none of their arguments.
        unsafe { f(std::ptr::null(), std::ptr::null(), 0, std::ptr::null()) };
        Some(RAN.with(|r| r.get()))
    }

    #[test]
    fn the_handler_set_comes_first_and_the_process_is_not_asked() {
        let asked = std::cell::Cell::new(false);
        let got = choose(Some(ONE), || {
            asked.set(true);
            Some(TWO)
        });
        assert_eq!(which(got), Some(1));
        assert!(!asked.get());
        // None set: the process's, or none.
        assert_eq!(which(choose(None, || Some(TWO))), Some(2));
        assert_eq!(which(choose(None, || None)), None);
    }

    #[test]
    fn flare_torch_oom_null_skips_the_lookup_and_anything_else_does_not() {
        let asked = std::cell::Cell::new(0);
        let find = || {
            asked.set(asked.get() + 1);
            Some(ONE)
        };
        assert_eq!(which(process_handler(Some("null"), find)), None);
        assert_eq!(which(process_handler(Some(" null\n"), find)), None);
        assert_eq!(asked.get(), 0);
        for v in [
            None,
            Some(""),
            Some("NULL"),
            Some("0"),
            Some("nul"),
            Some("null1"),
        ] {
            assert_eq!(which(process_handler(v, find)), Some(1), "{v:?}");
        }
        assert_eq!(asked.get(), 6);
    }

    #[test]
    fn the_symbol_is_torch_check_fail_of_the_python_package() {
        let py = include_str!("../../python/flare_package/__init__.py");
        let name = TORCH_CHECK_FAIL.to_string_lossy();
        assert!(
            py.contains(&format!("TORCH_CHECK_FAIL = \"{name}\"")),
            "python/flare_package/__init__.py names another symbol than {name}"
        );
    }

    /// The global scope's step finds what the process has (the C library's
    /// `malloc`) and not what it lacks.
    #[cfg(unix)]
    #[test]
    fn the_global_scope_is_searched() {
        assert!(in_global_scope(c"malloc").is_some());
        assert!(in_global_scope(c"flare_no_such_symbol_anywhere").is_none());
        assert!(find_symbol(c"malloc").is_some());
    }

    /// The loaded-library step finds a symbol of a library that is loaded (glibc's
    /// `libc.so.6`), nothing in one that is not loaded (and does not load it), and
    /// nothing that the library lacks.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_loaded_library_is_searched_and_nothing_is_loaded() {
        assert!(in_loaded_library(c"libc.so.6", c"malloc").is_some());
        assert!(in_loaded_library(c"libc.so.6", TORCH_CHECK_FAIL).is_none());
        // A name no file has: not loaded, and RTLD_NOLOAD does not try to load it.
        assert!(in_loaded_library(c"libflare-not-a-library.so", c"malloc").is_none());
    }

    /// A test binary has no `torchCheckFail` and does not load libc10: nothing is
    /// found (NULL would be returned), and the lookup does not fail.
    #[test]
    fn a_process_without_pytorch_has_no_handler() {
        assert!(find_in_process().is_none());
    }
}
