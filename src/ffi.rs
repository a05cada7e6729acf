//! The C ABI: `include/flare_package.h` is generated from this file by cbindgen
//! (`FLARE_BLESS_HEADER=1 cargo test --test header`).
//!
//! Rules every function follows:
//! - it returns a [`FlareStatus`] with stable numbers (or, for the three helpers, a
//!   value that cannot fail);
//! - outputs come last and are written only on success;
//! - a NULL pointer argument is `FLARE_STATUS_INVALID_ARGUMENT`, except the documented
//!   no-ops (`flare_pool_destroy(NULL)`, `flare_package_free(pool, NULL)`);
//! - a panic is caught at the boundary and returned as `FLARE_STATUS_INTERNAL`: no
//!   unwind ever crosses into C;
//! - enum values coming from C are read as integers and validated, so an unknown value
//!   (`backend = 7`) is `FLARE_STATUS_INVALID_ARGUMENT`, never undefined behaviour;
//! - the detail of a failure (the call, the `CUresult`, the sizes) is kept per thread
//!   and read with `flare_last_error_message`.
//!
//! All the crate's `unsafe` code is in this file.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use crate::driver::sim::SimConfig;
use crate::driver::{CuResult, DriverCall};
use crate::pool::{Backend, Pool, PoolConfig, ReusePolicy, Snapshot};
use crate::Error;

/// A pool of CUDA virtual-memory mappings on one device. Opaque: created by
/// `flare_pool_create`, released by `flare_pool_destroy`.
///
/// Threading: every function may be called on the same pool from any number of
/// threads at once, except `flare_pool_destroy`, which must be the last call on the
/// pool and must not run concurrently with any other call on it.
pub struct FlarePool {
    pool: Pool,
}

/// The outcome of a call. The numbers are stable. On a status other than
/// `FLARE_STATUS_SUCCESS`, `flare_last_error_message` gives the detail.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlareStatus {
    /// The call did what it says; its outputs are written.
    FLARE_STATUS_SUCCESS = 0,
    /// A NULL pointer, a size of 0 bytes, a bad `struct_size`, an unknown enum value,
    /// a negative device ordinal. Nothing changed.
    FLARE_STATUS_INVALID_ARGUMENT = 1,
    /// The device has no room for the request. Outside a retention scope the pool
    /// already released its idle mappings and retried once; inside one, nothing
    /// retained was released. A request larger than the device's total memory fails
    /// at once, with nothing released and nothing counted.
    FLARE_STATUS_OUT_OF_MEMORY = 2,
    /// The operation is not available on this backend (fault injection on a CUDA
    /// pool).
    FLARE_STATUS_NOT_SUPPORTED = 3,
    /// The pointer was not handed out by this pool, is interior to an allocation, or
    /// was already freed. Nothing changed.
    FLARE_STATUS_UNKNOWN_POINTER = 4,
    /// A retention-scope call in the wrong state: begin while a scope is open,
    /// finish/abort with none open, trim inside a scope. Nothing changed.
    FLARE_STATUS_SCOPE_STATE = 5,
    /// A CUDA driver call failed; the message names the call, its `CUresult` and the
    /// size. The pool stays usable: what the driver refused to release is kept and
    /// retried at the next release point (finish, abort, trim, a free outside a
    /// scope).
    FLARE_STATUS_DRIVER_ERROR = 6,
    /// No CUDA driver could be loaded or initialised (libcuda absent, no device).
    FLARE_STATUS_NO_DRIVER = 7,
    /// A bug in the library (a panic caught at the C boundary). The message has the
    /// panic's text.
    FLARE_STATUS_INTERNAL = 8,
}

/// The driver a pool runs on.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlareBackend {
    /// The real CUDA driver (libcuda.so.1, loaded at run time), device `device`.
    FLARE_BACKEND_CUDA = 0,
    /// A deterministic simulated device (no GPU needed), sized by `sim_capacity_bytes`
    /// and `sim_granularity_bytes`. Supports fault injection.
    FLARE_BACKEND_SIMULATED = 1,
}

/// How a freed (idle) mapping is reused by a later allocation.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlareReusePolicy {
    /// The smallest idle mapping at least as large as the rounded request, wasting at
    /// most 30% of the request (the default; the bound was chosen by replaying real
    /// traces, see BENCHMARKS.md).
    FLARE_REUSE_BEST_FIT = 0,
    /// Only an idle mapping of exactly the rounded size.
    FLARE_REUSE_EXACT = 1,
    /// Never reuse (a baseline for comparison: a warmup that frees and allocates
    /// inside a scope keeps every mapping).
    FLARE_REUSE_NONE = 2,
}

