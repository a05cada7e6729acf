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
//!   unwind ever crosses into C. A panic in a call on a pool may have left its books
//!   half-updated, so the pool is then poisoned: every later call on it returns
//!   `FLARE_STATUS_INTERNAL` with a message saying so, except `flare_pool_destroy`,
//!   which still releases what the pool holds;
//! - enum values coming from C are read as integers and validated, so an unknown value
//!   (`backend = 7`) is `FLARE_STATUS_INVALID_ARGUMENT`, never undefined behaviour;
//!   struct fields holding one are `uint32_t` in the header (a C enum's width is the
//!   compiler's choice), the named constants stay;
//! - the detail of a failure (the call, the `CUresult`, the sizes) is kept per thread
//!   and read with `flare_last_error_message`.
//!
//! All the crate's `unsafe` code is in this file.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::driver::sim::SimConfig;
use crate::driver::{CuResult, DriverCall};
use crate::pool::{
    Backend, Pool, PoolConfig, ReusePolicy, Snapshot, DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
};
use crate::{fmt_bytes, Error};

/// A pool of CUDA virtual-memory mappings on one device. Opaque: created by
/// `flare_pool_create`, released by `flare_pool_destroy`.
///
/// Threading: every function may be called on the same pool from any number of
/// threads at once, except `flare_pool_destroy`, which must be the last call on the
/// pool and must not run concurrently with any other call on it.
pub struct FlarePool {
    pool: Pool,
    /// Set (to the function and the panic's text) when a panic was caught in a call
    /// on this pool: the books may be half-updated, so every later call but destroy
    /// is refused with `FLARE_STATUS_INTERNAL`.
    poisoned: OnceLock<String>,
    /// `flare_sim_inject_panic`: the next call on this pool panics once its pool
    /// operation is done, before it writes its outputs.
    panic_next: AtomicBool,
}

impl FlarePool {
    fn new(pool: Pool) -> Self {
        FlarePool {
            pool,
            poisoned: OnceLock::new(),
            panic_next: AtomicBool::new(false),
        }
    }

    /// The panic `flare_sim_inject_panic` asked for, if it did. Called by every
    /// function on a pool right after its pool operation, before its outputs.
    fn injected_panic_point(&self) {
        // The load first: the common case reads the flag without writing it.
        if self.panic_next.load(Ordering::Relaxed) && self.panic_next.swap(false, Ordering::Relaxed)
        {
            panic!("injected by flare_sim_inject_panic");
        }
    }
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
    /// The device has no room for the request now. Outside a retention scope the pool
    /// already released its idle mappings and retried once; inside one, nothing
    /// retained was released. Freeing memory can make the request succeed (a request
    /// that never can is `FLARE_STATUS_REQUEST_TOO_LARGE`).
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
    /// panic's text. The pool the call was on is poisoned: every later call on it
    /// returns this status too (the message says the pool is poisoned), except
    /// `flare_pool_destroy`, which still releases what the pool holds.
    FLARE_STATUS_INTERNAL = 8,
    /// The request, rounded up to the granularity, is more than the device's total
    /// memory: it can never succeed, whatever is freed. Refused at once: no driver
    /// call, nothing released, nothing counted.
    FLARE_STATUS_REQUEST_TOO_LARGE = 9,
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

/// A `FlareDriverCall` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDriverCall(pub u32);

/// Settings of a pool. Initialise with `flare_pool_config_init`, then change fields.
///
/// Versioning: `struct_size` is `sizeof(FlarePoolConfig)` of the header the caller
/// was compiled with (`flare_pool_config_init` sets it). A smaller value (an older
/// caller) is accepted: the fields lying wholly inside `struct_size` bytes are read,
/// the others take their defaults. It must cover at least `struct_size` and `backend`
/// (8 bytes) and be at most 4096, else `FLARE_STATUS_INVALID_ARGUMENT`.
///
/// Enum-valued fields are `uint32_t` (a C enum's size is the compiler's choice); set
/// them with the named constants.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FlarePoolConfig {
    /// `sizeof(FlarePoolConfig)`, bytes.
    pub struct_size: u32,
    /// The driver, a `FlareBackend` value (default `FLARE_BACKEND_SIMULATED`, as in
    /// the Rust API: set `FLARE_BACKEND_CUDA` for real memory).
    pub backend: u32,
    /// CUDA device ordinal whose memory the pool allocates (default 0; negative is
    /// `FLARE_STATUS_INVALID_ARGUMENT`).
    pub device: i32,
    /// Reuse policy, a `FlareReusePolicy` value (default `FLARE_REUSE_BEST_FIT`).
    pub reuse_policy: u32,
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
    /// `FLARE_REUSE_BEST_FIT` only: the largest excess of an idle mapping over the
    /// rounded request that a reuse accepts, percent of the request (100: up to twice
    /// the size). `flare_pool_config_init` writes the default, 30 (chosen by
    /// replaying real traces, BENCHMARKS.md); 0 is also taken as that default (a
    /// bound of 0% is `FLARE_REUSE_EXACT`). Added in 0.1.0 after `sim_device_count`,
    /// in what was the struct's tail padding (`sizeof` stays 64): a caller compiled
    /// with an older header must have initialised or zeroed the whole struct.
    pub best_fit_max_waste_percent: u32,
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

/// What `flare_pool_destroy_report` released: the allocations that were still live
/// when the pool was destroyed (a leak on the caller's side, or a deliberate
/// teardown), and everything the pool held.
///
/// Versioning: as for `FlareSnapshot`, the caller sets `struct_size` to
/// `sizeof(FlareDestroyReport)`; only the fields lying wholly inside `struct_size`
/// bytes are written, `struct_size` itself is left as it is. It must cover at least
/// `struct_size` and `scope_was_open` (8 bytes) and be at most 4096.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlareDestroyReport {
    /// `sizeof(FlareDestroyReport)`, bytes; set by the caller.
    pub struct_size: u32,
    /// 1 when a retention scope was still open (the destroy closed it), else 0.
    pub scope_was_open: u32,
    /// Allocations still live, released with the pool.
    pub live_count: u64,
    /// Bytes the callers had asked for, summed over those allocations (not rounded).
    pub live_requested_bytes: u64,
    /// Bytes mapped for those allocations (rounded to the mappings' sizes).
    pub live_mapped_bytes: u64,
    /// Physical bytes the pool held on the device (live, idle and pending), all
    /// released, unless the status is `FLARE_STATUS_DRIVER_ERROR`: then what the
    /// driver refused is left to it.
    pub physical_bytes: u64,
}

