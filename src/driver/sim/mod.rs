//! The simulated driver: a deterministic software model of the CUDA virtual-memory
//! calls that the pool makes, reproducing every measured row of
//! `docs/vmm-semantics.md` with the same `CUresult` codes.
//!
//! It is a shipped backend, not a test mock: an engine can run its CI and its memory
//! planning against it. It enforces a capacity, tracks every handle, reservation,
//! mapping and access grant, counts every call per kind, can be told to fail the
//! n-th future call of any kind with any code, models work in flight (a range marked
//! busy on one device until the next synchronize of that device) and a global-mode
//! stream capture.
//!
//! It also models streams, the work queued on them, events and stream captures per
//! calling thread (`stream_calls.rs`, `event_calls.rs`, `capture_calls.rs` and
//! `stream_controls.rs`, the model in `streams.rs`): the rows of the sections "Stream
//! capture" and "Events and stream queries while another stream is captured" of
//! `docs/vmm-semantics.md`, and a contract-fault counter
//! ([`SimDriver::contract_faults`]) for what would make work on the real device fault
//! or a capture fail.
//!
//! Two layers:
//!
//! - raw, CUDA-shaped inherent methods ([`SimDriver::mem_create`],
//!   [`SimDriver::mem_map`], ...) that take the same arguments as the driver calls
//!   (a map has an offset and a size) and return the raw [`CuResult`];
//! - the [`Driver`](crate::driver::Driver) trait implementation, which delegates to them and wraps a failure
//!   as a [`DriverError`](crate::driver::DriverError) naming the call.
//!
//! All state sits behind one [`crate::sync::Mutex`], so the driver is `Send + Sync`
//! and every call is atomic with respect to the others. Nothing is random and no
//! address or handle value is ever reused.
//!
//! Addresses are unique per process, as on the real driver (one virtual address space
//! per process): every simulated driver reserves from its own windows of
//! [`SIM_VA_WINDOW`] bytes, the lowest free ones from [`SIM_VA_BASE`] up, taken from
//! one process-wide registry and given back when the driver is dropped: no two live
//! drivers (no two pools) ever hand out the same address, a pointer freed on the
//! wrong pool is an unknown pointer there, and pools made one after another (the
//! replays of `flare-replay`) do not use up the address space. Reproducibility: a
//! driver's first window is taken when it is created, so the addresses a driver hands
//! out are the same from run to run as long as the same drivers are alive in the same
//! order and a driver reserves less than a window (1 TiB) in its lifetime.
#![forbid(unsafe_code)]

use std::fmt;

use super::{CuResult, DevicePtr};
use crate::sync::Mutex;

/// First virtual address the simulated reservations of a process are handed out
/// from: high and far from zero, like the driver's own VA space. The first simulated
/// driver of a process reserves from here; each other live one from its own window
/// above (see [`SIM_VA_WINDOW`]).
pub const SIM_VA_BASE: DevicePtr = 0x7f00_0000_0000;

/// Size of the address window each simulated driver reserves from, bytes (1 TiB, a
/// multiple of every granularity up to 1 TiB; [`SIM_VA_BASE`] is a multiple of it).
/// Windows come from one process-wide registry, so the live drivers of a process never
/// share an address. A driver that has used up its window (its reservations are
/// never reused) takes the lowest free one, and a reservation larger than a window
/// takes as many whole windows as it needs; a dropped driver gives its windows back.
/// About 16 million windows fit below 2^64; when the free ones cannot hold a
/// reservation, it fails with `CUDA_ERROR_OUT_OF_MEMORY`, as the driver's does when
/// its address space is exhausted.
pub const SIM_VA_WINDOW: u64 = 1 << 40;

/// `CUDA_ERROR_ILLEGAL_STATE` (401): what [`SimDriver::begin_capture`] and
/// [`SimDriver::stream_begin_capture`] return while that capture is already open and
/// [`SimDriver::end_capture`] / [`SimDriver::stream_end_capture`] return with none
/// open, as `cuStreamBeginCapture` / `cuStreamEndCapture` do.
pub const CUDA_ERROR_ILLEGAL_STATE: CuResult = CuResult(401);

/// `CUDA_ERROR_INVALID_HANDLE` (400): a stream or event handle that was never created
/// or is destroyed, as `cuStream*` / `cuEvent*` return for one.
pub const CUDA_ERROR_INVALID_HANDLE: CuResult = CuResult(400);

/// `CUDA_ERROR_NOT_READY` (600): what [`SimDriver::event_query`] and
/// [`SimDriver::stream_query`] return while the work they cover is not complete, as
/// `cuEventQuery` / `cuStreamQuery` do.
pub const CUDA_ERROR_NOT_READY: CuResult = CuResult(600);