/// The driver calls a pool makes, for `flare_sim_inject_failure`. The numbers are
/// stable.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlareDriverCall {
    /// `cuMemCreate`: a physical allocation (allocate, on a miss).
    FLARE_CALL_CREATE = 0,
    /// `cuMemRelease`: drop a physical allocation (release points).
    FLARE_CALL_RELEASE = 1,
    /// `cuMemAddressReserve`: reserve virtual addresses (allocate, on a miss).
    FLARE_CALL_RESERVE = 2,
    /// `cuMemAddressFree`: free the virtual addresses (release points).
    FLARE_CALL_FREE_RESERVATION = 3,
    /// `cuMemMap`: map the physical allocation (allocate, on a miss).
    FLARE_CALL_MAP = 4,
    /// `cuMemSetAccess`: grant read/write access (allocate, on a miss).
    FLARE_CALL_SET_ACCESS = 5,
    /// `cuMemUnmap`: unmap (release points).
    FLARE_CALL_UNMAP = 6,
    /// `cuCtxSynchronize`: wait for queued work before a release (release points).
    FLARE_CALL_SYNCHRONIZE = 7,
}

/// A `FlareStatus` as C passes it: read as its integer so that any value is
/// defined. Rendered as `FlareStatus` in the header.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus(pub u32);

/// A `FlareBackend` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawBackend(pub u32);

/// A `FlareReusePolicy` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawReusePolicy(pub u32);

/// A `FlareDriverCall` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDriverCall(pub u32);

/// Settings of a pool. Initialise with `flare_pool_config_init`, then change fields.
///
/// Versioning: `struct_size` is `sizeof(FlarePoolConfig)` of the header the caller
/// was compiled with. A smaller value (an older caller) is accepted: the fields lying
/// wholly inside `struct_size` bytes are read, the others take their defaults. It must
/// cover at least `struct_size` and `backend` (8 bytes) and be at most 4096, else
/// `FLARE_STATUS_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlarePoolConfig {
    /// `sizeof(FlarePoolConfig)`, bytes.
    pub struct_size: u32,
    /// The driver (default `FLARE_BACKEND_SIMULATED`, as in the Rust API: set
    /// `FLARE_BACKEND_CUDA` for real memory).
    pub backend: RawBackend,
    /// CUDA device ordinal whose memory the pool allocates (default 0; negative is
    /// `FLARE_STATUS_INVALID_ARGUMENT`).
    pub device: i32,
    /// Reuse policy (default `FLARE_REUSE_BEST_FIT`).
    pub reuse_policy: RawReusePolicy,
    /// Outside a retention scope, a freed mapping stays cached (idle, reusable) while
    /// the pool's idle bytes stay at or under this many bytes; above it, it is
    /// released. Default 0: release at once.
    pub release_threshold_bytes: u64,
    /// Other device ordinals that get read/write access to every mapping; read during
    /// `flare_pool_create` only (the caller keeps ownership). May be NULL when
    /// `peer_device_count` is 0 (the default).
    pub peer_devices: *const i32,
    /// Number of entries in `peer_devices` (at most 1024).
    pub peer_device_count: u32,
    /// Simulated backend: device capacity, bytes (0: the default, 140 GiB, an H200).
    pub sim_capacity_bytes: u64,
    /// Simulated backend: allocation granularity, bytes (0: the default, 2 MiB, as
    /// measured on an H200). Must be a power of two.
    pub sim_granularity_bytes: u64,
    /// Simulated backend: number of devices of the simulated machine (ordinals
    /// `0..sim_device_count`; 0: the default, 1). `device` and every peer must be
    /// below it, as on a real machine, else `FLARE_STATUS_INVALID_ARGUMENT`. Added in
    /// 0.1.0 after the fields above; an older caller's `struct_size` leaves it at
    /// its default.
    pub sim_device_count: u32,
}

