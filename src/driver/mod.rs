//! The driver boundary: one trait method per CUDA virtual-memory-management call the
//! pool needs, and the two backends that implement it.
//!
//! - [`CudaDriver`](cuda::CudaDriver): the real CUDA driver API through cudarc's raw,
//!   dynamically loaded functions.
//! - [`SimDriver`](sim::SimDriver): a deterministic software model of the same calls
//!   that reproduces every measured row of `docs/vmm-semantics.md` (error codes
//!   included), with capacity, fault injection and in-flight work.
//!
//! The whole-handle rule (the driver refuses to map part of a physical handle with
//! `CUDA_ERROR_NOT_SUPPORTED`, measured on an H200) is in the type: [`Driver::map`]
//! takes a [`PhysicalHandle`], which carries its own size, and no offset, so the pool
//! cannot even ask for a sub-range.

mod choice;
pub mod cuda;
pub mod sim;

pub use choice::Backend;

use std::fmt;

/// A device virtual address (`CUdeviceptr`), in bytes from address zero.
pub type DevicePtr = u64;

/// A raw `CUresult` value, kept exactly as the driver (or the simulated driver)
/// returned it. Named without calling the driver ([`CuResult::name`]), because
/// cudarc's own formatting calls `cuGetErrorString`, which panics when libcuda is
/// absent.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CuResult(pub u32);