/// `CUDA_ERROR_STREAM_CAPTURE_MERGE` (902): a stream being captured waited on an event
/// recorded in another capture (two capture sequences would merge).
pub const CUDA_ERROR_STREAM_CAPTURE_MERGE: CuResult = CuResult(902);

/// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` (903): `cuStreamEndCapture` on a stream that
/// joined a capture but did not begin it.
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: CuResult = CuResult(903);

/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (906): the legacy stream was asked about or
/// used while a blocking stream of its device is captured (row
/// "`cuStreamIsCapturing(CU_STREAM_LEGACY)` ... `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`
/// only for a blocking one"). (The crate's `CuResult::name` table calls 904 by this
/// name; CUDA's header gives 904 to `..._UNJOINED` and 906 to `..._IMPLICIT`.)
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CuResult = CuResult(906);

/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (908): a capture not begun in relaxed mode
/// ended from another thread than the one that began it.
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: CuResult = CuResult(908);

/// `CU_STREAM_DEFAULT` (0), a [`SimDriver::stream_create_with_flags`] flag value: a
/// blocking stream, which synchronizes with the legacy default stream of its device.
pub const CU_STREAM_DEFAULT: u32 = 0;

/// `CU_STREAM_NON_BLOCKING` (1), a [`SimDriver::stream_create_with_flags`] flag: the
/// stream does not synchronize with the legacy default stream (what PyTorch's streams
/// and the measured captures of `docs/vmm-semantics.md` use).
pub const CU_STREAM_NON_BLOCKING: u32 = 1;

/// What a device byte never written reads as in the simulated driver's content
/// model ([`SimDriver::read`]): new physical memory (`cuMemCreate`) comes with what an
/// earlier owner left there, since NVIDIA documents no initial contents, so the model
/// hands out stale bytes rather than zeros and a test that counts on zeros it did not
/// write fails. 0xFF: a NaN in every floating-point format (f32, f16, bf16, fp8
/// e4m3), as stale bytes in a KV cache woken from a discard sleep made NaNs in vLLM
/// (PR 45542).
pub const SIM_STALE_BYTE: u8 = 0xFF;

/// The legacy default stream of the calling thread's current device, as a stream
/// handle (`NULL`, a `CUstream` of 0; CUDA's `CU_STREAM_LEGACY`, 1, is accepted too).
pub const SIM_LEGACY_STREAM: u64 = 0;

pub use crate::driver::{CaptureMode, CaptureStatus};

/// What [`SimDriver::stream_get_capture_info`] reports (`cuStreamGetCaptureInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimCaptureInfo {
    /// The stream's capture status.
    pub status: CaptureStatus,
    /// The capture's id (unique within this driver, from 1), 0 when not capturing.
    pub id: u64,
    /// The mode the capture was begun with ([`CaptureMode::Global`] when not
    /// capturing).
    pub mode: CaptureMode,
    /// Launches recorded into the capture so far (graph kernel nodes), 0 when not
    /// capturing.
    pub launches: u64,
}

/// One range that queued work still touches ([`SimDriver::queued_work`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimWork {
    /// The stream it was launched on ([`SIM_LEGACY_STREAM`] for a legacy stream).
    pub stream: u64,
    /// The stream's device ordinal.
    pub device: i32,
    /// First byte touched.
    pub ptr: DevicePtr,
    /// Bytes touched.
    pub bytes: u64,
}

/// The stream, event and capture calls of the simulated driver, each counted
/// ([`SimDriver::stream_call_count`]) and, but for
/// [`SimStreamCall::ThreadExchangeCaptureMode`], able to be failed by
/// [`SimDriver::inject_stream_failure`]. Not [`DriverCall`](crate::driver::DriverCall)
/// kinds: the [`Driver`](crate::driver::Driver) trait has no stream calls yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimStreamCall {
    /// `cuStreamCreate`.
    StreamCreate = 0,
    /// `cuStreamDestroy`.
    StreamDestroy = 1,
    /// `cuStreamQuery`.
    StreamQuery = 2,
    /// `cuStreamSynchronize`.
    StreamSynchronize = 3,
    /// `cuStreamWaitEvent`.
    StreamWaitEvent = 4,
    /// `cuStreamBeginCapture`.
    StreamBeginCapture = 5,
    /// `cuStreamEndCapture`.
    StreamEndCapture = 6,
    /// `cuStreamGetCaptureInfo` and `cuStreamIsCapturing`.
    StreamGetCaptureInfo = 7,
    /// `cuEventCreate`.
    EventCreate = 8,
    /// `cuEventDestroy`.
    EventDestroy = 9,
    /// `cuEventRecord`.
    EventRecord = 10,
    /// `cuEventQuery`.
    EventQuery = 11,
    /// `cuEventSynchronize`.
    EventSynchronize = 12,
    /// `cuThreadExchangeStreamCaptureMode` (counted, never failed).
    ThreadExchangeCaptureMode = 13,
}