/// A consistent copy of a pool's counters (taken under the pool's lock).
///
/// Byte fields are bytes; `*_count` fields count mappings; the other counters count
/// events since the pool was created. `physical_bytes == live_mapped_bytes +
/// idle_bytes + pending_bytes` always holds.
///
/// Versioning: the caller sets `struct_size` to `sizeof(FlareSnapshot)` of its
/// header; only the fields lying wholly inside `struct_size` bytes are written, and
/// `struct_size` itself is left as it is. It must cover at least `struct_size` and
/// `scope_open` (8 bytes) and be at most 4096, else `FLARE_STATUS_INVALID_ARGUMENT`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlareSnapshot {
    /// `sizeof(FlareSnapshot)`, bytes; set by the caller.
    pub struct_size: u32,
    /// 1 while a retention scope is open, else 0.
    pub scope_open: u32,
    /// The driver's allocation granularity, bytes; every mapping is a multiple.
    pub granularity_bytes: u64,
    /// Live allocations (handed out, not yet freed).
    pub live_count: u64,
    /// Bytes the callers asked for, summed over live allocations (not rounded).
    pub live_requested_bytes: u64,
    /// Bytes mapped for live allocations (rounded to the mappings' sizes).
    pub live_mapped_bytes: u64,
    /// Idle mappings: retained in a scope or cached; mapped and reusable.
    pub idle_count: u64,
    /// Bytes of idle mappings.
    pub idle_bytes: u64,
    /// Mappings whose release failed part-way and will be retried.
    pub pending_count: u64,
    /// Physical bytes of pending mappings whose handle is not yet released.
    pub pending_bytes: u64,
    /// Physical bytes the pool holds on the device.
    pub physical_bytes: u64,
    /// Bytes of virtual address space the pool holds reserved.
    pub reserved_bytes: u64,
    /// High watermark of `physical_bytes`.
    pub peak_physical_bytes: u64,
    /// High watermark of `live_mapped_bytes`.
    pub peak_live_mapped_bytes: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Successful frees.
    pub frees: u64,
    /// Allocations served from an idle mapping (no driver call).
    pub reuse_hits: u64,
    /// Of `reuse_hits`, those whose mapping had exactly the rounded size.
    pub reuse_exact_hits: u64,
    /// Mappings created (create, reserve, map, set access all succeeded).
    pub mappings_created: u64,
    /// Mappings fully released (unmapped, handle released, reservation freed).
    pub mappings_released: u64,
    /// Out-of-memory failures outside a scope answered by releasing idle mappings and
    /// retrying once.
    pub oom_retries: u64,
    /// Failed `cuMemMap` calls.
    pub map_failures: u64,
    /// Failed `cuMemSetAccess` calls.
    pub access_failures: u64,
    /// Failed `cuMemUnmap` calls.
    pub unmap_failures: u64,
    /// Failed `cuMemRelease` calls.
    pub release_failures: u64,
    /// Failed `cuMemAddressFree` calls.
    pub reservation_free_failures: u64,
    /// Failed `cuCtxSynchronize` calls (a capture in progress, a lost context).
    pub sync_failures: u64,
    /// Retention scopes closed with finish.
    pub scopes_finished: u64,
    /// Retention scopes closed with abort.
    pub scopes_aborted: u64,
    /// Failed `cuMemCreate` calls (out of memory included).
    pub create_failures: u64,
    /// Failed `cuMemAddressReserve` calls.
    pub reserve_failures: u64,
}

// The layouts the C tests assert too (`sizeof` 64 and 240 on 64-bit targets).
const _: () = assert!(size_of::<FlareStatus>() == 4 && size_of::<FlareBackend>() == 4);
const _: () = assert!(size_of::<FlareReusePolicy>() == 4 && size_of::<FlareDriverCall>() == 4);
const _: () = assert!(size_of::<FlareSnapshot>() == 8 + 29 * 8);

/// The largest `struct_size` accepted from a caller.
const MAX_STRUCT_SIZE: u32 = 4096;
/// The most peer devices a configuration may name.
const MAX_PEER_DEVICES: u32 = 1024;

macro_rules! field_ends {
    ($t:ty; $($f:ident),* $(,)?) => {{
        // The end offset of each field, from a value that is never read.
        let probe = <$t>::default_for_layout();
        [$(offset_of!($t, $f) + std::mem::size_of_val(&probe.$f)),*]
    }};
}

impl FlarePoolConfig {
    fn default_for_layout() -> Self {
        FlarePoolConfig {
            struct_size: size_of::<FlarePoolConfig>() as u32,
            backend: RawBackend(FlareBackend::FLARE_BACKEND_SIMULATED as u32),
            device: 0,
            reuse_policy: RawReusePolicy(FlareReusePolicy::FLARE_REUSE_BEST_FIT as u32),
            release_threshold_bytes: 0,
            peer_devices: ptr::null(),
            peer_device_count: 0,
            sim_capacity_bytes: 0,
            sim_granularity_bytes: 0,
            sim_device_count: 0,
        }
    }

    fn field_ends() -> [usize; 10] {
        field_ends!(FlarePoolConfig; struct_size, backend, device, reuse_policy,
            release_threshold_bytes, peer_devices, peer_device_count, sim_capacity_bytes,
            sim_granularity_bytes, sim_device_count)
    }
}

impl FlareSnapshot {
    fn default_for_layout() -> Self {
        FlareSnapshot::default()
    }

    fn field_ends() -> [usize; 31] {
        field_ends!(FlareSnapshot; struct_size, scope_open, granularity_bytes, live_count,
            live_requested_bytes, live_mapped_bytes, idle_count, idle_bytes, pending_count,
            pending_bytes, physical_bytes, reserved_bytes, peak_physical_bytes,
            peak_live_mapped_bytes, allocations, frees, reuse_hits, reuse_exact_hits,
            mappings_created, mappings_released, oom_retries, map_failures, access_failures,
            unmap_failures, release_failures, reservation_free_failures, sync_failures,
            scopes_finished, scopes_aborted, create_failures, reserve_failures)
    }

