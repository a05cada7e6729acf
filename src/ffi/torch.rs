//! PyTorch's entry points (issue 14): the functions `CUDAPluggableAllocator` and
//! its hooks call, over one process-wide [`TorchAllocator`] made on first use from
//! the environment ([`TorchConfig::from_env`]: `FLARE_TORCH_*`), and the functions
//! the Python package (`python/flare_package`) calls through ctypes: the
//! out-of-memory handler and the simulated backend's choice here; stats, trim,
//! retention and a stream's end in `torch_controls.rs`; the simulated backend's
//! controls in `torch_sim.rs`.
//!
//! ABI: PyTorch stores each function as a C++ `std::function` of the type its
//! `CUDAPluggableAllocator.h` declares and calls it with the Itanium C++ ABI, which
//! for these argument types is the C ABI: `size_t`, `int`, pointers and
//! `cudaStream_t` (a pointer) as such; `c10::cuda::MempoolId_t`
//! (`std::pair<unsigned long long, unsigned long long>`, trivially copyable) by value
//! as a struct of two `u64`, which on x86-64 System V (and AArch64) is passed in two
//! integer registers exactly like two `u64` arguments, so the hooks take `id0, id1`;
//! the `std::function<bool(cudaStream_t)>` filter of `beginAllocateToPool` has a
//! non-trivial destructor and is passed by invisible reference (a pointer), taken
//! here as an opaque pointer and never touched (we decide which allocations belong
//! to the pool ourselves: `src/torch/`).
//!
//! Hooks return nothing, so failures are recorded: the thread's last error
//! (`flare_last_error_message`) and a process-wide count
//! (`flare_torch_hook_failures`). No panic crosses into PyTorch: each body runs
//! under `catch_unwind`. The one exception on purpose is the out-of-memory handler
//! (`flare_torch_set_oom_handler`, else PyTorch's `torchCheckFail` found in the
//! process: `torch_oom.rs`), which throws a C++ exception through
//! `flare_torch_alloc` (declared `extern "C-unwind"` for that reason).

use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::boundary::{boundary, set_last_error};
use super::stream::stream_of;
use super::torch_oom::{self, OomFn};
use super::types::{FlareStatus, FlareStream};
use crate::driver::sim::SimConfig;
use crate::driver::DevicePtr;
use crate::pool::Backend;
use crate::torch::{TorchAllocator, TorchConfig};
use crate::Error;

/// The process's allocator: made on first use from the environment, or by
/// `flare_torch_use_simulated`. A configuration error is kept and returned by every
/// call.
static ALLOCATOR: OnceLock<Result<TorchAllocator, Error>> = OnceLock::new();

/// Failures of the hooks that return nothing (`flare_torch_free` and the others).
static HOOK_FAILURES: AtomicU64 = AtomicU64::new(0);

/// The process's allocator (made on first use), or its configuration error.
pub(super) fn allocator() -> Result<&'static TorchAllocator, Error> {
    ALLOCATOR
        .get_or_init(|| TorchConfig::from_env().map(TorchAllocator::new))
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs a hook's body: a failure (error or panic) is recorded and counted.
fn hook(name: &'static str, f: impl FnOnce() -> Result<(), Error>) {
    if boundary(name, f) != FlareStatus::FLARE_STATUS_SUCCESS {
        HOOK_FAILURES.fetch_add(1, Ordering::Relaxed);
    }
}

fn addr(ptr: *mut c_void) -> DevicePtr {
    ptr as usize as DevicePtr
}

/// A device address as a pointer (CUDA's addresses fit a pointer on its 64-bit
/// targets; a wider one is refused).
fn as_ptr(ptr: DevicePtr) -> Result<*mut c_void, Error> {
    usize::try_from(ptr)
        .map(|a| a as *mut c_void)
        .map_err(|_| Error::NotSupported("device address wider than a pointer"))
}