// The layouts the C tests assert too (`sizeof` 64, 240 and 40 on 64-bit targets).
const _: () = assert!(size_of::<FlareStatus>() == 4 && size_of::<FlareBackend>() == 4);
const _: () = assert!(size_of::<FlareReusePolicy>() == 4 && size_of::<FlareDriverCall>() == 4);
const _: () = assert!(size_of::<FlareSnapshot>() == 8 + 29 * 8);
const _: () = assert!(size_of::<FlarePoolConfig>() == 64);
const _: () = assert!(size_of::<FlareDestroyReport>() == 8 + 4 * 8);

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
            backend: FlareBackend::FLARE_BACKEND_SIMULATED as u32,
            device: 0,
            reuse_policy: FlareReusePolicy::FLARE_REUSE_BEST_FIT as u32,
            release_threshold_bytes: 0,
            peer_devices: ptr::null(),
            peer_device_count: 0,
            sim_capacity_bytes: 0,
            sim_granularity_bytes: 0,
            sim_device_count: 0,
            best_fit_max_waste_percent: DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
        }
    }

    fn field_ends() -> [usize; 11] {
        field_ends!(FlarePoolConfig; struct_size, backend, device, reuse_policy,
            release_threshold_bytes, peer_devices, peer_device_count, sim_capacity_bytes,
            sim_granularity_bytes, sim_device_count, best_fit_max_waste_percent)
    }
}

impl FlareDestroyReport {
    fn default_for_layout() -> Self {
        FlareDestroyReport::default()
    }

    fn field_ends() -> [usize; 6] {
        field_ends!(FlareDestroyReport; struct_size, scope_was_open, live_count,
            live_requested_bytes, live_mapped_bytes, physical_bytes)
    }