    fn from_snapshot(s: &Snapshot) -> Self {
        FlareSnapshot {
            struct_size: size_of::<FlareSnapshot>() as u32,
            scope_open: u32::from(s.scope_open),
            granularity_bytes: s.granularity_bytes,
            live_count: s.live_count,
            live_requested_bytes: s.live_requested_bytes,
            live_mapped_bytes: s.live_mapped_bytes,
            idle_count: s.idle_count,
            idle_bytes: s.idle_bytes,
            pending_count: s.pending_count,
            pending_bytes: s.pending_bytes,
            physical_bytes: s.physical_bytes,
            reserved_bytes: s.reserved_bytes,
            peak_physical_bytes: s.peak_physical_bytes,
            peak_live_mapped_bytes: s.peak_live_mapped_bytes,
            allocations: s.allocations,
            frees: s.frees,
            reuse_hits: s.reuse_hits,
            reuse_exact_hits: s.reuse_exact_hits,
            mappings_created: s.mappings_created,
            mappings_released: s.mappings_released,
            oom_retries: s.oom_retries,
            map_failures: s.map_failures,
            access_failures: s.access_failures,
            unmap_failures: s.unmap_failures,
            release_failures: s.release_failures,
            reservation_free_failures: s.reservation_free_failures,
            sync_failures: s.sync_failures,
            scopes_finished: s.scopes_finished,
            scopes_aborted: s.scopes_aborted,
            create_failures: s.create_failures,
            reserve_failures: s.reserve_failures,
        }
    }
}

/// Checks a caller's `struct_size` and returns how many leading bytes of the struct
/// to read or write: the end of the last field lying wholly inside it (at most the
/// library's own size). `field_ends` is in layout order.
fn struct_prefix<T>(what: &str, struct_size: u32, field_ends: &[usize]) -> Result<usize, Error> {
    let min = field_ends[1];
    if (struct_size as usize) < min || struct_size > MAX_STRUCT_SIZE {
        return Err(Error::InvalidArgument(format!(
            "{what}.struct_size is {struct_size}: must be between {min} and {MAX_STRUCT_SIZE} (sizeof is {})",
            size_of::<T>()
        )));
    }
    Ok(field_ends
        .iter()
        .copied()
        .filter(|&end| end <= struct_size as usize)
        .max()
        .unwrap_or(min))
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: String) {
    // try_with: during thread teardown the slot may be gone; the message is then lost
    // rather than panicking across the C boundary.
    let _ = LAST_ERROR.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            *m = message;
        }
    });
}

fn status_of(e: &Error) -> FlareStatus {
    match e {
        Error::InvalidArgument(_) => FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        Error::OutOfMemory { .. } => FlareStatus::FLARE_STATUS_OUT_OF_MEMORY,
        Error::NotSupported(_) => FlareStatus::FLARE_STATUS_NOT_SUPPORTED,
        Error::UnknownPointer { .. } => FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
        Error::ScopeState(_) => FlareStatus::FLARE_STATUS_SCOPE_STATE,
        Error::Driver { .. } => FlareStatus::FLARE_STATUS_DRIVER_ERROR,
        Error::NoDriver(_) => FlareStatus::FLARE_STATUS_NO_DRIVER,
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// The panic boundary of every status-returning function: runs `f`, maps its error
/// to a status and records the message, catches a panic as `FLARE_STATUS_INTERNAL`.
fn boundary(name: &'static str, f: impl FnOnce() -> Result<(), Error>) -> FlareStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => FlareStatus::FLARE_STATUS_SUCCESS,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {e}"));
            status_of(&e)
        }
        Err(payload) => {
            set_last_error(format!(
                "{name}: internal error (a panic was caught at the C boundary): {}",
                panic_text(&*payload)
            ));
            FlareStatus::FLARE_STATUS_INTERNAL
        }
    }
}

fn null_error(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} is NULL"))
}

/// The pool behind a caller's pointer.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed.
unsafe fn pool_ref<'a>(pool: *const FlarePool) -> Result<&'a FlarePool, Error> {
    // SAFETY: the caller guarantees `pool` is NULL or a live pointer from
    // `flare_pool_create` (a `Box<FlarePool>`); `FlarePool` is `Sync` and only shared
    // references are formed here, so concurrent calls are fine.
    unsafe { pool.as_ref() }.ok_or_else(|| null_error("pool"))
}

fn reuse_policy_from(raw: RawReusePolicy) -> Result<ReusePolicy, Error> {
    match raw.0 {
        x if x == FlareReusePolicy::FLARE_REUSE_BEST_FIT as u32 => Ok(ReusePolicy::BestFit),
        x if x == FlareReusePolicy::FLARE_REUSE_EXACT as u32 => Ok(ReusePolicy::Exact),
        x if x == FlareReusePolicy::FLARE_REUSE_NONE as u32 => Ok(ReusePolicy::None),
        x => Err(Error::InvalidArgument(format!(
            "reuse_policy {x} is not a FlareReusePolicy (0..2)"
        ))),
    }
}