/// The function `flare_torch_alloc` calls instead of returning NULL when an
/// allocation fails: it must not return (it throws a C++ exception that PyTorch turns
/// into a Python exception). Its arguments, in the order of
/// `c10::detail::torchCheckFail(const char *func, const char *file, uint32_t line,
/// const char *msg)`: this function's name, its source file and line, and the
/// message (NUL-terminated UTF-8, valid during the call only).
pub type FlareTorchOomHandler = Option<
    unsafe extern "C-unwind" fn(
        func: *const c_char,
        file: *const c_char,
        line: u32,
        msg: *const c_char,
    ),
>;

/// Sets the function `flare_torch_alloc` calls when an allocation fails, instead of
/// returning NULL (which PyTorch's per-tensor path wraps in a tensor at address 0
/// without checking, pytorch #133280). The Python package's `install()` passes
/// PyTorch's own `c10::detail::torchCheckFail` (looked up in `libc10.so`), which
/// throws `c10::Error`: Python sees a `RuntimeError` with our message (the request,
/// the device, the pool's live and idle bytes), and PyTorch's allocator state is
/// untouched (it records an allocation only after our function returns).
///
/// The order on failure (issue 34): this handler; else, unless the environment has
/// `FLARE_TORCH_OOM=null`, that same `torchCheckFail` found in the process by the
/// library itself (looked up once, at the first failure with no handler set: the
/// global scope, then `libc10.so` if loaded), so that the pair loaded without the
/// Python package raises too; else NULL is returned. NULL here sets no handler
/// (back to that order's second step). Process-wide; thread-safe.
///
/// # Safety
/// `handler` is NULL or a function of that type that never returns normally, or
/// returns (then NULL is returned); it may unwind (a C++ exception) through
/// `flare_torch_alloc` into its caller, which must be C++ code prepared for it.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_set_oom_handler(handler: FlareTorchOomHandler) {
    // No pointer to read: the caller's promise about `handler` is what makes the
    // call in `flare_torch_alloc` sound.
    flare_torch_set_oom_handler_inner(handler);
}

/// `flare_torch_set_oom_handler`: stores the handler (`None`: none).
fn flare_torch_set_oom_handler_inner(handler: FlareTorchOomHandler) {
    torch_oom::set_explicit(handler);
}

/// Runs an allocation entry point's body (`call` names it): the address, or the
/// failure's message (the request in bytes, the device, the error; a caught panic
/// named as one). Both allocation functions share it; what they do with a failure
/// differs.
fn try_alloc(
    call: &str,
    size: usize,
    device: c_int,
    f: impl FnOnce(&TorchAllocator) -> Result<DevicePtr, Error>,
) -> Result<*mut c_void, String> {
    match catch_unwind(AssertUnwindSafe(|| as_ptr(f(allocator()?)?))) {
        Ok(Ok(ptr)) => Ok(ptr),
        Ok(Err(e)) => Err(format!(
            "{call}: request of {size} bytes on device {device} failed: {e}"
        )),
        Err(_) => Err(format!(
            "{call}: internal error (a panic was caught) for a request of {size} bytes \
             on device {device}"
        )),
    }
}