    /// What destroying a pool in state `s` releases.
    fn before_destroy(s: &Snapshot) -> Self {
        FlareDestroyReport {
            struct_size: size_of::<FlareDestroyReport>() as u32,
            scope_was_open: u32::from(s.scope_open),
            live_count: s.live_count,
            live_requested_bytes: s.live_requested_bytes,
            live_mapped_bytes: s.live_mapped_bytes,
            physical_bytes: s.physical_bytes,
        }
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
        Error::RequestTooLarge { .. } => FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE,
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

/// The boundary of every function on a pool (all but create and destroy): a NULL
/// pool is `FLARE_STATUS_INVALID_ARGUMENT`; a poisoned pool is refused with
/// `FLARE_STATUS_INTERNAL`; otherwise runs `f` as [`boundary`] does, and a panic in it
/// poisons the pool.
fn pool_boundary(
    name: &'static str,
    pool: Result<&FlarePool, Error>,
    f: impl FnOnce(&FlarePool) -> Result<(), Error>,
) -> FlareStatus {
    let pool = match pool {
        Ok(pool) => pool,
        Err(e) => return boundary(name, || Err(e)),
    };
    if let Some(cause) = pool.poisoned.get() {
        set_last_error(format!(
            "{name}: the pool is poisoned: a panic was caught in an earlier call on it \
             ({cause}), so its books may be half-updated; every call on it but \
             flare_pool_destroy returns FLARE_STATUS_INTERNAL"
        ));
        return FlareStatus::FLARE_STATUS_INTERNAL;
    }
    match catch_unwind(AssertUnwindSafe(|| f(pool))) {
        Ok(result) => boundary(name, || result),
        Err(payload) => {
            let text = panic_text(&*payload).to_owned();
            set_last_error(format!(
                "{name}: internal error (a panic was caught at the C boundary): {text}; \
                 the pool is now poisoned: every later call on it but flare_pool_destroy \
                 returns FLARE_STATUS_INTERNAL"
            ));
            let _ = pool.poisoned.set(format!("{name}: {text}"));
            FlareStatus::FLARE_STATUS_INTERNAL
        }
    }
}

/// [`boundary`] for a check that yields a value: the value, or the status (the
/// message recorded).
fn boundary_value<T>(
    name: &'static str,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, FlareStatus> {
    let mut value = None;
    let status = boundary(name, || {
        value = Some(f()?);
        Ok(())
    });
    value.ok_or(status)
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

fn reuse_policy_from(raw: u32) -> Result<ReusePolicy, Error> {
    match raw {
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
    let backend = match c.backend {
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
        best_fit_max_waste_percent: match c.best_fit_max_waste_percent {
            0 => DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
            n => n,
        },
    })
}

/// Fills the caller's configuration with the defaults. Call it as
/// `flare_pool_config_init(&cfg, sizeof cfg)`: `config_size` is the size of the
/// caller's struct. Defaults: `struct_size = min(config_size,
/// sizeof(FlarePoolConfig))`, `FLARE_BACKEND_SIMULATED` (set `FLARE_BACKEND_CUDA` for
/// real memory), device 0, `FLARE_REUSE_BEST_FIT`, release threshold 0, no peers,
/// simulated capacity, granularity and device count 0 (their defaults: 140 GiB,
/// 2 MiB, 1 device), best-fit waste bound 30%.
///
/// Writes at most `config_size` bytes: only the fields lying wholly inside the first
/// `config_size` bytes (and inside this library's struct) are written, so an older
/// caller's smaller struct is never overrun, and the bytes of a newer caller's larger
/// struct past this library's fields are left as they are (a create by this library
/// does not read them). Padding between the written fields is zeroed. NULL, a
/// misaligned pointer or a `config_size` below 4: nothing is written. Thread-safe.
///
/// # Safety
/// `config` is NULL or points to at least `config_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_config_init(config: *mut FlarePoolConfig, config_size: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if config.is_null() || !config.is_aligned() {
            return;
        }
        let size = config_size.min(size_of::<FlarePoolConfig>());
        let Some(prefix) = FlarePoolConfig::field_ends()
            .into_iter()
            .filter(|&end| end <= size)
            .max()
        else {
            return;
        };
        let mut defaults = std::mem::MaybeUninit::<FlarePoolConfig>::zeroed();
        // SAFETY: all-zero bytes are a valid `FlarePoolConfig` (integers and a NULL
        // pointer).
        let d = unsafe { defaults.assume_init_mut() };
        // Field by field, so that the padding stays zero.
        let FlarePoolConfig {
            backend,
            device,
            reuse_policy,
            release_threshold_bytes,
            peer_devices,
            peer_device_count,
            sim_capacity_bytes,
            sim_granularity_bytes,
            sim_device_count,
            best_fit_max_waste_percent,
            struct_size: _,
        } = FlarePoolConfig::default_for_layout();
        d.struct_size = size as u32; // at most size_of::<FlarePoolConfig>()
        d.backend = backend;
        d.device = device;
        d.reuse_policy = reuse_policy;
        d.release_threshold_bytes = release_threshold_bytes;
        d.peer_devices = peer_devices;
        d.peer_device_count = peer_device_count;
        d.sim_capacity_bytes = sim_capacity_bytes;
        d.sim_granularity_bytes = sim_granularity_bytes;
        d.sim_device_count = sim_device_count;
        d.best_fit_max_waste_percent = best_fit_max_waste_percent;
        // SAFETY: the caller guarantees `config_size >= prefix` writable bytes at
        // `config`; `defaults` has `size_of::<FlarePoolConfig>() >= prefix` initialised
        // bytes (zeroed, then whole fields written) and is a separate local.
        unsafe {
            ptr::copy_nonoverlapping(defaults.as_ptr().cast::<u8>(), config.cast::<u8>(), prefix)
        };
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
        let pool = Box::new(FlarePool::new(Pool::new(config)?));
        // SAFETY: non-NULL, aligned, and writable by the caller's contract.
        unsafe { out_pool.write(Box::into_raw(pool)) };
        Ok(())
    })
}

/// Releases everything the pool holds, live allocations included (one synchronize,
/// then unmap, release and free each mapping, refused steps retried once), and frees
/// the pool. `pool` is invalid afterwards, whatever the status.
///
/// Live allocations are a leak on the caller's side (or a deliberate teardown): when
/// there were any, the thread's last error message says how many and how many bytes
/// were released (`"flare_pool_destroy: released 2 live allocation(s): 3145729 bytes
/// requested, 6291456 bytes (6.0 MiB) mapped"`), even on success (the only success
/// that sets the message). `flare_pool_destroy_report` gives the same figures as
/// numbers.
///
/// A poisoned pool (a panic was caught in an earlier call on it) is destroyed all the
/// same: what its books name is released.
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
    // SAFETY: by the caller's contract.
    unsafe { destroy("flare_pool_destroy", pool, |_| {}) }
}

/// `flare_pool_destroy`, and writes what it released to `*out_report`: the live
/// allocations (count, requested and mapped bytes), whether a scope was open, and the
/// physical bytes the pool held. The caller sets `out_report->struct_size` first
/// (`sizeof(FlareDestroyReport)`).
///
/// The report is written whenever the pool was destroyed: on `FLARE_STATUS_SUCCESS`
/// and on `FLARE_STATUS_DRIVER_ERROR` (the pool is freed then too). `pool` NULL:
/// `FLARE_STATUS_SUCCESS` and an all-zero report (nothing released).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL or misaligned `out_report` or a
/// bad `struct_size`: nothing is written, and the pool is NOT destroyed (it stays
/// usable); `FLARE_STATUS_DRIVER_ERROR` as for `flare_pool_destroy`.
///
/// Threading: must not run concurrently with any other call on this pool.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed;
/// `out_report` is NULL or points to at least `out_report->struct_size` writable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_destroy_report(
    pool: *mut FlarePool,
    out_report: *mut FlareDestroyReport,
) -> FlareStatus {
    const NAME: &str = "flare_pool_destroy_report";
    let prefix = boundary_value(NAME, || {
        if out_report.is_null() {
            return Err(null_error("out_report"));
        }
        if !out_report.is_aligned() {
            return Err(Error::InvalidArgument("out_report is misaligned".into()));
        }
        // SAFETY: non-NULL and aligned; every caller's struct has at least its first
        // field.
        let struct_size = unsafe { ptr::addr_of!((*out_report).struct_size).read() };
        struct_prefix::<FlareDestroyReport>(
            "report",
            struct_size,
            &FlareDestroyReport::field_ends(),
        )
    });
    let prefix = match prefix {
        Ok(prefix) => prefix,
        Err(status) => return status,
    };
    let write = |report: &FlareDestroyReport| {
        // SAFETY: `out_report` is non-NULL, aligned and has `struct_size >= prefix`
        // writable bytes (checked above, by the caller's contract); `report` has no
        // padding and `size_of::<FlareDestroyReport>() >= prefix` bytes; the prefix
        // ends on a field boundary; `struct_size` stays the caller's.
        unsafe { write_prefix(report, out_report, prefix) }
    };
    if pool.is_null() {
        write(&FlareDestroyReport::default());
        return FlareStatus::FLARE_STATUS_SUCCESS;
    }
    // SAFETY: by the caller's contract.
    unsafe { destroy(NAME, pool, write) }
}