impl SimStreamCall {
    /// Every stream call kind, in number order.
    pub const ALL: [SimStreamCall; 14] = [
        SimStreamCall::StreamCreate,
        SimStreamCall::StreamDestroy,
        SimStreamCall::StreamQuery,
        SimStreamCall::StreamSynchronize,
        SimStreamCall::StreamWaitEvent,
        SimStreamCall::StreamBeginCapture,
        SimStreamCall::StreamEndCapture,
        SimStreamCall::StreamGetCaptureInfo,
        SimStreamCall::EventCreate,
        SimStreamCall::EventDestroy,
        SimStreamCall::EventRecord,
        SimStreamCall::EventQuery,
        SimStreamCall::EventSynchronize,
        SimStreamCall::ThreadExchangeCaptureMode,
    ];

    /// The CUDA driver function this call stands for (`"cuEventQuery"`).
    pub fn cuda_name(self) -> &'static str {
        match self {
            SimStreamCall::StreamCreate => "cuStreamCreate",
            SimStreamCall::StreamDestroy => "cuStreamDestroy",
            SimStreamCall::StreamQuery => "cuStreamQuery",
            SimStreamCall::StreamSynchronize => "cuStreamSynchronize",
            SimStreamCall::StreamWaitEvent => "cuStreamWaitEvent",
            SimStreamCall::StreamBeginCapture => "cuStreamBeginCapture",
            SimStreamCall::StreamEndCapture => "cuStreamEndCapture",
            SimStreamCall::StreamGetCaptureInfo => "cuStreamGetCaptureInfo",
            SimStreamCall::EventCreate => "cuEventCreate",
            SimStreamCall::EventDestroy => "cuEventDestroy",
            SimStreamCall::EventRecord => "cuEventRecord",
            SimStreamCall::EventQuery => "cuEventQuery",
            SimStreamCall::EventSynchronize => "cuEventSynchronize",
            SimStreamCall::ThreadExchangeCaptureMode => "cuThreadExchangeStreamCaptureMode",
        }
    }
}

/// 2 MiB: the granularity measured on an H200 (MINIMUM and RECOMMENDED alike).
const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Settings of a simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Physical capacity, bytes (default: an H200, 140 GiB). [`SimDriver::mem_create`]
    /// fails with `CUDA_ERROR_OUT_OF_MEMORY` when the physical bytes held plus the
    /// new size would exceed it.
    pub capacity_bytes: u64,
    /// Allocation granularity, bytes (default 2 MiB, as measured on an H200). Both
    /// MINIMUM and RECOMMENDED report it. A value of 0 is taken as 2 MiB.
    pub granularity_bytes: u64,
    /// Number of simulated devices (ordinals 0..device_count), default 1. Access can
    /// be granted to these ordinals only. At most [`SIM_MAX_DEVICES`]; a larger
    /// value is taken as that.
    pub device_count: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            capacity_bytes: 140 << 30,
            granularity_bytes: DEFAULT_GRANULARITY,
            device_count: 1,
        }
    }
}

/// What the simulated driver holds right now (not cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimState {
    /// Handles created and not yet freed (released handles still mapped count).
    pub handles: u64,
    /// Physical bytes held by those handles (an aliased handle counts once).
    pub physical_bytes: u64,
    /// Live reservations.
    pub reservations: u64,
    /// Bytes of live reservations.
    pub reserved_bytes: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Bytes of live mappings (an aliased handle counts once per mapping).
    pub mapped_bytes: u64,
    /// Access grants (mapping, device) pairs.
    pub access_grants: u64,
}