/// Per-tensor mode's allocation, PyTorch's `alloc_fn`
/// (`void *(size_t size, int device, cudaStream_t stream)`): `size` bytes on
/// `device` for use on `stream`, from the device's tensor pool (segments by
/// default: 512-byte-rounded blocks of shared handles), or from the graph pool being
/// captured into (see `flare_torch_begin_allocate_to_pool`). Stream-ordered: memory
/// freed on `stream` is reused at once; memory freed on another stream once that
/// stream's work up to the free completed.
///
/// A request of 0 bytes (PyTorch asks for them: an empty tensor's storage) returns
/// NULL with no error and no handler call, as PyTorch's own caching allocator does;
/// PyTorch later frees that NULL, which `flare_torch_free` ignores (seen on the
/// H200: a model's first forward asked for 0 bytes).
///
/// Returns the device address, or on failure (out of memory after releasing what
/// may be released, request larger than the device, no driver, a bad environment
/// variable): calls the out-of-memory handler if there is one (it throws): the one
/// set with `flare_torch_set_oom_handler`, else PyTorch's `torchCheckFail` found in
/// the process unless `FLARE_TORCH_OOM=null` (issue 34; see
/// `flare_torch_set_oom_handler`); else returns NULL. Either way the thread's last
/// error holds the message: the request in bytes, the device, the error (with the
/// driver call and code), and the tensor pool's live and idle bytes. Thread-safe.
///
/// # Safety
/// `stream` is NULL or a live stream of `device` (only passed to the driver). Any
/// out-of-memory handler set must be safe to call here (see
/// `flare_torch_set_oom_handler`); with none set, a caller in a process holding
/// PyTorch's `torchCheckFail` must be prepared for the C++ exception it throws
/// (PyTorch is), or set `FLARE_TORCH_OOM=null`.
#[no_mangle]
pub unsafe extern "C-unwind" fn flare_torch_alloc(
    size: usize,
    device: c_int,
    stream: FlareStream,
) -> *mut c_void {
    let (handler, msg) = match flare_torch_alloc_inner(size, device, stream) {
        Ok(ptr) => return ptr,
        Err(None) => return ptr::null_mut(),
        Err(Some(oom)) => oom,
    };
    // SAFETY: `handler` is the function given to `flare_torch_set_oom_handler`, whose
    // caller vouched that it may be called here and may unwind through this
    // `C-unwind` frame, or PyTorch's `torchCheckFail` found in the process
    // (`torch_oom.rs` says why its type is right), whose exception our caller, PyTorch,
    // catches (this function's contract). The strings are NUL-terminated and live
    // for the call. No lock is held and nothing but `msg` (dropped by the unwind,
    // after the handler copied it) is live in this frame.
    unsafe {
        handler(
            c"flare_torch_alloc".as_ptr(),
            c"src/ffi/torch.rs".as_ptr(),
            line!(),
            msg.as_ptr(),
        );
    }
    ptr::null_mut()
}

/// `flare_torch_alloc` up to the out-of-memory handler: the address (NULL for 0
/// bytes); on failure, with the message recorded as the thread's last error, the
/// handler (`torch_oom::handler`) and the message to call it with, or `None` when
/// there is none.
fn flare_torch_alloc_inner(
    size: usize,
    device: c_int,
    stream: FlareStream,
) -> Result<*mut c_void, Option<(OomFn, CString)>> {
    if size == 0 {
        return Ok(ptr::null_mut());
    }
    let failure = match try_alloc("flare_torch_alloc", size, device, |a| {
        a.alloc(size as u64, device, stream_of(stream))
    }) {
        Ok(ptr) => return Ok(ptr),
        Err(failure) => failure,
    };
    // Then the pool's figures.
    let (live, idle) = allocator().map_or((0, 0), |a| a.live_idle_bytes(device));
    let message =
        format!("{failure} (flare-package tensor pool: {live} bytes live, {idle} bytes idle)");
    set_last_error(message.clone());
    let Some(handler) = torch_oom::handler() else {
        return Err(None);
    };
    let msg = CString::new(message.replace('\0', " ")).unwrap_or_default();
    Err(Some((handler, msg)))
}

/// Per-tensor mode's free, PyTorch's `free_fn`
/// (`void (void *ptr, size_t size, int device, cudaStream_t stream)`, with the
/// allocation's device and stream): stream-ordered on `stream`, with no host
/// synchronization: work still queued on `stream` may use the memory; it is reused by
/// `stream` at once, by another stream or released only once `stream`'s work up to
/// here has completed (and that of the streams given to
/// `flare_torch_record_stream`). A graph pool's allocation goes back to its graph
/// pool. `size` is not needed (the pool knows it). NULL: nothing. A failure (an
/// unknown pointer) is recorded (`flare_torch_hook_failures`). Thread-safe.
///
/// # Safety
/// `ptr` is only compared, `stream` only passed to the driver.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: FlareStream,
) {
    // No pointer is read: `ptr` is only compared, `stream` only passed to the driver.
    flare_torch_free_inner(ptr, size, device, stream);
}

/// `flare_torch_free`.
fn flare_torch_free_inner(ptr: *mut c_void, size: usize, device: c_int, stream: FlareStream) {
    let _ = size;
    if ptr.is_null() {
        return;
    }
    hook("flare_torch_free", || {
        allocator()?.free(addr(ptr), device, stream_of(stream))
    });
}