impl CuResult {
    /// `CUDA_SUCCESS` (0).
    pub const SUCCESS: CuResult = CuResult(0);
    /// `CUDA_ERROR_INVALID_VALUE` (1).
    pub const INVALID_VALUE: CuResult = CuResult(1);
    /// `CUDA_ERROR_OUT_OF_MEMORY` (2).
    pub const OUT_OF_MEMORY: CuResult = CuResult(2);
    /// `CUDA_ERROR_NOT_INITIALIZED` (3).
    pub const NOT_INITIALIZED: CuResult = CuResult(3);
    /// `CUDA_ERROR_DEINITIALIZED` (4).
    pub const DEINITIALIZED: CuResult = CuResult(4);
    /// `CUDA_ERROR_NO_DEVICE` (100).
    pub const NO_DEVICE: CuResult = CuResult(100);
    /// `CUDA_ERROR_INVALID_DEVICE` (101).
    pub const INVALID_DEVICE: CuResult = CuResult(101);
    /// `CUDA_ERROR_INVALID_CONTEXT` (201).
    pub const INVALID_CONTEXT: CuResult = CuResult(201);
    /// `CUDA_ERROR_INVALID_HANDLE` (400): a stream or event handle that is not live.
    pub const INVALID_HANDLE: CuResult = CuResult(400);
    /// `CUDA_ERROR_NOT_FOUND` (500): a named symbol (a driver function, a kernel) is
    /// missing.
    pub const NOT_FOUND: CuResult = CuResult(500);
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` (700): sticky, the context is lost.
    pub const ILLEGAL_ADDRESS: CuResult = CuResult(700);
    /// `CUDA_ERROR_LAUNCH_FAILED` (719).
    pub const LAUNCH_FAILED: CuResult = CuResult(719);
    /// `CUDA_ERROR_ILLEGAL_INSTRUCTION` (715): how TMA kernels on Hopper report a
    /// fault on unmapped memory.
    pub const ILLEGAL_INSTRUCTION: CuResult = CuResult(715);
    /// `CUDA_ERROR_NOT_PERMITTED` (800).
    pub const NOT_PERMITTED: CuResult = CuResult(800);
    /// `CUDA_ERROR_NOT_SUPPORTED` (801): what a map of part of a handle returns.
    pub const NOT_SUPPORTED: CuResult = CuResult(801);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (900): a synchronize during a capture.
    pub const STREAM_CAPTURE_UNSUPPORTED: CuResult = CuResult(900);
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (901).
    pub const STREAM_CAPTURE_INVALIDATED: CuResult = CuResult(901);
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (906): the legacy stream used (or its
    /// capture queried) while a blocking stream of its context is being captured.
    pub const STREAM_CAPTURE_IMPLICIT: CuResult = CuResult(906);
    /// `CUDA_ERROR_UNKNOWN` (999).
    pub const UNKNOWN: CuResult = CuResult(999);

    /// The `CUresult` enumerator name (`"CUDA_ERROR_OUT_OF_MEMORY"`), or
    /// `"CUDA_ERROR_<n>"` for a value this table does not know. Never calls the driver.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "CUDA_SUCCESS",
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            4 => "CUDA_ERROR_DEINITIALIZED",
            34 => "CUDA_ERROR_STUB_LIBRARY",
            46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
            100 => "CUDA_ERROR_NO_DEVICE",
            101 => "CUDA_ERROR_INVALID_DEVICE",
            201 => "CUDA_ERROR_INVALID_CONTEXT",
            400 => "CUDA_ERROR_INVALID_HANDLE",
            401 => "CUDA_ERROR_ILLEGAL_STATE",
            500 => "CUDA_ERROR_NOT_FOUND",
            600 => "CUDA_ERROR_NOT_READY",
            700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
            715 => "CUDA_ERROR_ILLEGAL_INSTRUCTION",
            719 => "CUDA_ERROR_LAUNCH_FAILED",
            800 => "CUDA_ERROR_NOT_PERMITTED",
            801 => "CUDA_ERROR_NOT_SUPPORTED",
            900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            901 => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            902 => "CUDA_ERROR_STREAM_CAPTURE_MERGE",
            903 => "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
            904 => "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            906 => "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
            908 => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
            999 => "CUDA_ERROR_UNKNOWN",
            _ => "CUDA_ERROR_(unnamed)",
        }
    }

    /// Whether this is `CUDA_SUCCESS`.
    pub fn is_success(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.0)
    }
}

impl fmt::Display for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// The driver calls, one row each: `/// doc`, the Rust variant and its number, the C
/// ABI's name (`FlareDriverCall`, same number), the CUDA function; then, in
/// `@not_in_c`, the calls the C ABI does not name (no C name).
///
/// Written once: [`DriverCall`] with [`DriverCall::ALL`],
/// [`DriverCall::MEMORY_CALLS`] and [`DriverCall::cuda_name`] (here) and the C ABI's
/// `FlareDriverCall` with its integer conversion and name table
/// (`ffi/types/driver_call.rs`) are generated from it.
/// `driver_calls!(generator! { head })` expands to `generator! { head rows }`.
macro_rules! driver_calls {
    ($gen:ident! { $($head:tt)* }) => {
        $gen! {
            $($head)*
            /// `cuMemCreate`: a physical allocation (allocate, on a miss).
            Create = 0, FLARE_CALL_CREATE, "cuMemCreate";
            /// `cuMemRelease`: drop a physical allocation (release points).
            Release = 1, FLARE_CALL_RELEASE, "cuMemRelease";
            /// `cuMemAddressReserve`: reserve virtual addresses (allocate, on a miss).
            Reserve = 2, FLARE_CALL_RESERVE, "cuMemAddressReserve";
            /// `cuMemAddressFree`: free the virtual addresses (release points).
            FreeReservation = 3, FLARE_CALL_FREE_RESERVATION, "cuMemAddressFree";
            /// `cuMemMap`: map the physical allocation (allocate, on a miss).
            Map = 4, FLARE_CALL_MAP, "cuMemMap";
            /// `cuMemSetAccess`: grant read/write access (allocate, on a miss).
            SetAccess = 5, FLARE_CALL_SET_ACCESS, "cuMemSetAccess";
            /// `cuMemUnmap`: unmap (release points).
            Unmap = 6, FLARE_CALL_UNMAP, "cuMemUnmap";
            /// `cuCtxSynchronize`: wait for queued work before a release (release points).
            Synchronize = 7, FLARE_CALL_SYNCHRONIZE, "cuCtxSynchronize";
            @not_in_c {
                /// `cuMemGetAllocationGranularity`.
                Granularity = 8, "cuMemGetAllocationGranularity";
                /// `cuMemGetInfo`.
                MemGetInfo = 9, "cuMemGetInfo";
                /// Driver load, `cuInit`, device and primary-context set-up.
                Init = 10, "cuInit";
                /// `cuEventCreate` (timing disabled): a fence event for stream order.
                EventCreate = 11, "cuEventCreate";
                /// `cuEventDestroy`.
                EventDestroy = 12, "cuEventDestroy";
                /// `cuEventRecord`: a fence after frees on a stream.
                EventRecord = 13, "cuEventRecord";
                /// `cuEventQuery`: polling a fence (the calling thread in relaxed
                /// capture mode).
                EventQuery = 14, "cuEventQuery";
                /// `cuEventSynchronize`: waiting on a fence when memory must be
                /// released now (the calling thread in relaxed capture mode).
                EventSynchronize = 15, "cuEventSynchronize";
                /// `cuStreamWaitEvent`: a cross-stream reuse that orders the new
                /// stream after the old one.
                StreamWaitEvent = 16, "cuStreamWaitEvent";
                /// `cuStreamGetCaptureInfo`: whether a stream is being captured.
                StreamGetCaptureInfo = 17, "cuStreamGetCaptureInfo";
                /// `cuThreadExchangeStreamCaptureMode`.
                ThreadExchangeCaptureMode = 18, "cuThreadExchangeStreamCaptureMode";
                /// `cuStreamCreate`: the pool's own blocking stream for fences after
                /// frees on the legacy stream.
                StreamCreate = 19, "cuStreamCreate";
                /// `cuStreamDestroy`.
                StreamDestroy = 20, "cuStreamDestroy";
                /// `cuMemHostAlloc`: pinned host memory for a tag's contents while it
                /// sleeps in offload mode (issue 15).
                HostAlloc = 21, "cuMemHostAlloc";
                /// `cuMemFreeHost`: gives that host memory back (at wake).
                HostFree = 22, "cuMemFreeHost";
                /// `cuMemcpyDtoH`: a sleeping allocation's bytes to host memory.
                MemcpyDtoH = 23, "cuMemcpyDtoH";
                /// `cuMemcpyHtoD`: those bytes back at wake.
                MemcpyHtoD = 24, "cuMemcpyHtoD";
                /// `cuMemsetD8Async`: a zeroing wake's stream-ordered memset of what a
                /// discard sleep dropped (issue 34).
                MemsetD8Async = 25, "cuMemsetD8Async";
            }
        }
    };
}
pub(crate) use driver_calls;

/// [`DriverCall`] with [`DriverCall::ALL`], [`DriverCall::MEMORY_CALLS`] and
/// [`DriverCall::cuda_name`] from the rows of [`driver_calls`].
macro_rules! rust_driver_call {
    (
        $(#[doc = $doc:literal])*
        pub enum DriverCall;
        $( $(#[doc = $vdoc:literal])* $v:ident = $n:literal, $c:ident, $s:literal; )*
        @not_in_c { $( $(#[doc = $odoc:literal])* $ov:ident = $on:literal, $os:literal; )* }
    ) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum DriverCall {
            $( $(#[doc = $vdoc])* $v = $n, )*
            $( $(#[doc = $odoc])* $ov = $on, )*
        }

        impl DriverCall {
            /// Every call kind, in number order.
            pub const ALL: [DriverCall; [$($n,)* $($on),*].len()] =
                [$(DriverCall::$v,)* $(DriverCall::$ov),*];

            /// The calls that create, map, grant, unmap, release or free memory and
            /// synchronize: those the pool counts failures of in its snapshot, and
            /// those the C ABI's `FlareDriverCall` names (same numbers, from 0).
            pub const MEMORY_CALLS: [DriverCall; [$($n),*].len()] = [$(DriverCall::$v),*];

            /// The CUDA driver function this call stands for (`"cuMemMap"`).
            pub fn cuda_name(self) -> &'static str {
                match self {
                    $( DriverCall::$v => $s, )*
                    $( DriverCall::$ov => $os, )*
                }
            }
        }

        // `ALL` is in number order: `from_index` takes a number as an index in it.
        const _: () = assert!($crate::lists::numbered_from_zero(&[$($n,)* $($on),*]));
    };
}

driver_calls!(rust_driver_call! {
    /// The driver calls the pool makes, one per [`Driver`] method. The numbers are
    /// stable; the first eight are the C ABI's `FlareDriverCall` values.
    pub enum DriverCall;
});

impl DriverCall {
    /// The call with this number (the C ABI's `FlareDriverCall`), if any.
    pub fn from_index(n: u32) -> Option<DriverCall> {
        DriverCall::ALL.get(n as usize).copied()
    }
}

impl fmt::Display for DriverCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.cuda_name())
    }
}

/// A failed driver call: which call, and the raw `CUresult` it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed with {code}")]
pub struct DriverError {
    /// The call that failed.
    pub call: DriverCall,
    /// The raw `CUresult` it returned.
    pub code: CuResult,
}

impl DriverError {
    /// A failure of `call` with `code`.
    pub fn new(call: DriverCall, code: CuResult) -> Self {
        DriverError { call, code }
    }

    /// Whether the driver said it is out of memory (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn is_out_of_memory(&self) -> bool {
        self.code == CuResult::OUT_OF_MEMORY
    }
}

/// Turns a raw `CUresult` into `Ok(())` or the typed error for `call`.
pub fn check(call: DriverCall, code: CuResult) -> Result<(), DriverError> {
    if code.is_success() {
        Ok(())
    } else {
        Err(DriverError::new(call, code))
    }
}

/// A CUDA stream (`CUstream`) as its raw handle value. [`Stream::LEGACY`] (0, and
/// CUDA's `CU_STREAM_LEGACY`, 1) is the legacy default stream of the current context;
/// `CU_STREAM_PER_THREAD` (2) and created streams are passed through unchanged. The
/// pool never dereferences it: it is handed to the driver's stream and event calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stream(pub u64);

impl Stream {
    /// The legacy default stream (`NULL` in the C ABI).
    pub const LEGACY: Stream = Stream(0);

    /// A stream from a raw `CUstream` / `cudaStream_t` value.
    pub fn from_raw(raw: usize) -> Stream {
        Stream(raw as u64)
    }

    /// The raw handle value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// Whether this names the legacy default stream (0 or `CU_STREAM_LEGACY`, 1).
    pub fn is_legacy(self) -> bool {
        self.0 <= 1
    }
}

/// A CUDA event (`CUevent`) as its raw handle value.
pub type Event = u64;

/// A physical allocation (`CUmemGenericAllocationHandle`) and its size in bytes
/// (a multiple of the granularity). The size travels with the handle so that
/// [`Driver::map`] always maps the whole handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysicalHandle {
    /// The driver's raw handle value.
    pub raw: u64,
    /// Size of the physical allocation, bytes.
    pub size: u64,
}

/// A virtual reservation (`cuMemAddressReserve`): start address and size, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// First address of the range.
    pub ptr: DevicePtr,
    /// Size of the range, bytes (a multiple of the granularity).
    pub size: u64,
}

/// Pinned (page-locked) host memory from [`Driver::host_alloc`] (`cuMemHostAlloc`):
/// its address as a raw value and its size, bytes. The pool never dereferences it:
/// only the driver's copy calls read or write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostBuffer {
    /// The host address (`void *`) as an integer; the simulated driver's own key.
    pub raw: u64,
    /// Size, bytes.
    pub size: u64,
}

/// Device memory figures from `cuMemGetInfo`, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the driver reports free on the device.
    pub free: u64,
    /// Total bytes of the device.
    pub total: u64,
}

/// A thread's or a capture's interaction mode with potentially unsafe calls
/// (`CUstreamCaptureMode`; the discriminants are CUDA's values).
///
/// The rule the simulated driver applies (CUDA's documentation of
/// `cuThreadExchangeStreamCaptureMode`, and what the H200 did, section "Events and
/// stream queries while another stream is captured" of `docs/vmm-semantics.md`): a
/// thread in [`CaptureMode::Global`] may not make a potentially unsafe call (event
/// query and synchronize, stream query and synchronize) while it has a capture of its
/// own not begun in relaxed mode, or any other thread has a capture begun in global
/// mode; a thread in [`CaptureMode::ThreadLocal`] only while it has one of its own not
/// begun in relaxed mode; a thread in [`CaptureMode::Relaxed`] never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL` (0): every thread's default mode, and PyTorch's
    /// for `torch.cuda.graph`.
    #[default]
    Global = 0,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` (1).
    ThreadLocal = 1,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED` (2).
    Relaxed = 2,
}