/// A contract violation the simulated driver recorded (the real driver would not
/// report it at the call, but work in flight would fault later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// A range marked busy (work in flight, [`SimDriver::mark_busy`]) was unmapped
    /// before a successful synchronize. On the real driver the unmap succeeds and the
    /// kernel then faults with an illegal address (sticky; "In-flight work: unmap does
    /// not wait" in `vmm-semantics.md`).
    UnmapWhileBusy {
        /// Start of the unmapped range (the `cuMemUnmap` argument), bytes.
        ptr: DevicePtr,
        /// Size of the unmapped range (the `cuMemUnmap` argument), bytes.
        size: u64,
    },
    /// A range that work queued on a stream still touches ([`SimDriver::launch`], not
    /// yet completed) was unmapped. The same fault on the real device as
    /// [`SimFault::UnmapWhileBusy`]; releasing a handle while mapped is not one (its
    /// memory lives until the last unmap, row "cuMemRelease while the handle is still
    /// mapped"), the unmap that frees it is.
    UnmapWhileQueued {
        /// Start of the unmapped range, bytes.
        ptr: DevicePtr,
        /// Size of the unmapped range, bytes.
        size: u64,
        /// The stream whose queued work touches it (the first found, in creation
        /// order, legacy streams last; [`SIM_LEGACY_STREAM`] for a legacy stream; a
        /// destroyed stream's handle, which a new stream may have now).
        stream: u64,
    },
    /// Memory was handed to `stream` ([`SimDriver::note_handoff`]) while work queued
    /// on `other` still touches it and is not ordered before `stream`'s later work
    /// (not completed, no `cuStreamWaitEvent` on an event covering it, no implicit
    /// legacy-stream ordering): the two streams' kernels could run at the same time on
    /// the same bytes.
    HandoffWhileQueued {
        /// The stream the memory was handed to.
        stream: u64,
        /// Start of the range handed over, bytes.
        ptr: DevicePtr,
        /// Size of the range handed over, bytes.
        size: u64,
        /// The stream whose unordered queued work touches it.
        other: u64,
    },
    /// A call broke a stream capture ([`SimDriver::stream_begin_capture`]) that was
    /// open: it was refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (or
    /// [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`]) and the capture's end will return
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`. (A synchronize refused during the
    /// stream-less capture of [`SimDriver::begin_capture`] is not one: that capture
    /// models the phase-1 contract, where a refused synchronize is expected and
    /// retried later.)
    CaptureBroken {
        /// The CUDA function that broke it (`"cuCtxSynchronize"`, `"cuEventQuery"`,
        /// ...).
        call: &'static str,
        /// Id of the (lowest-numbered) stream capture it broke.
        capture: u64,
    },
}

/// The most devices a simulated machine has (128: a set of device ordinals is one
/// 128-bit word, so that granting access allocates nothing).
pub const SIM_MAX_DEVICES: u32 = 128;

/// The simulated driver. See the module documentation.
pub struct SimDriver {
    inner: Mutex<Inner>,
}

impl fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDriver")
            .field("config", &self.config())
            .field("state", &self.state())
            .finish()
    }
}

impl Default for SimDriver {
    /// A simulated H200 ([`SimConfig::default`]).
    fn default() -> Self {
        SimDriver::new(SimConfig::default())
    }
}

impl Drop for SimDriver {
    /// Gives the driver's address windows back to the process, as the real driver's
    /// address space is freed with its reservations.
    fn drop(&mut self) {
        let windows = std::mem::take(&mut crate::sync::lock(&self.inner).windows);
        model::release_va_windows(&windows);
    }
}

mod calls;
mod capture_calls;
mod content;
mod control;
mod event_calls;
mod model;
mod stream_calls;
mod stream_controls;
mod streams;
mod trait_impl;

use model::Inner;

impl SimStreamCall {
    /// The stream call kind that a [`DriverCall`](crate::driver::DriverCall) of a
    /// stream or an event names (the simulator counts and fails those apart from the
    /// memory calls: [`SimDriver::stream_call_count`],
    /// [`SimDriver::inject_stream_failure`]); `None` for a memory, host or device call.
    pub fn of_driver_call(call: crate::driver::DriverCall) -> Option<SimStreamCall> {
        use crate::driver::DriverCall as D;
        Some(match call {
            D::EventCreate => SimStreamCall::EventCreate,
            D::EventDestroy => SimStreamCall::EventDestroy,
            D::EventRecord => SimStreamCall::EventRecord,
            D::EventQuery => SimStreamCall::EventQuery,
            D::EventSynchronize => SimStreamCall::EventSynchronize,
            D::StreamWaitEvent => SimStreamCall::StreamWaitEvent,
            D::StreamGetCaptureInfo => SimStreamCall::StreamGetCaptureInfo,
            D::ThreadExchangeCaptureMode => SimStreamCall::ThreadExchangeCaptureMode,
            D::StreamCreate => SimStreamCall::StreamCreate,
            D::StreamDestroy => SimStreamCall::StreamDestroy,
            _ => return None,
        })
    }
}