/// Pool mode's allocation (`torch.cuda.MemPool(...)`): the same signature as
/// `flare_torch_alloc`; PyTorch's caching allocator asks for its segments (2 MiB
/// multiples), each served by a whole mapping of exactly the rounded size from the
/// device's mempool pool. Returns NULL on failure (the message in the thread's last
/// error): PyTorch's caching allocator turns NULL into its own out-of-memory path
/// (`torch.OutOfMemoryError`). Thread-safe.
///
/// # Safety
/// As `flare_torch_alloc` (no handler is called).
#[no_mangle]
pub unsafe extern "C" fn flare_torch_pool_alloc(
    size: usize,
    device: c_int,
    stream: FlareStream,
) -> *mut c_void {
    // No pointer is read: `stream` is only passed to the driver.
    flare_torch_pool_alloc_inner(size, device, stream)
}

/// `flare_torch_pool_alloc`.
fn flare_torch_pool_alloc_inner(size: usize, device: c_int, stream: FlareStream) -> *mut c_void {
    try_alloc("flare_torch_pool_alloc", size, device, |a| {
        a.pool_alloc(size as u64, device, stream_of(stream))
    })
    .unwrap_or_else(|message| {
        set_last_error(message);
        ptr::null_mut()
    })
}

/// Pool mode's free: PyTorch frees a segment once its blocks' events completed; the
/// mapping is freed on `stream` and released now when `stream` is not being captured
/// (its fence waited for, no device synchronize), so that the mempool pool's physical
/// bytes are the segments PyTorch holds (`memory_reserved` of the pool). Failures
/// are recorded (`flare_torch_hook_failures`). Thread-safe.
///
/// # Safety
/// As `flare_torch_free`.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_pool_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: FlareStream,
) {
    // No pointer is read: `ptr` is only compared, `stream` only passed to the driver.
    flare_torch_pool_free_inner(ptr, size, device, stream);
}

/// `flare_torch_pool_free`.
fn flare_torch_pool_free_inner(ptr: *mut c_void, size: usize, device: c_int, stream: FlareStream) {
    let _ = size;
    if ptr.is_null() {
        return;
    }
    hook("flare_torch_pool_free", || {
        allocator()?.pool_free(addr(ptr), device, stream_of(stream))
    });
}

/// PyTorch's `record_stream_fn` (`void (void *ptr, cudaStream_t stream)`,
/// `Tensor.record_stream`): the allocation at `ptr` is used on `stream` too; its free
/// then waits for `stream`'s work up to the free before the memory is reused (on any
/// stream) or released. NULL: nothing. Failures are recorded. Thread-safe.
///
/// # Safety
/// As `flare_torch_free`.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_record_stream(ptr: *mut c_void, stream: FlareStream) {
    // No pointer is read: `ptr` is only compared, `stream` only passed to the driver.
    flare_torch_record_stream_inner(ptr, stream);
}

/// `flare_torch_record_stream`.
fn flare_torch_record_stream_inner(ptr: *mut c_void, stream: FlareStream) {
    if ptr.is_null() {
        return;
    }
    hook("flare_torch_record_stream", || {
        allocator()?.record_stream(addr(ptr), stream_of(stream))
    });
}

/// PyTorch's `reset_fn` (`void ()`, called by `torch.cuda.empty_cache()`): releases
/// what the tensor and mempool pools of every device hold idle (memory freed on
/// streams once its fences completed, `cuEventSynchronize`), and destroys the graph
/// pools PyTorch released whose allocations are all freed. Graph pools PyTorch still
/// holds keep everything (their graphs replay into it). A device with a capture
/// begun is skipped; a tensor pool with a retention scope open keeps what it
/// retains, and that is no failure (`torch.cuda.graph` calls `empty_cache` before
/// each capture). Failures are recorded. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_reset() {
    hook("flare_torch_reset", || allocator()?.reset());
}

/// Writes what every pool recorded so far (`FLARE_TORCH_RECORD`) to its file and
/// waits for the writes; the Python package calls it at exit (the process-wide
/// allocator is never destroyed, and its writer threads write on their own only
/// every 200 ms). Does nothing when not recording or before first use.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_record_flush() {
    hook("flare_torch_record_flush", || {
        allocator()?.record_flush();
        Ok(())
    });
}