/// Reads a caller's configuration (only the fields inside its `struct_size`) and
/// converts it.
///
/// # Safety
/// `config` is non-NULL and points to at least `config->struct_size` readable bytes
/// (when `struct_size` is valid), and `peer_devices` to `peer_device_count` values.
unsafe fn read_config(config: *const FlarePoolConfig) -> Result<PoolConfig, Error> {
    if !config.is_aligned() {
        return Err(Error::InvalidArgument("config is misaligned".into()));
    }
    // SAFETY: `config` is non-NULL and aligned, and every caller's struct has at least
    // its first field (the header's struct starts with it).
    let struct_size = unsafe { ptr::addr_of!((*config).struct_size).read() };
    let prefix =
        struct_prefix::<FlarePoolConfig>("config", struct_size, &FlarePoolConfig::field_ends())?;
    let mut c = FlarePoolConfig::default_for_layout();
    // SAFETY: the caller's struct has `struct_size >= prefix` readable bytes; `c` is a
    // local of the same layout with `size_of::<FlarePoolConfig>() >= prefix` bytes; every
    // field is an integer or a raw pointer, so any bytes are a valid value, and the
    // prefix ends on a field boundary, so no field is half copied.
    unsafe {
        ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            ptr::addr_of_mut!(c).cast::<u8>(),
            prefix,
        )
    };
    let reuse_policy = reuse_policy_from(c.reuse_policy)?;
    if c.peer_device_count > MAX_PEER_DEVICES {
        return Err(Error::InvalidArgument(format!(
            "peer_device_count {} is above {MAX_PEER_DEVICES}",
            c.peer_device_count
        )));
    }
    let peer_devices = if c.peer_device_count == 0 {
        Vec::new()
    } else if c.peer_devices.is_null() {
        return Err(null_error("peer_devices (with peer_device_count > 0)"));
    } else if !c.peer_devices.is_aligned() {
        return Err(Error::InvalidArgument("peer_devices is misaligned".into()));
    } else {
        // SAFETY: non-NULL and aligned; the caller guarantees `peer_device_count`
        // readable `int32_t` values that are not written during this call.
        unsafe { std::slice::from_raw_parts(c.peer_devices, c.peer_device_count as usize) }.to_vec()
    };
    let backend = match c.backend.0 {
        x if x == FlareBackend::FLARE_BACKEND_CUDA as u32 => Backend::Cuda,
        x if x == FlareBackend::FLARE_BACKEND_SIMULATED as u32 => {
            let defaults = SimConfig::default();
            Backend::Simulated(SimConfig {
                capacity_bytes: match c.sim_capacity_bytes {
                    0 => defaults.capacity_bytes,
                    n => n,
                },
                granularity_bytes: match c.sim_granularity_bytes {
                    0 => defaults.granularity_bytes,
                    n => n,
                },
                device_count: match c.sim_device_count {
                    0 => defaults.device_count,
                    n => n,
                },
            })
        }
        x => {
            return Err(Error::InvalidArgument(format!(
                "backend {x} is not a FlareBackend (0..1)"
            )))
        }
    };
    Ok(PoolConfig {
        backend,
        device: c.device,
        reuse_policy,
        release_threshold_bytes: c.release_threshold_bytes,
        peer_devices,
        ..PoolConfig::default()
    })
}

/// Fills `*config` with the defaults: `struct_size = sizeof(FlarePoolConfig)`,
/// `FLARE_BACKEND_SIMULATED` (set `FLARE_BACKEND_CUDA` for real memory), device 0,
/// `FLARE_REUSE_BEST_FIT`, release threshold 0, no peers, simulated capacity and
/// granularity and device count 0 (their defaults: 140 GiB, 2 MiB, 1 device).
///
/// Writes `sizeof(FlarePoolConfig)` bytes of this header's version. NULL: nothing
/// happens. Thread-safe.
///
/// # Safety
/// `config` is NULL or points to a writable `FlarePoolConfig`.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_config_init(config: *mut FlarePoolConfig) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if config.is_null() || !config.is_aligned() {
            return;
        }
        // SAFETY: non-NULL and aligned; the caller guarantees it points to a writable
        // `FlarePoolConfig`.
        unsafe { config.write(FlarePoolConfig::default_for_layout()) };
    }));
}

/// Creates a pool from `*config` and writes it to `*out_pool`.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument, a bad `struct_size`,
/// an unknown backend or reuse policy, a negative device or peer ordinal, NULL
/// `peer_devices` with a non-zero count; `FLARE_STATUS_NO_DRIVER` when the CUDA
/// backend is asked for and libcuda cannot be loaded or initialised;
/// `FLARE_STATUS_DRIVER_ERROR` when the granularity query fails.
///
/// Ownership: the caller owns the pool and releases it with `flare_pool_destroy`.
/// `config` and `peer_devices` are only read during the call. Thread-safe.
///
/// # Safety
/// `config` is NULL or points to a `FlarePoolConfig` of at least `struct_size`
/// readable bytes; `out_pool` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_create(
    config: *const FlarePoolConfig,
    out_pool: *mut *mut FlarePool,
) -> FlareStatus {
    boundary("flare_pool_create", || {
        if config.is_null() {
            return Err(null_error("config"));
        }
        if out_pool.is_null() {
            return Err(null_error("out_pool"));
        }
        if !out_pool.is_aligned() {
            return Err(Error::InvalidArgument("out_pool is misaligned".into()));
        }
        // SAFETY: non-NULL; the caller guarantees the rest (see this function's
        // contract, which is `read_config`'s).
        let config = unsafe { read_config(config) }?;
        let pool = Box::new(FlarePool {
            pool: Pool::new(config)?,
        });
        // SAFETY: non-NULL, aligned, and writable by the caller's contract.
        unsafe { out_pool.write(Box::into_raw(pool)) };
        Ok(())
    })
}