/// Copies the first `prefix` bytes of `value` to `out`, except its leading `u32`
/// (`struct_size`, which stays the caller's).
///
/// # Safety
/// `out` is non-NULL, aligned and has at least `prefix` writable bytes; `T` has no
/// padding, starts with a `u32` and `prefix` is at most `size_of::<T>()`, at least 4,
/// on a field boundary.
unsafe fn write_prefix<T>(value: &T, out: *mut T, prefix: usize) {
    let skip = size_of::<u32>();
    // SAFETY: by this function's contract; `value` is a separate Rust value.
    unsafe {
        ptr::copy_nonoverlapping(
            ptr::from_ref(value).cast::<u8>().add(skip),
            out.cast::<u8>().add(skip),
            prefix - skip,
        )
    };
}

/// Destroys `pool` (non-NULL is not required: NULL is a no-op success); `report`
/// receives what was released whenever the pool was freed.
///
/// # Safety
/// `pool` is NULL or was returned by `flare_pool_create` and not yet destroyed, and
/// no other call on it runs concurrently.
unsafe fn destroy(
    name: &'static str,
    pool: *mut FlarePool,
    report: impl FnOnce(&FlareDestroyReport),
) -> FlareStatus {
    if pool.is_null() {
        return FlareStatus::FLARE_STATUS_SUCCESS;
    }
    // SAFETY: non-NULL and, by the caller's contract, the `Box<FlarePool>` that
    // `flare_pool_create` leaked, not yet destroyed and not in use elsewhere.
    let FlarePool { pool, .. } = *unsafe { Box::from_raw(pool) };
    // The counters before the release (no other call runs now): what is released.
    // A poisoned pool is destroyed all the same, from its books as they are.
    let released = FlareDestroyReport::before_destroy(&pool.snapshot());
    let leaked = (released.live_count > 0).then(|| {
        format!(
            "released {} live allocation(s): {} bytes requested, {} bytes ({}) mapped",
            released.live_count,
            released.live_requested_bytes,
            released.live_mapped_bytes,
            fmt_bytes(released.live_mapped_bytes)
        )
    });
    let status = boundary(name, || pool.destroy());
    if status == FlareStatus::FLARE_STATUS_SUCCESS
        || status == FlareStatus::FLARE_STATUS_DRIVER_ERROR
    {
        report(&released);
    }
    if let Some(leaked) = leaked {
        if status == FlareStatus::FLARE_STATUS_SUCCESS {
            set_last_error(format!("{name}: {leaked}"));
        } else {
            // Keep the failure's message first, then what was live.
            let _ = LAST_ERROR.try_with(|m| {
                if let Ok(mut m) = m.try_borrow_mut() {
                    m.push_str("; ");
                    m.push_str(&leaked);
                }
            });
        }
    }
    status
}