/// Capture status of a stream (`CUstreamCaptureStatus`; CUDA's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// `CU_STREAM_CAPTURE_STATUS_NONE` (0): not being captured.
    None = 0,
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE` (1): being captured, still valid.
    Active = 1,
    /// `CU_STREAM_CAPTURE_STATUS_INVALIDATED` (2): being captured, but something broke
    /// the capture; its `cuStreamEndCapture` returns
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    Invalidated = 2,
}

/// The CUDA virtual-memory calls the pool needs, one method each. Every method is
/// one driver call (or one simulated call) and a failure changes nothing on the
/// driver side except where the CUDA driver itself documents otherwise.
///
/// Implementations must be `Send + Sync`: the pool calls them from any thread,
/// outside its lock; and `'static` (`Any`), so that a pool can hand its driver back
/// as its concrete type ([`Pool::sim_driver`](crate::Pool::sim_driver)).
pub trait Driver: std::any::Any + Send + Sync {
    /// Allocation granularity for device memory on the pool's device, bytes
    /// (`cuMemGetAllocationGranularity`, RECOMMENDED, with the same allocation
    /// property that [`Driver::create`] uses). 2 MiB on an H200.
    fn granularity(&self) -> Result<u64, DriverError>;

    /// Creates a physical handle of `size` bytes on the pool's device (`cuMemCreate`).
    /// `size` must be a non-zero multiple of the granularity, else
    /// `CUDA_ERROR_INVALID_VALUE`; `CUDA_ERROR_OUT_OF_MEMORY` when the device is full.
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError>;