/// Releases everything the pool holds, live allocations included (one synchronize,
/// then unmap, release and free each mapping, refused steps retried once), and frees
/// the pool. `pool` is invalid afterwards, whatever the status.
///
/// NULL: `FLARE_STATUS_SUCCESS`, nothing happens.
///
/// Errors: `FLARE_STATUS_DRIVER_ERROR` with the first step the driver still refused
/// after the retry (that memory is left to the driver; the pool is freed all the
/// same).
///
/// Threading: must not run concurrently with any other call on this pool.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_destroy(pool: *mut FlarePool) -> FlareStatus {
    boundary("flare_pool_destroy", || {
        if pool.is_null() {
            return Ok(());
        }
        // SAFETY: non-NULL and, by the caller's contract, the `Box<FlarePool>` that
        // `flare_pool_create` leaked, not yet destroyed and not in use elsewhere.
        let pool = unsafe { Box::from_raw(pool) };
        pool.pool.destroy()
    })
}

/// Allocates `size` bytes of device memory and writes its device address
/// (a `CUdeviceptr`, aligned to the granularity) to `*out_ptr`.
///
/// The size is rounded up to the granularity (2 MiB on an H200). An idle mapping that
/// fits under the reuse policy is taken with no driver call; otherwise a new mapping is
/// created (create, reserve, map, set access).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument or a size of 0 (or one
/// whose rounding overflows); `FLARE_STATUS_OUT_OF_MEMORY` when the device is full;
/// `FLARE_STATUS_DRIVER_ERROR` for another failed driver call (nothing leaked; the
/// pool stays usable).
///
/// Ownership: the memory belongs to the pool; free it with `flare_package_free` on
/// the same pool, or it is released by `flare_pool_destroy`. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out_ptr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn flare_package_allocate(
    pool: *mut FlarePool,
    size: usize,
    out_ptr: *mut *mut c_void,
) -> FlareStatus {
    boundary("flare_package_allocate", || {
        // SAFETY: by the caller's contract.
        let pool = unsafe { pool_ref(pool) }?;
        if out_ptr.is_null() {
            return Err(null_error("out_ptr"));
        }
        if !out_ptr.is_aligned() {
            return Err(Error::InvalidArgument("out_ptr is misaligned".into()));
        }
        let ptr = pool.pool.allocate_raw(size as u64)?;
        let addr = match usize::try_from(ptr) {
            Ok(addr) => addr,
            Err(_) => {
                // Cannot happen on the 64-bit targets CUDA supports; give it back.
                let _ = pool.pool.free_raw(ptr);
                return Err(Error::NotSupported("device address wider than a pointer"));
            }
        };
        // SAFETY: non-NULL, aligned, and writable by the caller's contract.
        unsafe { out_ptr.write(addr as *mut c_void) };
        Ok(())
    })
}

/// Frees an allocation of this pool, given the exact address `flare_package_allocate`
/// returned. Inside a retention scope the mapping is retained idle; outside, it is
/// cached up to the release threshold, else released. A release step the driver
/// refuses is kept, counted in the snapshot and retried later: it does not fail the
/// free.
///
/// `ptr` NULL: `FLARE_STATUS_SUCCESS`, nothing happens (with a valid pool).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_UNKNOWN_POINTER` for a pointer this pool did not hand out, an interior
/// pointer or a second free (nothing changes). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool. `ptr` is only compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn flare_package_free(pool: *mut FlarePool, ptr: *mut c_void) -> FlareStatus {
    boundary("flare_package_free", || {
        // SAFETY: by the caller's contract.
        let pool = unsafe { pool_ref(pool) }?;
        if ptr.is_null() {
            return Ok(());
        }
        pool.pool.free_raw(ptr as usize as u64)
    })
}

/// Opens the pool's retention scope: until it closes, freed mappings are retained
/// idle (reusable) and nothing is released, so no unmap races queued or captured
/// work. Open it around warmup and CUDA-graph capture. Scopes do not nest.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` when
/// a scope is already open. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_begin(pool: *mut FlarePool) -> FlareStatus {
    boundary("flare_retention_begin", || {
        // SAFETY: by the caller's contract.
        unsafe { pool_ref(pool) }?.pool.retention_begin()
    })
}