/// PyTorch's `begin_allocate_to_pool` hook (`void (int device, MempoolId_t id,
/// std::function<bool(cudaStream_t)> filter)`, called by `torch.cuda.graph` before
/// `cudaStreamBeginCapture`): allocations on a stream being captured, from now until
/// `flare_torch_end_allocate_to_pool`, go to graph pool `(id0, id1)` of `device`
/// (created on first use: a pool of its own, sharing nothing with the others). Memory
/// it hands out, freed during the capture or later, is reused only by its own
/// allocations and released only once `flare_torch_release_pool` dropped its last
/// reference and nothing of it is live. `filter` (PyTorch's `std::function`, by
/// reference) is not used. Failures are recorded. Thread-safe.
///
/// # Safety
/// `filter` is never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_begin_allocate_to_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    filter: *const c_void,
) {
    // No pointer is read: `filter` is never dereferenced.
    let _ = filter;
    flare_torch_begin_allocate_to_pool_inner(device, id0, id1);
}

/// `flare_torch_begin_allocate_to_pool` (its filter unused).
fn flare_torch_begin_allocate_to_pool_inner(device: c_int, id0: u64, id1: u64) {
    hook("flare_torch_begin_allocate_to_pool", || {
        allocator()?.begin_allocate_to_pool(device, (id0, id1))
    });
}

/// PyTorch's `end_allocate_to_pool` hook (`void (int device, MempoolId_t id)`, after
/// `cudaStreamEndCapture`): graph pool `(id0, id1)` takes no new allocations.
/// Failures are recorded. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_end_allocate_to_pool(device: c_int, id0: u64, id1: u64) {
    hook("flare_torch_end_allocate_to_pool", || {
        allocator()?.end_allocate_to_pool(device, (id0, id1))
    });
}

/// PyTorch's `release_pool` hook (`void (int device, MempoolId_t id)`, when a graph
/// using the pool is reset or destroyed): drops one reference; with none left and
/// nothing of it live, the pool is destroyed (a device synchronize, then everything
/// it holds released), or later, with its last allocation's free (or once no capture
/// is begun on the device). Failures are recorded. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_release_pool(device: c_int, id0: u64, id1: u64) {
    hook("flare_torch_release_pool", || {
        allocator()?.release_pool(device, (id0, id1))
    });
}

/// How many hook calls (`flare_torch_free`, `flare_torch_pool_free`,
/// `flare_torch_record_stream`, `flare_torch_reset` and the graph-pool hooks) have
/// failed in this process; each failure's message was the calling thread's last
/// error. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_hook_failures() -> u64 {
    HOOK_FAILURES.load(Ordering::Relaxed)
}

/// Makes the process's allocator use the simulated driver (`device_count` devices of
/// `capacity_bytes` each; 0: 2 devices, 140 GiB) instead of reading
/// `FLARE_TORCH_BACKEND`; the other `FLARE_TORCH_*` variables still apply. For tests
/// without a GPU. Must come before any other `flare_torch_*` call.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` when the allocator was already made (by an earlier call), or a `FLARE_TORCH_*` variable is
/// invalid. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_use_simulated(capacity_bytes: u64, device_count: u32) -> FlareStatus {
    boundary("flare_torch_use_simulated", || {
        let mut config = TorchConfig::from_env()?;
        let defaults = SimConfig::default();
        let sim = SimConfig {
            capacity_bytes: if capacity_bytes == 0 {
                defaults.capacity_bytes
            } else {
                capacity_bytes
            },
            device_count: if device_count == 0 { 2 } else { device_count },
            ..defaults
        };
        crate::backend::validate_sim_machine(&sim)?;
        config.backend = Backend::Simulated(sim);
        ALLOCATOR.set(Ok(TorchAllocator::new(config))).map_err(|_| {
            Error::InvalidArgument(
                "the PyTorch allocator is already made (by an earlier flare_torch_use_simulated, \
                 or by another flare_torch_* call that came first): use_simulated must be the \
                 first call, once"
                    .into(),
            )
        })
    })
}