    /// Releases a physical handle (`cuMemRelease`). A handle still mapped is freed at
    /// its last unmap (documented by NVIDIA). Releasing twice is
    /// `CUDA_ERROR_INVALID_VALUE`.
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError>;

    /// Reserves `size` bytes of virtual addresses aligned to the granularity
    /// (`cuMemAddressReserve`).
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError>;

    /// Frees a whole reservation (`cuMemAddressFree`). `CUDA_ERROR_INVALID_VALUE` while
    /// any mapping inside it is live, for part of a reservation, or twice.
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError>;

    /// Maps the whole of `handle` at `ptr` (`cuMemMap`, offset 0, size = handle size).
    /// `ptr` must lie in a reservation, be granularity-aligned and not overlap a live
    /// mapping, else `CUDA_ERROR_INVALID_VALUE`.
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError>;

    /// Grants read/write access to `[ptr, ptr + size)` for each device ordinal in
    /// `devices` (`cuMemSetAccess`, one descriptor per device). The range must be
    /// exactly mapped; a device that does not exist is `CUDA_ERROR_INVALID_VALUE`.
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError>;

    /// Unmaps `[ptr, ptr + size)` (`cuMemUnmap`). Does not wait for work in flight
    /// (measured: it returns in 0.2 ms while a kernel still reads the range, and the
    /// kernel then faults): callers synchronize first.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError>;