/// Closes the retention scope and releases every idle mapping (one synchronize, then
/// unmap, release and free each). Live allocations stay live.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` with no
/// scope open; `FLARE_STATUS_DRIVER_ERROR` with the first release step the driver
/// refused (the scope is closed all the same; what was refused is kept and retried at
/// the next release point). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_finish(pool: *mut FlarePool) -> FlareStatus {
    boundary("flare_retention_finish", || {
        // SAFETY: by the caller's contract.
        unsafe { pool_ref(pool) }?.pool.retention_finish()
    })
}

/// Closes the retention scope as failed (a warmup or capture that went wrong): the
/// same release as `flare_retention_finish`, counted in `scopes_aborted`.
///
/// Errors: as `flare_retention_finish`. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_retention_abort(pool: *mut FlarePool) -> FlareStatus {
    boundary("flare_retention_abort", || {
        // SAFETY: by the caller's contract.
        unsafe { pool_ref(pool) }?.pool.retention_abort()
    })
}

/// Releases every idle (cached) mapping now and retries pending releases.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL; `FLARE_STATUS_SCOPE_STATE` inside
/// a retention scope; `FLARE_STATUS_DRIVER_ERROR` with the first step the driver
/// refused (kept and retried at the next release point). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_trim(pool: *mut FlarePool) -> FlareStatus {
    boundary("flare_pool_trim", || {
        // SAFETY: by the caller's contract.
        unsafe { pool_ref(pool) }?.pool.trim()
    })
}

/// Writes a consistent copy of the pool's counters to `*out`. The caller sets
/// `out->struct_size` first (`sizeof(FlareSnapshot)`); only fields lying wholly
/// inside it are written.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument or a bad
/// `struct_size` (nothing written). Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool; `out` is NULL or points to at least
/// `out->struct_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_snapshot(
    pool: *const FlarePool,
    out: *mut FlareSnapshot,
) -> FlareStatus {
    boundary("flare_pool_snapshot", || {
        // SAFETY: by the caller's contract.
        let pool = unsafe { pool_ref(pool) }?;
        if out.is_null() {
            return Err(null_error("out"));
        }
        if !out.is_aligned() {
            return Err(Error::InvalidArgument("out is misaligned".into()));
        }
        // SAFETY: non-NULL and aligned; every caller's struct has at least its first
        // field.
        let struct_size = unsafe { ptr::addr_of!((*out).struct_size).read() };
        let prefix =
            struct_prefix::<FlareSnapshot>("snapshot", struct_size, &FlareSnapshot::field_ends())?;
        let snap = FlareSnapshot::from_snapshot(&pool.pool.snapshot());
        let skip = size_of::<u32>(); // `struct_size` stays the caller's.
                                     // SAFETY: the caller's struct has `struct_size >= prefix` writable bytes; the
                                     // local has `size_of::<FlareSnapshot>() >= prefix` bytes and no padding; the
                                     // prefix ends on a field boundary.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::addr_of!(snap).cast::<u8>().add(skip),
                out.cast::<u8>().add(skip),
                prefix - skip,
            )
        };
        Ok(())
    })
}

/// The enumerator's name (`"FLARE_STATUS_OUT_OF_MEMORY"`), or
/// `"FLARE_STATUS_UNRECOGNIZED"` for a value outside the enum. Static storage, never
/// NULL, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn flare_status_name(status: RawStatus) -> *const c_char {
    let name: &'static CStr = match status.0 {
        0 => c"FLARE_STATUS_SUCCESS",
        1 => c"FLARE_STATUS_INVALID_ARGUMENT",
        2 => c"FLARE_STATUS_OUT_OF_MEMORY",
        3 => c"FLARE_STATUS_NOT_SUPPORTED",
        4 => c"FLARE_STATUS_UNKNOWN_POINTER",
        5 => c"FLARE_STATUS_SCOPE_STATE",
        6 => c"FLARE_STATUS_DRIVER_ERROR",
        7 => c"FLARE_STATUS_NO_DRIVER",
        8 => c"FLARE_STATUS_INTERNAL",
        _ => c"FLARE_STATUS_UNRECOGNIZED",
    };
    name.as_ptr()
}

/// Copies the calling thread's last error message (UTF-8: the function, then what
/// failed, with the driver call, its `CUresult` and the sizes) into `buf` as a
/// NUL-terminated string truncated to `len - 1` bytes, and returns the message's full
/// length in bytes, without the NUL (so a return value `>= len` means it was
/// truncated; call again with a larger buffer).
///
/// The message is that of the last call on this thread that returned a status other
/// than `FLARE_STATUS_SUCCESS`; successful calls leave it as it is (read it right after
/// the failure). Empty (returns 0) before any failure on this thread. `buf` NULL or
/// `len` 0: nothing is written; the length is still returned. Thread-safe (one
/// message per thread).
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_last_error_message(buf: *mut c_char, len: usize) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| {
                let m = m.borrow();
                let bytes = m.as_bytes();
                if !buf.is_null() && len > 0 {
                    let n = bytes.len().min(len - 1);
                    // SAFETY: the caller guarantees `len` writable bytes at `buf`;
                    // `n + 1 <= len`, and the message is a separate Rust allocation.
                    unsafe {
                        ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n);
                        buf.add(n).write(0);
                    }
                }
                bytes.len()
            })
            .unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// Simulated backend only: makes the `nth` future call of kind `call` (1 = the next
