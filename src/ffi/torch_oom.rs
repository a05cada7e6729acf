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

use std::ffi::{c_char, CStr};
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
    if let Some(f) = *EXPLICIT.lock().unwrap_or_else(PoisonError::into_inner) {
        return Some(f);
    }
    *PROCESS.get_or_init(|| {
        if lookup_disabled(std::env::var(OOM_ENV).ok().as_deref()) {
            None
        } else {
            find_in_process()
        }
    })
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
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only searches the
    // loaded objects' symbol tables; it loads and runs nothing.
    let mut f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, TORCH_CHECK_FAIL.as_ptr()) };
    #[cfg(target_os = "linux")]
    if f.is_null() {
        // SAFETY: `RTLD_NOLOAD` returns a handle only for an object already loaded
        // (matched by name or SONAME) and loads nothing, so no constructor runs; the
        // name is NUL-terminated. The handle is kept (never closed) while we keep its
        // function, so libc10 stays loaded; closed when it lacks the function.
        let lib =
            unsafe { libc::dlopen(C10_LIBRARY.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if !lib.is_null() {
            // SAFETY: `lib` is a live handle from `dlopen`; the name is NUL-terminated.
            f = unsafe { libc::dlsym(lib, TORCH_CHECK_FAIL.as_ptr()) };
            if f.is_null() {
                // SAFETY: `lib` came from `dlopen` above and nothing of it is kept.
                unsafe { libc::dlclose(lib) };
            }
        }
    }
    if f.is_null() {
        return None;
    }
    // SAFETY: `f` is the non-NULL address of the function named by TORCH_CHECK_FAIL.
    // Its Itanium mangling fixes the parameters (`const char*`, `const char*`,
    // `unsigned int`, `const char*`: `PKcS2_jS2_`), which a C++ function on the
    // Itanium ABI takes as a C function does; the return type is not in the name of a
    // non-template function, and PyTorch declares it `[[noreturn]] void`
    // (`c10/util/Exception.h`), which `OomFn`'s `()` matches. It throws
    // `c10::Error`, an unwind that `OomFn`'s `C-unwind` allows (see
    // `flare_torch_alloc`).
    Some(unsafe { std::mem::transmute::<*mut std::ffi::c_void, OomFn>(f) })
}

/// No dynamic loader to ask: the step is skipped.
#[cfg(not(unix))]
fn find_in_process() -> Option<OomFn> {
    None
}

#[cfg(all(test, not(flare_loom)))]
mod tests {
    use super::*;

    #[test]
    fn only_null_turns_the_lookup_off() {
        assert!(lookup_disabled(Some("null")));
        assert!(lookup_disabled(Some(" null\n")));
        for v in [
            None,
            Some(""),
            Some("NULL"),
            Some("0"),
            Some("nul"),
            Some("null1"),
        ] {
            assert!(!lookup_disabled(v), "{v:?}");
        }
    }

    #[test]
    fn the_symbol_is_torch_check_fail_of_the_python_package() {
        let py = include_str!("../../python/flare_package/__init__.py");
        let name = TORCH_CHECK_FAIL.to_str().unwrap();
        assert!(
            py.contains(&format!("TORCH_CHECK_FAIL = \"{name}\"")),
            "python/flare_package/__init__.py names another symbol than {name}"
        );
    }

    /// A test binary has no `torchCheckFail` and does not load libc10: nothing is
    /// found (NULL would be returned), and the lookup does not fail.
    #[test]
    fn a_process_without_pytorch_has_no_handler() {
        assert!(find_in_process().is_none());
    }
}