    /// Waits for all work on device `device` (`cuCtxSynchronize` with that device's
    /// primary context current). The pool calls it for every device with access to
    /// the memory it is about to unmap: a peer's kernel may be reading it, and a
    /// synchronize waits only for its own context's work. Fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while any stream is being captured,
    /// and `CUDA_ERROR_INVALID_DEVICE` for a device the driver was not set up for.
    fn synchronize(&self, device: i32) -> Result<(), DriverError>;

    /// Free and total device memory, bytes (`cuMemGetInfo`).
    fn mem_info(&self) -> Result<MemInfo, DriverError>;

    // ---- stream order (issue 11). A backend without streams keeps the defaults:
    // every call fails with `CUDA_ERROR_NOT_SUPPORTED`, and only the pool's stream
    // functions (`allocate_async`, `free_async`, `record_stream`) call them.

    /// Creates an event with timing disabled (`cuEventCreate`,
    /// `CU_EVENT_DISABLE_TIMING`) in the pool's device's context.
    fn event_create(&self) -> Result<Event, DriverError> {
        Err(not_supported(DriverCall::EventCreate))
    }

    /// Destroys an event (`cuEventDestroy`).
    fn event_destroy(&self, event: Event) -> Result<(), DriverError> {
        let _ = event;
        Err(not_supported(DriverCall::EventDestroy))
    }