/// one) fail with the `CUresult` value `cuda_error` (e.g. 2,
/// `CUDA_ERROR_OUT_OF_MEMORY`; 999, `CUDA_ERROR_UNKNOWN`). For testing how a caller
/// copes with driver failures.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool, an unknown `call`, `nth`
/// 0 or `cuda_error` <= 0; `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_inject_failure(
    pool: *mut FlarePool,
    call: RawDriverCall,
    nth: u32,
    cuda_error: i32,
) -> FlareStatus {
    boundary("flare_sim_inject_failure", || {
        // SAFETY: by the caller's contract.
        let pool = unsafe { pool_ref(pool) }?;
        let kind = match DriverCall::MEMORY_CALLS.get(call.0 as usize) {
            Some(&kind) => kind,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "call {} is not a FlareDriverCall (0..7)",
                    call.0
                )))
            }
        };
        if nth == 0 {
            return Err(Error::InvalidArgument(
                "nth is 0: 1 is the next call".into(),
            ));
        }
        let code = match u32::try_from(cuda_error) {
            Ok(code) if code != 0 => CuResult(code),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "cuda_error {cuda_error} is not a failure CUresult (must be > 0)"
                )))
            }
        };
        let sim = pool.pool.sim_driver().ok_or(Error::NotSupported(
            "fault injection needs a simulated pool",
        ))?;
        sim.inject_failure(kind, nth, code);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_prefix_rounds_down_to_field_boundaries() {
        let ends = FlareSnapshot::field_ends();
        assert_eq!(*ends.last().unwrap_or(&0), size_of::<FlareSnapshot>());
        assert!(struct_prefix::<FlareSnapshot>("s", 0, &ends).is_err());
        assert!(struct_prefix::<FlareSnapshot>("s", 7, &ends).is_err());
        assert!(struct_prefix::<FlareSnapshot>("s", 4097, &ends).is_err());
        assert_eq!(struct_prefix::<FlareSnapshot>("s", 8, &ends).ok(), Some(8));
        assert_eq!(
            struct_prefix::<FlareSnapshot>("s", 23, &ends).ok(),
            Some(16)
        );
        assert_eq!(
            struct_prefix::<FlareSnapshot>("s", 4096, &ends).ok(),
            Some(240)
        );
        let ends = FlarePoolConfig::field_ends();
        // sim_device_count ends at 60; 4 bytes of tail padding make sizeof 64.
        assert_eq!(*ends.last().unwrap_or(&0), 60);
        assert_eq!(size_of::<FlarePoolConfig>(), 64);
        assert_eq!(
            struct_prefix::<FlarePoolConfig>("c", 64, &ends).ok(),
            Some(60)
        );
        // peer_device_count ends at 36; 40 has padding, then sim_capacity_bytes.
        assert_eq!(
            struct_prefix::<FlarePoolConfig>("c", 40, &ends).ok(),
            Some(36)
        );
    }

    #[test]
    fn a_panic_is_an_internal_status_with_its_message() {
        let status = boundary("flare_test", || panic!("boom {}", 42));
        assert_eq!(status, FlareStatus::FLARE_STATUS_INTERNAL);
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` has 256 writable bytes.
        let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: flare_last_error_message NUL-terminated it.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        assert_eq!(n, msg.len());
        assert!(msg.starts_with("flare_test: internal error") && msg.ends_with("boom 42"));
    }

    #[test]
    fn errors_map_to_their_statuses() {
        let status = boundary("flare_test", || Err(Error::UnknownPointer { ptr: 0x10 }));
        assert_eq!(status, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
        let status = boundary("flare_test", || Err(Error::NoDriver("x".into())));
        assert_eq!(status, FlareStatus::FLARE_STATUS_NO_DRIVER);
        // SAFETY: NULL with length 0 writes nothing.
        let n = unsafe { flare_last_error_message(ptr::null_mut(), 0) };
        assert_eq!(n, "flare_test: no CUDA driver: x".len());
    }

    #[test]
    fn status_names_match_the_enum() {
        for (s, n) in [
            (FlareStatus::FLARE_STATUS_SUCCESS, "FLARE_STATUS_SUCCESS"),
            (FlareStatus::FLARE_STATUS_INTERNAL, "FLARE_STATUS_INTERNAL"),
            (
                FlareStatus::FLARE_STATUS_NO_DRIVER,
                "FLARE_STATUS_NO_DRIVER",
            ),
        ] {
            // SAFETY: flare_status_name returns a static NUL-terminated string.
            let got = unsafe { CStr::from_ptr(flare_status_name(RawStatus(s as u32))) };
            assert_eq!(got.to_str().ok(), Some(n));
        }
    }
}