/// Allocates `size` bytes of device memory and writes its device address
/// (a `CUdeviceptr`, aligned to the granularity) to `*out_ptr`.
///
/// The size is rounded up to the granularity (2 MiB on an H200). An idle mapping that
/// fits under the reuse policy is taken with no driver call; otherwise a new mapping is
/// created (create, reserve, map, set access).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL argument or a size of 0 (or one
/// whose rounding overflows); `FLARE_STATUS_REQUEST_TOO_LARGE` when the rounded size
/// is more than the device's total memory (refused at once, nothing counted);
/// `FLARE_STATUS_OUT_OF_MEMORY` when the device is full now;
/// `FLARE_STATUS_DRIVER_ERROR` for another failed driver call (nothing leaked; the
/// pool stays usable); `FLARE_STATUS_INTERNAL` on a poisoned pool.
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
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_package_allocate",
        unsafe { pool_ref(pool) },
        |pool| {
            if out_ptr.is_null() {
                return Err(null_error("out_ptr"));
            }
            if !out_ptr.is_aligned() {
                return Err(Error::InvalidArgument("out_ptr is misaligned".into()));
            }
            let result = pool.pool.allocate_raw(size as u64);
            pool.injected_panic_point();
            let ptr = result?;
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
        },
    )
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
    // SAFETY: by the caller's contract.
    pool_boundary("flare_package_free", unsafe { pool_ref(pool) }, |pool| {
        if ptr.is_null() {
            return Ok(());
        }
        let result = pool.pool.free_raw(ptr as usize as u64);
        pool.injected_panic_point();
        result
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
    // SAFETY: by the caller's contract.
    pool_boundary("flare_retention_begin", unsafe { pool_ref(pool) }, |pool| {
        let result = pool.pool.retention_begin();
        pool.injected_panic_point();
        result
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
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_retention_finish",
        unsafe { pool_ref(pool) },
        |pool| {
            let result = pool.pool.retention_finish();
            pool.injected_panic_point();
            result
        },
    )
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
    // SAFETY: by the caller's contract.
    pool_boundary("flare_retention_abort", unsafe { pool_ref(pool) }, |pool| {
        let result = pool.pool.retention_abort();
        pool.injected_panic_point();
        result
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
    // SAFETY: by the caller's contract.
    pool_boundary("flare_pool_trim", unsafe { pool_ref(pool) }, |pool| {
        let result = pool.pool.trim();
        pool.injected_panic_point();
        result
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
    // SAFETY: by the caller's contract.
    pool_boundary("flare_pool_snapshot", unsafe { pool_ref(pool) }, |pool| {
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
        pool.injected_panic_point();
        // SAFETY: `out` is non-NULL and aligned, and the caller's struct has
        // `struct_size >= prefix` writable bytes; `FlareSnapshot` has no padding and
        // starts with `struct_size`, and the prefix (at least 8) ends on a field
        // boundary, at most its size.
        unsafe { write_prefix(&snap, out, prefix) };
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
        9 => c"FLARE_STATUS_REQUEST_TOO_LARGE",
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
/// the failure), except a destroy that released live allocations, which records what
/// it released. Empty (returns 0) before any failure on this thread. `buf` NULL or
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
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_sim_inject_failure",
        unsafe { pool_ref(pool) },
        |pool| {
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
            pool.injected_panic_point();
            Ok(())
        },
    )
}

/// Simulated backend only: makes the next call on this pool panic inside the
/// library, as a bug would, once its pool operation is done and before it writes its
/// outputs (an allocation is made but its pointer not returned, a free is done, a
/// snapshot is taken but not copied). For testing how a caller copes with
/// `FLARE_STATUS_INTERNAL`: that call returns it, and the pool is then poisoned
/// (every later call on it returns it, and says so); `flare_pool_destroy` still
/// releases what the pool holds, the allocation the panicking call made included.
/// `flare_pool_destroy` itself never fires the injected panic.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL pool;
/// `FLARE_STATUS_NOT_SUPPORTED` on a CUDA pool; `FLARE_STATUS_INTERNAL` on a poisoned
/// pool. Thread-safe (the next call on any thread panics).
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_sim_inject_panic(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: by the caller's contract.
    pool_boundary(
        "flare_sim_inject_panic",
        unsafe { pool_ref(pool) },
        |pool| {
            if pool.pool.sim_driver().is_none() {
                return Err(Error::NotSupported(
                    "panic injection needs a simulated pool",
                ));
            }
            pool.panic_next.store(true, Ordering::Relaxed);
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn last_error() -> String {
        let mut buf = [0 as c_char; 1024];
        // SAFETY: `buf` has 1024 writable bytes.
        unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: flare_last_error_message NUL-terminated it.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    fn config() -> FlarePoolConfig {
        let mut c = FlarePoolConfig::default_for_layout();
        // SAFETY: `c` is a whole, writable FlarePoolConfig.
        unsafe { flare_pool_config_init(&mut c, size_of::<FlarePoolConfig>()) };
        c
    }

    fn create(c: &FlarePoolConfig) -> *mut FlarePool {
        let mut pool = ptr::null_mut();
        // SAFETY: `c` is a valid config of `struct_size` bytes, `pool` writable.
        let status = unsafe { flare_pool_create(c, &mut pool) };
        assert_eq!(
            status,
            FlareStatus::FLARE_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        pool
    }

    fn snap(pool: *const FlarePool) -> FlareSnapshot {
        let mut s = FlareSnapshot {
            struct_size: size_of::<FlareSnapshot>() as u32,
            ..FlareSnapshot::default()
        };
        // SAFETY: `pool` is live; `s` is a whole FlareSnapshot.
        let status = unsafe { flare_pool_snapshot(pool, &mut s) };
        assert_eq!(
            status,
            FlareStatus::FLARE_STATUS_SUCCESS,
            "{}",
            last_error()
        );
        s
    }

    fn allocate(pool: *mut FlarePool, size: usize) -> (FlareStatus, *mut c_void) {
        let mut p = 0x5e5e as *mut c_void;
        // SAFETY: `pool` is live (or poisoned, still allocated); `p` is writable.
        let status = unsafe { flare_package_allocate(pool, size, &mut p) };
        (status, p)
    }

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
        // best_fit_max_waste_percent (4 bytes at 60) fills what was the tail padding.
        assert_eq!(*ends.last().unwrap_or(&0), 64);
        assert_eq!(size_of::<FlarePoolConfig>(), 64);
        assert_eq!(
            struct_prefix::<FlarePoolConfig>("c", 64, &ends).ok(),
            Some(64)
        );
        // An older caller whose struct ended with sim_device_count (at 60).
        assert_eq!(
            struct_prefix::<FlarePoolConfig>("c", 60, &ends).ok(),
            Some(60)
        );
        // peer_device_count ends at 36; 40 has padding, then sim_capacity_bytes.
        assert_eq!(
            struct_prefix::<FlarePoolConfig>("c", 40, &ends).ok(),
            Some(36)
        );
        let ends = FlareDestroyReport::field_ends();
        assert_eq!(ends, [4, 8, 16, 24, 32, 40]);
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
        let status = boundary("flare_test", || {
            Err(Error::RequestTooLarge {
                requested: 2 << 30,
                device_total: 1 << 30,
            })
        });
        assert_eq!(status, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
        let status = boundary("flare_test", || Err(Error::NoDriver("x".into())));
        assert_eq!(status, FlareStatus::FLARE_STATUS_NO_DRIVER);
        // SAFETY: NULL with length 0 writes nothing.
        let n = unsafe { flare_last_error_message(ptr::null_mut(), 0) };
        assert_eq!(n, "flare_test: no CUDA driver: x".len());
    }

    #[test]
    fn status_names_match_the_enum() {
        // The contract's numbers and names, written out here rather than derived from
        // the enum, for every status and a few values outside it.
        let table: [(u32, &str); 13] = [
            (0, "FLARE_STATUS_SUCCESS"),
            (1, "FLARE_STATUS_INVALID_ARGUMENT"),
            (2, "FLARE_STATUS_OUT_OF_MEMORY"),
            (3, "FLARE_STATUS_NOT_SUPPORTED"),
            (4, "FLARE_STATUS_UNKNOWN_POINTER"),
            (5, "FLARE_STATUS_SCOPE_STATE"),
            (6, "FLARE_STATUS_DRIVER_ERROR"),
            (7, "FLARE_STATUS_NO_DRIVER"),
            (8, "FLARE_STATUS_INTERNAL"),
            (9, "FLARE_STATUS_REQUEST_TOO_LARGE"),
            (10, "FLARE_STATUS_UNRECOGNIZED"),
            (0x8000_0000, "FLARE_STATUS_UNRECOGNIZED"),
            (u32::MAX, "FLARE_STATUS_UNRECOGNIZED"),
        ];
        for (value, name) in table {
            // SAFETY: flare_status_name returns a static NUL-terminated string.
            let got = unsafe { CStr::from_ptr(flare_status_name(RawStatus(value))) };
            assert_eq!(got.to_str().ok(), Some(name), "status {value}");
        }
        // The enum's discriminants are the contract's numbers.
        use FlareStatus as S;
        let variants = [
            S::FLARE_STATUS_SUCCESS,
            S::FLARE_STATUS_INVALID_ARGUMENT,
            S::FLARE_STATUS_OUT_OF_MEMORY,
            S::FLARE_STATUS_NOT_SUPPORTED,
            S::FLARE_STATUS_UNKNOWN_POINTER,
            S::FLARE_STATUS_SCOPE_STATE,
            S::FLARE_STATUS_DRIVER_ERROR,
            S::FLARE_STATUS_NO_DRIVER,
            S::FLARE_STATUS_INTERNAL,
            S::FLARE_STATUS_REQUEST_TOO_LARGE,
        ];
        for (i, v) in variants.into_iter().enumerate() {
            assert_eq!(v as u32, i as u32);
            assert_eq!(format!("{v:?}"), table[i].1);
        }
    }

    /// A buffer a config is initialised into, aligned like the struct.
    #[repr(C, align(8))]
    struct Buf([u8; 128]);

    fn init_into(config_size: usize) -> Buf {
        let mut buf = Buf([0xcd; 128]);
        // SAFETY: `buf` has 128 >= config_size writable bytes, aligned to 8.
        unsafe { flare_pool_config_init(buf.0.as_mut_ptr().cast(), config_size) };
        buf
    }

    fn u32_at(b: &Buf, at: usize) -> u32 {
        u32::from_ne_bytes([b.0[at], b.0[at + 1], b.0[at + 2], b.0[at + 3]])
    }

    #[test]
    fn config_init_writes_at_most_config_size_bytes() {
        // The C layout on a 64-bit target, by hand: struct_size 0..4, backend 4..8,
        // device 8..12, reuse_policy 12..16, release_threshold_bytes 16..24,
        // peer_devices 24..32, peer_device_count 32..36, padding 36..40,
        // sim_capacity_bytes 40..48, sim_granularity_bytes 48..56, sim_device_count
        // 56..60, best_fit_max_waste_percent 60..64.
        for size in [0, 1, 3] {
            assert!(init_into(size).0.iter().all(|&b| b == 0xcd), "size {size}");
        }
        // Only struct_size fits.
        let b = init_into(7);
        assert_eq!(u32_at(&b, 0), 7);
        assert!(b.0[4..].iter().all(|&x| x == 0xcd));
        // struct_size, backend (simulated = 1), device 0.
        let b = init_into(12);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (12, 1, 0));
        assert!(b.0[12..].iter().all(|&x| x == 0xcd));
        // Up to peer_device_count: the padding after it is not the caller's field and
        // lies past the last whole field, so it is left alone too.
        let b = init_into(40);
        assert_eq!(u32_at(&b, 0), 40);
        assert!(b.0[12..36].iter().all(|&x| x == 0));
        assert!(b.0[36..].iter().all(|&x| x == 0xcd));
        // An older caller whose struct ended with sim_device_count.
        let b = init_into(60);
        assert_eq!(u32_at(&b, 0), 60);
        assert!(b.0[36..60].iter().all(|&x| x == 0), "padding zeroed");
        assert!(b.0[60..].iter().all(|&x| x == 0xcd));
        // This header's struct, and a newer caller's larger one: 64 bytes written,
        // struct_size says 64, the rest untouched.
        for size in [64, 100, 128] {
            let b = init_into(size);
            assert_eq!(u32_at(&b, 0), 64, "size {size}");
            assert_eq!(u32_at(&b, 12), 0, "best fit");
            assert_eq!(u32_at(&b, 60), 30, "the default waste bound");
            assert!(b.0[64..].iter().all(|&x| x == 0xcd), "size {size}");
        }
        // NULL is a no-op.
        // SAFETY: NULL is allowed.
        unsafe { flare_pool_config_init(ptr::null_mut(), 64) };
        // What an older caller initialised creates a pool with the defaults.
        let b = init_into(40);
        let mut older = FlarePoolConfig::default_for_layout();
        // SAFETY: both are 64 bytes; every byte pattern is a valid FlarePoolConfig.
        unsafe {
            ptr::copy_nonoverlapping(b.0.as_ptr(), ptr::addr_of_mut!(older).cast::<u8>(), 64)
        };
        let pool = create(&older);
        assert_eq!(snap(pool).granularity_bytes, 2 * MIB);
        // SAFETY: `pool` is live.
        assert_eq!(
            unsafe { flare_pool_destroy(pool) },
            FlareStatus::FLARE_STATUS_SUCCESS
        );
    }

    /// Inside a scope: 4 MiB allocated and freed (retained idle), then 2 MiB asked
    /// for. The idle mapping exceeds the request by 2 MiB, 100% of it: reused under a
    /// bound of 100%, not under the default 30%. Returns the reuse hits.
    fn reuse_hits_with_waste_percent(percent: u32) -> u64 {
        let mut c = config();
        c.best_fit_max_waste_percent = percent;
        let pool = create(&c);
        // SAFETY: `pool` is live throughout.
        unsafe {
            assert_eq!(
                flare_retention_begin(pool),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            let (st, p) = allocate(pool, 4 * MIB as usize);
            assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
            assert_eq!(
                flare_package_free(pool, p),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            let (st, q) = allocate(pool, 2 * MIB as usize);
            assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
            assert_eq!(
                flare_package_free(pool, q),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            let hits = snap(pool).reuse_hits;
            assert_eq!(flare_pool_destroy(pool), FlareStatus::FLARE_STATUS_SUCCESS);
            hits
        }
    }

    #[test]
    fn config_best_fit_waste_bound_is_read() {
        assert_eq!(config().best_fit_max_waste_percent, 30);
        assert_eq!(reuse_hits_with_waste_percent(100), 1);
        assert_eq!(reuse_hits_with_waste_percent(99), 0);
        assert_eq!(reuse_hits_with_waste_percent(30), 0);
        // 0: the default (30%), not "no waste at all".
        assert_eq!(reuse_hits_with_waste_percent(0), 0);
    }

    #[test]
    fn request_too_large_is_not_out_of_memory() {
        let mut c = config();
        c.sim_capacity_bytes = 1 << 30;
        let pool = create(&c);
        let before = snap(pool);
        let (st, p) = allocate(pool, (1 << 30) + 1);
        assert_eq!(st, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
        assert_eq!(p, 0x5e5e as *mut c_void, "no output on failure");
        assert!(
            last_error().contains("request too large"),
            "{}",
            last_error()
        );
        assert_eq!(snap(pool), before, "nothing counted");
        // The whole device is not too large: with 2 MiB live, it is full now.
        let (st, live) = allocate(pool, 1);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        let (st, _) = allocate(pool, 1 << 30);
        assert_eq!(st, FlareStatus::FLARE_STATUS_OUT_OF_MEMORY);
        // SAFETY: `pool` is live, `live` its allocation.
        unsafe {
            assert_eq!(
                flare_package_free(pool, live),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            let (st, whole) = allocate(pool, 1 << 30);
            assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
            assert_eq!(
                flare_package_free(pool, whole),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            assert_eq!(flare_pool_destroy(pool), FlareStatus::FLARE_STATUS_SUCCESS);
        }
    }

    #[test]
    fn cuda_backend_with_a_negative_device_is_an_invalid_argument() {
        let mut c = config();
        c.backend = FlareBackend::FLARE_BACKEND_CUDA as u32;
        c.device = -1;
        let mut pool = 0x5e5e as *mut FlarePool;
        // SAFETY: `c` is a valid config, `pool` writable.
        let st = unsafe { flare_pool_create(&c, &mut pool) };
        assert_eq!(
            st,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "{}",
            last_error()
        );
        assert!(last_error().contains("device ordinal -1 is negative"));
        assert_eq!(pool, 0x5e5e as *mut FlarePool);
    }

    fn destroy_report(pool: *mut FlarePool) -> (FlareStatus, FlareDestroyReport) {
        let mut r = FlareDestroyReport {
            struct_size: size_of::<FlareDestroyReport>() as u32,
            ..FlareDestroyReport::default()
        };
        // SAFETY: `pool` is NULL or live; `r` is a whole report.
        let st = unsafe { flare_pool_destroy_report(pool, &mut r) };
        (st, r)
    }

    #[test]
    fn destroy_reports_the_live_allocations_it_released() {
        let mut c = config();
        c.release_threshold_bytes = 64 * MIB;
        let pool = create(&c);
        let sim = snap_sim(pool);
        // Two live (1 B and 3 MiB: 2 + 4 MiB mapped), one cached idle (2 MiB).
        let (_, a) = allocate(pool, 1);
        let (_, b) = allocate(pool, 3 * MIB as usize);
        let (_, idle) = allocate(pool, 2 * MIB as usize);
        // SAFETY: `pool` is live, `idle` its allocation; NULL report is refused.
        unsafe {
            assert_eq!(
                flare_package_free(pool, idle),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            assert_eq!(
                flare_retention_begin(pool),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            // A NULL report is refused and destroys nothing.
            assert_eq!(
                flare_pool_destroy_report(pool, ptr::null_mut()),
                FlareStatus::FLARE_STATUS_INVALID_ARGUMENT
            );
        }
        let mut bad = FlareDestroyReport {
            struct_size: 4,
            ..FlareDestroyReport::default()
        };
        // SAFETY: `pool` is live; `bad` is writable.
        let st = unsafe { flare_pool_destroy_report(pool, &mut bad) };
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert_eq!(snap(pool).live_count, 2, "still usable");
        let (st, r) = destroy_report(pool);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!(
            r,
            FlareDestroyReport {
                struct_size: 40,
                scope_was_open: 1,
                live_count: 2,
                live_requested_bytes: 1 + 3 * MIB,
                live_mapped_bytes: 6 * MIB,
                physical_bytes: 8 * MIB,
            }
        );
        assert_eq!(
            last_error(),
            "flare_pool_destroy_report: released 2 live allocation(s): 3145729 bytes \
             requested, 6291456 bytes (6.0 MiB) mapped"
        );
        let d = sim.state();
        assert_eq!((d.handles, d.reservations, d.physical_bytes), (0, 0, 0));
        let _ = (a, b);
        // NULL pool: success, an all-zero report.
        let (st, r) = destroy_report(ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!((r.live_count, r.physical_bytes, r.struct_size), (0, 0, 40));
        // Plain destroy says it in the message too; nothing live, nothing said.
        let pool = create(&config());
        let (_, _p) = allocate(pool, 5 * MIB as usize);
        // SAFETY: `pool` is live.
        assert_eq!(
            unsafe { flare_pool_destroy(pool) },
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(
            last_error(),
            "flare_pool_destroy: released 1 live allocation(s): 5242880 bytes requested, \
             6291456 bytes (6.0 MiB) mapped"
        );
        let (st, _) = allocate(ptr::null_mut(), 1); // sets the message to something else
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        let before = last_error();
        let pool = create(&config());
        // SAFETY: `pool` is live.
        assert_eq!(
            unsafe { flare_pool_destroy(pool) },
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(
            last_error(),
            before,
            "a destroy with nothing live says nothing"
        );
    }

    /// The simulated driver under a C pool, kept to look at after destroy.
    fn snap_sim(pool: *const FlarePool) -> std::sync::Arc<crate::SimDriver> {
        // SAFETY: `pool` is live.
        let pool = unsafe { pool_ref(pool) }.unwrap_or_else(|e| panic!("{e}"));
        match pool.pool.sim_driver() {
            Some(sim) => sim.clone(),
            None => panic!("not a simulated pool"),
        }
    }

    #[test]
    fn a_panic_in_a_call_poisons_the_pool_and_destroy_still_releases() {
        let pool = create(&config());
        let sim = snap_sim(pool);
        let (st, a) = allocate(pool, 3 * MIB as usize);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        // SAFETY: `pool` is live (poisoned pools stay allocated until destroy).
        unsafe {
            assert_eq!(
                flare_sim_inject_panic(pool),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            // The panic fires after the allocation is made, before its pointer is
            // returned.
            let (st, b) = allocate(pool, MIB as usize);
            assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL);
            assert_eq!(b, 0x5e5e as *mut c_void, "no output");
            let msg = last_error();
            assert!(
                msg.starts_with("flare_package_allocate: internal error"),
                "{msg}"
            );
            assert!(msg.contains("injected by flare_sim_inject_panic"), "{msg}");
            assert!(msg.contains("poisoned"), "{msg}");
            // Every later call is refused, and says why.
            let mut s = FlareSnapshot {
                struct_size: size_of::<FlareSnapshot>() as u32,
                ..FlareSnapshot::default()
            };
            let refused = [
                flare_package_free(pool, a),
                flare_package_free(pool, ptr::null_mut()),
                allocate(pool, 1).0,
                flare_retention_begin(pool),
                flare_retention_finish(pool),
                flare_retention_abort(pool),
                flare_pool_trim(pool),
                flare_pool_snapshot(pool, &mut s),
                flare_sim_inject_failure(pool, RawDriverCall(0), 1, 2),
                flare_sim_inject_panic(pool),
            ];
            for (i, st) in refused.into_iter().enumerate() {
                assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL, "call {i}");
            }
            assert_eq!(s.live_count, 0, "the snapshot was not written");
            let msg = last_error();
            assert!(
                msg.starts_with("flare_sim_inject_panic: the pool is poisoned")
                    && msg.contains("flare_package_allocate: injected by flare_sim_inject_panic"),
                "{msg}"
            );
            // The driver holds both allocations (the panicking call's too).
            assert_eq!(sim.state().handles, 2);
        }
        // Destroy releases everything the pool holds, and reports both allocations.
        let (st, r) = destroy_report(pool);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS, "{}", last_error());
        assert_eq!((r.live_count, r.live_requested_bytes), (2, 4 * MIB));
        let d = sim.state();
        assert_eq!(
            (d.handles, d.reservations, d.mappings, d.physical_bytes),
            (0, 0, 0, 0),
            "destroy released what the driver held"
        );
        // Another pool is not affected.
        let other = create(&config());
        let (st, p) = allocate(other, 1);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        // SAFETY: `other` is live.
        unsafe {
            assert_eq!(
                flare_package_free(other, p),
                FlareStatus::FLARE_STATUS_SUCCESS
            );
            assert_eq!(flare_pool_destroy(other), FlareStatus::FLARE_STATUS_SUCCESS);
        }
    }

    #[test]
    fn panic_injection_needs_a_pool() {
        // SAFETY: NULL is allowed.
        let st = unsafe { flare_sim_inject_panic(ptr::null_mut()) };
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    }
}