    /// Records `event` on `stream` (`cuEventRecord`): it completes when the work
    /// queued on `stream` so far has. Legal during any capture (on a stream being
    /// captured it is a graph node instead: the pool never records a fence there).
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), DriverError> {
        let _ = (event, stream);
        Err(not_supported(DriverCall::EventRecord))
    }

    /// Whether the work `event` covers has completed (`cuEventQuery`:
    /// `CUDA_SUCCESS` is `Ok(true)`, `CUDA_ERROR_NOT_READY` is `Ok(false)`). The pool
    /// calls it with the calling thread in relaxed capture mode
    /// ([`Driver::exchange_capture_mode`]): in global mode it would invalidate a
    /// capture open on any stream (measured on an H200, `docs/vmm-semantics.md`).
    fn event_query(&self, event: Event) -> Result<bool, DriverError> {
        let _ = event;
        Err(not_supported(DriverCall::EventQuery))
    }

    /// Waits for the work `event` covers (`cuEventSynchronize`); called in relaxed
    /// capture mode, like [`Driver::event_query`].
    fn event_synchronize(&self, event: Event) -> Result<(), DriverError> {
        let _ = event;
        Err(not_supported(DriverCall::EventSynchronize))
    }

    /// Orders later work on `stream` after the work `event` covers
    /// (`cuStreamWaitEvent`, flags 0). Legal during any capture.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), DriverError> {
        let _ = (stream, event);
        Err(not_supported(DriverCall::StreamWaitEvent))
    }

    /// The id of the capture `stream` belongs to (`cuStreamGetCaptureInfo`):
    /// `Some(id)` while it is being captured (active or invalidated), `None` when
    /// not. Legal during any capture, from any thread.
    fn stream_capture(&self, stream: Stream) -> Result<Option<u64>, DriverError> {
        let _ = stream;
        Err(not_supported(DriverCall::StreamGetCaptureInfo))
    }

    /// Sets the calling thread's capture interaction mode; returns the previous one
    /// (`cuThreadExchangeStreamCaptureMode`).
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        let _ = mode;
        Err(not_supported(DriverCall::ThreadExchangeCaptureMode))
    }

    /// Creates a blocking stream (`cuStreamCreate`, `CU_STREAM_DEFAULT`) in the pool's
    /// device's context: work on it is ordered after earlier work on the legacy
    /// stream, so an event recorded on it fences frees made on the legacy stream
    /// without recording on the legacy stream itself (whose events break every open
    /// capture when queried, `docs/vmm-semantics.md`).
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        Err(not_supported(DriverCall::StreamCreate))
    }

    /// Destroys a stream made by [`Driver::stream_create_blocking`] (`cuStreamDestroy`).
    fn stream_destroy(&self, stream: Stream) -> Result<(), DriverError> {
        let _ = stream;
        Err(not_supported(DriverCall::StreamDestroy))
    }

    // ---- host copies (issue 15: sleep in offload mode). A backend without them keeps
    // the defaults (`CUDA_ERROR_NOT_SUPPORTED`): only `Pool::sleep` with
    // `SleepMode::Offload` calls them.

    /// Allocates `size` bytes of pinned host memory (`cuMemHostAlloc`, flags 0) in the
    /// pool's device's context. `CUDA_ERROR_OUT_OF_MEMORY` when the host cannot pin
    /// that much; `CUDA_ERROR_INVALID_VALUE` for 0 bytes.
    fn host_alloc(&self, size: u64) -> Result<HostBuffer, DriverError> {
        let _ = size;
        Err(not_supported(DriverCall::HostAlloc))
    }

    /// Frees memory from [`Driver::host_alloc`] (`cuMemFreeHost`).
    fn host_free(&self, buffer: HostBuffer) -> Result<(), DriverError> {
        let _ = buffer;
        Err(not_supported(DriverCall::HostFree))
    }

    /// Copies `size` bytes from device address `src` to `dst` at byte `offset`
    /// (`cuMemcpyDtoH`: synchronous, ordered after the legacy stream's work). The
    /// source must be mapped with access granted, and `offset + size` within `dst`,
    /// else `CUDA_ERROR_INVALID_VALUE`.
    fn copy_to_host(
        &self,
        dst: HostBuffer,
        offset: u64,
        src: DevicePtr,
        size: u64,
    ) -> Result<(), DriverError> {
        let _ = (dst, offset, src, size);
        Err(not_supported(DriverCall::MemcpyDtoH))
    }

    /// Copies `size` bytes from `src` at byte `offset` to device address `dst`
    /// (`cuMemcpyHtoD`: synchronous). The same rules as [`Driver::copy_to_host`].
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: HostBuffer,
        offset: u64,
        size: u64,
    ) -> Result<(), DriverError> {
        let _ = (dst, src, offset, size);
        Err(not_supported(DriverCall::MemcpyHtoD))
    }

    /// Sets `size` bytes from device address `ptr` to `value`, queued on `stream`
    /// (`cuMemsetD8Async`): later work on `stream` sees the bytes set; the call
    /// returns before the memset runs. `[ptr, ptr + size)` must be mapped with access
    /// granted to the stream's device, else `CUDA_ERROR_INVALID_VALUE`
    /// (`docs/vmm-semantics.md`, "Memset"); a stream that is not live is
    /// `CUDA_ERROR_INVALID_HANDLE`. On a stream being captured the memset becomes a
    /// graph node instead of running: the pool never calls it there. Only
    /// [`Pool::wake_zeroed`](crate::Pool::wake_zeroed) calls it; a backend without it
    /// keeps the default (`CUDA_ERROR_NOT_SUPPORTED`).
    fn memset_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        size: u64,
        stream: Stream,
    ) -> Result<(), DriverError> {
        let _ = (ptr, value, size, stream);
        Err(not_supported(DriverCall::MemsetD8Async))
    }

    /// A checking hook, no driver call: the pool hands `[ptr, ptr + size)` to
    /// `stream` (a stream-ordered allocation). The simulated driver records a
    /// contract fault when another stream's unordered queued work still touches the
    /// range; the CUDA driver does nothing.
    fn note_handoff(&self, stream: Stream, ptr: DevicePtr, size: u64) {
        let _ = (stream, ptr, size);
    }
}

/// `CUDA_ERROR_NOT_SUPPORTED` for `call`: a backend without stream support.
fn not_supported(call: DriverCall) -> DriverError {
    DriverError::new(call, CuResult::NOT_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::CuResult;
    use cudarc::driver::sys::CUresult as C;

    /// Every name in the table is the one CUDA's own header gives that number
    /// (cudarc's bindings of `cuda.h`; found by the simulated streams' work: 904 was
    /// named IMPLICIT, which is 906).
    #[test]
    fn names_match_the_cuda_header() {
        let known = [
            C::CUDA_SUCCESS,
            C::CUDA_ERROR_INVALID_VALUE,
            C::CUDA_ERROR_OUT_OF_MEMORY,
            C::CUDA_ERROR_NOT_INITIALIZED,
            C::CUDA_ERROR_DEINITIALIZED,
            C::CUDA_ERROR_STUB_LIBRARY,
            C::CUDA_ERROR_DEVICE_UNAVAILABLE,
            C::CUDA_ERROR_NO_DEVICE,
            C::CUDA_ERROR_INVALID_DEVICE,
            C::CUDA_ERROR_INVALID_CONTEXT,
            C::CUDA_ERROR_INVALID_HANDLE,
            C::CUDA_ERROR_ILLEGAL_STATE,
            C::CUDA_ERROR_NOT_FOUND,
            C::CUDA_ERROR_NOT_READY,
            C::CUDA_ERROR_ILLEGAL_ADDRESS,
            C::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            C::CUDA_ERROR_LAUNCH_FAILED,
            C::CUDA_ERROR_NOT_PERMITTED,
            C::CUDA_ERROR_NOT_SUPPORTED,
            C::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            C::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            C::CUDA_ERROR_STREAM_CAPTURE_MERGE,
            C::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            C::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            C::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            C::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
            C::CUDA_ERROR_UNKNOWN,
        ];
        for c in known {
            assert_eq!(CuResult(c as u32).name(), format!("{c:?}"), "{}", c as u32);
        }
        assert_eq!(CuResult(123_456).name(), "CUDA_ERROR_(unnamed)");
    }
}
