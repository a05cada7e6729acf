//! The C ABI's types: the enums (status, backend, reuse policy, cross-stream reuse,
//! driver call), the stream handle, the versioned structs (configuration, snapshot,
//! destroy report) with their layouts, and the `struct_size` prefix rule every
//! versioned struct follows.
//!
//! The enums and structs are generated ([`super::generate`]) from lists written once:
//! the status and backend values here, the reuse policies, cross-stream reuse modes,
//! driver calls and snapshot counters with the Rust types they mirror.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::size_of;
use std::ptr;

use super::boundary::check_out;
use super::generate::{c_enum, c_snapshot, versioned_struct};
use crate::driver::{driver_calls, DriverCall};
use crate::pool::{
    cross_stream_modes, reuse_policies, snapshot_counters, CrossStreamReuse, ReusePolicy, Snapshot,
    DEFAULT_BEST_FIT_MAX_WASTE_PERCENT, DEFAULT_THREAD_CACHE_BYTES, DEFAULT_THREAD_CACHE_ENTRIES,
};
use crate::Error;

c_enum! {
    /// The outcome of a call. The numbers are stable. On a status other than
    /// `FLARE_STATUS_SUCCESS`, `flare_last_error_message` gives the detail.
    pub enum FlareStatus from Error;
    /// The call did what it says; its outputs are written.
    FLARE_STATUS_SUCCESS = 0;
    /// A NULL pointer, a size of 0 bytes, a bad `struct_size`, an unknown enum value,
    /// a negative device ordinal. Nothing changed.
    FLARE_STATUS_INVALID_ARGUMENT = 1 <- InvalidArgument;
    /// The device has no room for the request now. Outside a retention scope the pool
    /// already released its idle mappings and retried once; inside one, nothing
    /// retained was released. Freeing memory can make the request succeed (a request
    /// that never can is `FLARE_STATUS_REQUEST_TOO_LARGE`).
    FLARE_STATUS_OUT_OF_MEMORY = 2 <- OutOfMemory;
    /// The operation is not available on this backend (fault injection on a CUDA
    /// pool).
    FLARE_STATUS_NOT_SUPPORTED = 3 <- NotSupported;
    /// The pointer was not handed out by this pool, is interior to an allocation, or
    /// was already freed. Nothing changed.
    FLARE_STATUS_UNKNOWN_POINTER = 4 <- UnknownPointer;
    /// A retention-scope call in the wrong state: begin while a scope is open,
    /// finish/abort with none open, trim inside a scope. Nothing changed.
    FLARE_STATUS_SCOPE_STATE = 5 <- ScopeState;
    /// A CUDA driver call failed; the message names the call, its `CUresult` and the
    /// size. The pool stays usable: what the driver refused to release is kept and
    /// retried at the next release point (finish, abort, trim, a free outside a
    /// scope).
    FLARE_STATUS_DRIVER_ERROR = 6 <- Driver;
    /// No CUDA driver could be loaded or initialised (libcuda absent, no device).
    FLARE_STATUS_NO_DRIVER = 7 <- NoDriver;
    /// A bug in the library (a panic caught at the C boundary). The message has the
    /// panic's text. The pool the call was on is poisoned: every later call on it
    /// returns this status too (the message says the pool is poisoned), except
    /// `flare_pool_destroy`, which still releases what the pool holds.
    FLARE_STATUS_INTERNAL = 8;
    /// The request, rounded up to the granularity, is more than the device's total
    /// memory: it can never succeed, whatever is freed. Refused at once: no driver
    /// call, nothing released, nothing counted.
    FLARE_STATUS_REQUEST_TOO_LARGE = 9 <- RequestTooLarge;
    /// A tag in the wrong state (issue 15): allocating or freeing with a tag that
    /// sleeps, sleeping a tag that sleeps, waking one that does not. Nothing changed.
    FLARE_STATUS_TAG_STATE = 10 <- TagState;
    /// A stream in the wrong state for the call (issue 34): forgetting a stream
    /// (`flare_pool_forget_stream`) while it is being captured. Nothing changed.
    FLARE_STATUS_STREAM_STATE = 11 <- StreamState;
}

c_enum! {
    /// The driver a pool runs on.
    pub enum FlareBackend;
    /// The real CUDA driver (libcuda.so.1, loaded at run time), device `device`.
    FLARE_BACKEND_CUDA = 0;
    /// A deterministic simulated device (no GPU needed), sized by `sim_capacity_bytes`
    /// and `sim_granularity_bytes`. Supports fault injection.
    FLARE_BACKEND_SIMULATED = 1;
}

c_enum! {
    /// What `flare_pool_sleep` does with the contents of a tag's live allocations.
    pub enum FlareSleepMode;
    /// Contents are lost: after `flare_pool_wake` every pointer is valid again with
    /// unspecified contents.
    FLARE_SLEEP_DISCARD = 0;
    /// Contents are copied to pinned host memory before the physical memory is
    /// released, and copied back at wake.
    FLARE_SLEEP_OFFLOAD = 1;
}

reuse_policies!(c_enum! {
    /// How a freed (idle) mapping is reused by a later allocation.
    pub enum FlareReusePolicy for ReusePolicy;
});

cross_stream_modes!(c_enum! {
    /// When memory freed on one stream (`flare_package_free_async`) may be handed to
    /// an allocation on another (`flare_package_allocate_async`), the
    /// `cross_stream_reuse` field of `FlarePoolConfig`. Memory freed on the allocating
    /// stream itself is always reused at once: stream order makes it safe. The
    /// numbers are stable; 0 is the default, so a zeroed field means it.
    pub enum FlareCrossStreamReuse for CrossStreamReuse;
});

driver_calls!(c_enum! {
    /// The driver calls a pool makes, for `flare_sim_inject_failure`. The numbers are
    /// stable.
    pub enum FlareDriverCall for DriverCall;
});

/// A CUDA stream as C passes it: a `CUstream` (or a runtime `cudaStream_t`, the same
/// handle), never dereferenced by the library. NULL is the legacy default stream of
/// the current context (as `CU_STREAM_LEGACY`, 1, is too); `CU_STREAM_PER_THREAD` (2)
/// and created streams are passed through unchanged. On the simulated backend, a
/// handle from `flare_sim_stream_create`, or NULL.
pub type FlareStream = *mut c_void;

/// A `FlareStatus` as C passes it: read as its integer so that any value is
/// defined. Rendered as `FlareStatus` in the header.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStatus(pub u32);

/// A `FlareSleepMode` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSleepMode(pub u32);

/// A `FlareDriverCall` as C passes it (see [`RawStatus`]).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDriverCall(pub u32);

versioned_struct! {
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
        /// At least one granule (`sim_granularity_bytes`), else
        /// `FLARE_STATUS_INVALID_ARGUMENT`: a smaller device could never hold a mapping.
        pub sim_capacity_bytes: u64,
        /// Simulated backend: allocation granularity, bytes (0: the default, 2 MiB, as
        /// measured on an H200). Must be a power of two.
        pub sim_granularity_bytes: u64,
        /// Simulated backend: number of devices of the simulated machine (ordinals
        /// `0..sim_device_count`; 0: the default, 1; at most 128). `device` and every
        /// peer must be below it, as on a real machine, else
        /// `FLARE_STATUS_INVALID_ARGUMENT` (also for more than 128). Added in
        /// 0.1.0 after the fields above; an older caller's `struct_size` leaves it at
        /// its default.
        pub sim_device_count: u32,
        /// `FLARE_REUSE_BEST_FIT` only: the largest excess of an idle mapping over the
        /// rounded request that a reuse accepts, percent of the request (100: up to twice
        /// the size). `flare_pool_config_init` writes the default, 30 (chosen by
        /// replaying real traces, BENCHMARKS.md); 0 is also taken as that default (a
        /// bound of 0% is `FLARE_REUSE_EXACT`). Added in 0.1.0 after `sim_device_count`,
        /// in what was the struct's tail padding (`sizeof` stayed 64): a caller compiled
        /// with an older header must have initialised or zeroed the whole struct.
        pub best_fit_max_waste_percent: u32,
        /// When memory freed on one stream may serve an allocation on another, a
        /// `FlareCrossStreamReuse` value (default, and 0,
        /// `FLARE_CROSS_STREAM_WHEN_COMPLETE`; an unknown value is
        /// `FLARE_STATUS_INVALID_ARGUMENT`). Only the stream-ordered calls
        /// (`flare_package_allocate_async`, `flare_package_free_async`) use it. Added
        /// in 0.1.0 after `best_fit_max_waste_percent` (`sizeof` grew from 64 to 72):
        /// an older caller's `struct_size` of 64 leaves it at its default.
        pub cross_stream_reuse: u32,
        /// `FLARE_REUSE_SEGMENTS` only: a request of more than this many bytes takes
        /// a whole mapping of its own (reused best-fit) instead of a block of a
        /// segment. 0 (what `flare_pool_config_init` writes) is the default: no
        /// request does (`UINT64_MAX`). Added in 0.1.0 after `cross_stream_reuse`
        /// (`sizeof` grew from 72 to 80): an older caller's `struct_size` of 72 leaves
        /// it at its default.
        pub segment_whole_threshold_bytes: u64,
        /// Entries (idle allocations) each thread's cache may hold (issue 13): memory
        /// freed with `flare_package_free` goes to the freeing thread's cache while it
        /// has room, and that thread's later `flare_package_allocate` calls take it
        /// back with no lock and no shared write (the snapshot's `thread_cache_hits`).
        /// Caches hold memory only while nothing would be released anyway (a
        /// retention scope is open, or `release_threshold_bytes` is `UINT64_MAX`),
        /// never under `FLARE_REUSE_NONE`; scopes, trim, an out-of-memory and destroy
        /// drain them. `flare_pool_config_init` writes the default, 32 (as many sizes
        /// as a compiled forward's transients cycle through on one thread); 0 is also
        /// taken as that default, so thread caches are turned off with
        /// `FLARE_THREAD_CACHE_OFF` (`UINT32_MAX`) instead. Added in 0.1.0 after
        /// `segment_whole_threshold_bytes` (`sizeof` grew from 80 to 96): an older
        /// caller's `struct_size` of 80 leaves it at its default.
        pub thread_cache_entries: u32,
        /// Bytes each thread's cache may hold; a free over it goes to the books. Its
        /// remote list (frees by other threads of what this thread allocated) is
        /// bounded by the same two settings, so a cache holds at most twice them.
        /// Memory idle in one thread's cache serves another thread only after a drain
        /// (a miss of the pool drains every cache before it creates memory; a scope's
        /// end, trim and an out-of-memory drain them too). `flare_pool_config_init`
        /// writes the default, 1 GiB; 0 is also taken as that default. Not used when
        /// `thread_cache_entries` is `FLARE_THREAD_CACHE_OFF`. At offset 88, after 4
        /// bytes of padding behind `thread_cache_entries` (a `uint64_t` is 8-aligned;
        /// `flare_pool_config_init` zeroes them). Added in 0.1.0 with
        /// `thread_cache_entries`: an older caller's `struct_size` of 80 leaves it at
        /// its default, and one from 84 to 95 reads `thread_cache_entries` but not
        /// this field.
        pub thread_cache_bytes: u64,
        /// Record every call the pool serves to this file as flare-trace v1
        /// (`docs/trace-format.md`, "Recorded traces"), a NUL-terminated path (UTF-8
        /// on Windows; any bytes elsewhere); NULL (the default) records nothing. Read
        /// during `flare_pool_create` only (the caller keeps ownership). The file is
        /// created or truncated then; lines are buffered and written by a thread of
        /// the pool's; `flare_pool_destroy` writes the rest. A recording pool runs its
        /// calls one at a time (the file is the order they ran in; for diagnosis,
        /// not production). A file that cannot be
        /// created or written (a missing directory, no permission, a full disk) stops
        /// the recording and never fails a call, `flare_pool_create` included: the
        /// error is printed once on standard error and kept
        /// (`flare_pool_record_error`). An empty string names no file: a mistake,
        /// refused by `flare_pool_create` with `FLARE_STATUS_INVALID_ARGUMENT`
        /// (nothing is made; issue 34). At
        /// offset 96. Added in 0.1.0 after `thread_cache_bytes` (`sizeof` grew from 96
        /// to 104): an older caller's `struct_size` of 96 leaves it NULL.
        pub record_path: *const std::ffi::c_char,
    }
}

/// The value of `FlarePoolConfig::thread_cache_entries` that turns thread caches off
/// (issue 13): every free and every allocation goes to the pool's shared books, as
/// before thread caches existed. `UINT32_MAX`, because 0 in that field means the
/// default (32 entries), as in the configuration's other fields.
pub const FLARE_THREAD_CACHE_OFF: u32 = u32::MAX;

snapshot_counters!(c_snapshot! {
    /// A consistent copy of a pool's counters (taken under the pool's lock).
    ///
    /// Byte fields are bytes; `*_count` fields count mappings (`segment_count`
    /// segments, `block_live_count` blocks); the other counters count events since
    /// the pool was created. These always hold (every physical handle is counted
    /// once: whole mappings live, idle or pending, and the handles mapped in
    /// segments): `physical_bytes == live_mapped_bytes + idle_bytes + pending_bytes +
    /// segment_mapped_bytes`; `segment_mapped_bytes == block_live_bytes +
    /// block_free_bytes`; `allocations == frees + live_count`; `block_live_count <=
    /// live_count`. The segment fields are 0 unless `reuse_policy` is
    /// `FLARE_REUSE_SEGMENTS`; there a live block counts in `live_count` and
    /// `live_requested_bytes` but not in `live_mapped_bytes` (its bytes are in
    /// `block_live_bytes`), and a segment's reservation stays in `reserved_bytes`
    /// and `segment_count` after its last handle is released, until the pool is
    /// destroyed.
    ///
    /// Versioning: the caller sets `struct_size` to `sizeof(FlareSnapshot)` of its
    /// header; only the fields lying wholly inside `struct_size` bytes are written, and
    /// `struct_size` itself is left as it is. It must cover at least `struct_size` and
    /// `scope_open` (8 bytes) and be at most 4096, else `FLARE_STATUS_INVALID_ARGUMENT`.
    /// Fields are only ever added at the end: `reuse_forced_hits` was added in 0.1.0
    /// after `reserve_failures` (an older caller's `struct_size` leaves it out), the
    /// stream counters (`events_outstanding` to `stream_call_failures`) after it
    /// (`sizeof` 304), the segment counters (`segment_count` to `segment_lent_bytes`)
    /// after those (`sizeof` grew from 304 to 368: a caller's `struct_size` of 304
    /// leaves them unwritten), the thread-cache counters (`thread_cache_count` to
    /// `remote_frees`, issue 13) after those (`sizeof` grew from 368 to 400).
    pub struct FlareSnapshot;
});

versioned_struct! {
    /// What one tag holds (`flare_pool_tag_census`; issue 15). Bytes are the pool's
    /// sizes: a whole mapping's (the request rounded to the granularity), a block's
    /// (rounded to 512 bytes); except `offloaded_bytes`, the requested bytes (what is
    /// copied).
    ///
    /// Versioning: as for `FlareSnapshot`, the caller sets `struct_size` to
    /// `sizeof(FlareTagCensus)`; only the fields lying wholly inside `struct_size`
    /// bytes are written. It must cover at least `struct_size` and `sleeping` (8
    /// bytes) and be at most 4096.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct FlareTagCensus {
        /// `sizeof(FlareTagCensus)`, bytes; set by the caller.
        pub struct_size: u32,
        /// 1 while the tag sleeps (`flare_pool_sleep` succeeded, no wake yet), else 0.
        pub sleeping: u32,
        /// Live allocations of the tag, sleeping ones included.
        pub live_count: u64,
        /// Bytes of those.
        pub live_bytes: u64,
        /// High watermark of `live_bytes` (tag 0: the highest a census saw).
        pub peak_live_bytes: u64,
        /// Idle bytes the tag holds (tag 0: every idle mapping and free block not in
        /// another tag's bucket).
        pub idle_bytes: u64,
        /// Physical bytes the tag holds on the device (0 while it sleeps, unless the
        /// driver refused to release a handle).
        pub physical_bytes: u64,
        /// Bytes of pinned host memory holding the tag's contents while it sleeps in
        /// `FLARE_SLEEP_OFFLOAD`: the sum of its live allocations' requested bytes
        /// (what was asked, not the rounded sizes: only those bytes are copied).
        pub offloaded_bytes: u64,
        /// Bytes the tag's zeroing wakes (`flare_pool_wake_zeroed`) set to zero,
        /// cumulative: each live allocation's requested bytes, per wake from a discard
        /// sleep. Added after `offloaded_bytes`: a caller whose `struct_size` ends
        /// there is not written here.
        pub zeroed_bytes: u64,
        /// Memsets (`cuMemsetD8Async`) those wakes queued, cumulative.
        pub zero_memsets: u64,
    }
}

impl FlareTagCensus {
    /// The C copy of a [`crate::TagCensus`] (`struct_size` set to this header's).
    pub(crate) fn from_census(c: &crate::TagCensus) -> Self {
        FlareTagCensus {
            struct_size: std::mem::size_of::<FlareTagCensus>() as u32,
            sleeping: u32::from(c.sleeping),
            live_count: c.live_count,
            live_bytes: c.live_bytes,
            peak_live_bytes: c.peak_live_bytes,
            idle_bytes: c.idle_bytes,
            physical_bytes: c.physical_bytes,
            offloaded_bytes: c.offloaded_bytes,
            zeroed_bytes: c.zeroed_bytes,
            zero_memsets: c.zero_memsets,
        }
    }
}

versioned_struct! {
    /// What `flare_pool_destroy_report` released: the allocations that were still live
    /// when the pool was destroyed (a leak on the caller's side, or a deliberate
    /// teardown), and everything the pool held.
    ///
    /// Versioning: as for `FlareSnapshot`, the caller sets `struct_size` to
    /// `sizeof(FlareDestroyReport)`; only the fields lying wholly inside `struct_size`
    /// bytes are written, `struct_size` itself is left as it is. It must cover at least
    /// `struct_size` and `scope_was_open` (8 bytes) and be at most 4096.
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
        /// Bytes the pool held for those allocations: each whole mapping's size (the
        /// request rounded to the granularity), and in `FLARE_REUSE_SEGMENTS` each
        /// block's size (the request rounded to 512 bytes); the snapshot's
        /// `live_mapped_bytes + block_live_bytes` (plus, for allocations of a sleeping
        /// tag, `sleeping_bytes + sleeping_held_bytes`: unmapped, still live).
        pub live_mapped_bytes: u64,
        /// Physical bytes the pool held on the device (live, idle, pending and
        /// mapped in segments: the snapshot's `physical_bytes`), all
        /// released, unless the status is `FLARE_STATUS_DRIVER_ERROR`: then what the
        /// driver refused is left to it.
        pub physical_bytes: u64,
    }
}

// The layouts the C tests assert too (`sizeof` 104, 472, 40 and 72 on 64-bit targets).
const _: () = assert!(size_of::<FlareStatus>() == 4 && size_of::<FlareBackend>() == 4);
const _: () = assert!(size_of::<FlareReusePolicy>() == 4 && size_of::<FlareDriverCall>() == 4);
const _: () = assert!(size_of::<FlareCrossStreamReuse>() == 4);
const _: () = assert!(size_of::<FlareSnapshot>() == 8 + 58 * 8);
const _: () = assert!(size_of::<FlarePoolConfig>() == 104);
const _: () = assert!(size_of::<FlareDestroyReport>() == 8 + 4 * 8);
const _: () = assert!(size_of::<FlareTagCensus>() == 8 + 8 * 8);
const _: () = assert!(size_of::<FlareSleepMode>() == 4);

/// The largest `struct_size` accepted from a caller.
const MAX_STRUCT_SIZE: u32 = 4096;

impl FlarePoolConfig {
    /// The defaults `flare_pool_config_init` writes (with `struct_size` the whole
    /// struct).
    pub(crate) fn default_for_layout() -> Self {
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
            cross_stream_reuse: FlareCrossStreamReuse::FLARE_CROSS_STREAM_WHEN_COMPLETE as u32,
            segment_whole_threshold_bytes: 0,
            thread_cache_entries: DEFAULT_THREAD_CACHE_ENTRIES,
            thread_cache_bytes: DEFAULT_THREAD_CACHE_BYTES,
            record_path: ptr::null(),
        }
    }
}

impl FlareDestroyReport {
    /// What destroying a pool in state `s` releases.
    pub(crate) fn before_destroy(s: &Snapshot) -> Self {
        FlareDestroyReport {
            struct_size: size_of::<FlareDestroyReport>() as u32,
            scope_was_open: u32::from(s.scope_open),
            live_count: s.live_count,
            live_requested_bytes: s.live_requested_bytes,
            // Sleeping allocations (issue 15) are live: their bytes count, mapped
            // or not.
            live_mapped_bytes: s.live_mapped_bytes
                + s.block_live_bytes
                + s.sleeping_bytes
                + s.sleeping_held_bytes,
            physical_bytes: s.physical_bytes,
        }
    }
}

/// Checks a caller's `struct_size` and returns how many leading bytes of the struct
/// to read or write: the end of the last field lying wholly inside it (at most the
/// library's own size). `field_ends` is in layout order (`FIELD_ENDS`).
pub(crate) fn struct_prefix<T>(
    what: &str,
    struct_size: u32,
    field_ends: &[usize],
) -> Result<usize, Error> {
    let min = field_ends.get(1).copied().unwrap_or(size_of::<T>());
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

/// A versioned output struct of the C ABI that is written by a prefix copy
/// ([`VersionedOut`]).
///
/// # Safety
/// `Self` is a `#[repr(C)]` struct with no padding whose first field is
/// `struct_size: u32`, and [`VersionedOutput::ENDS`] is the end of each of its fields
/// in layout order (its `FIELD_ENDS`).
pub(crate) unsafe trait VersionedOutput: Sized {
    /// The end of each field, bytes from the start, in layout order.
    const ENDS: &'static [usize];
}

// SAFETY: `versioned_struct!` makes each a `#[repr(C)]` struct starting with
// `struct_size: u32`, its `FIELD_ENDS` in layout order; their fields are `u32`s in
// pairs and `u64`s, so there is no padding (`types::tests` checks the layouts).
unsafe impl VersionedOutput for FlareSnapshot {
    const ENDS: &'static [usize] = &FlareSnapshot::FIELD_ENDS;
}
// SAFETY: as for `FlareSnapshot`.
unsafe impl VersionedOutput for FlareTagCensus {
    const ENDS: &'static [usize] = &FlareTagCensus::FIELD_ENDS;
}
// SAFETY: as for `FlareSnapshot`.
unsafe impl VersionedOutput for FlareDestroyReport {
    const ENDS: &'static [usize] = &FlareDestroyReport::FIELD_ENDS;
}

/// A caller's versioned output struct (`FlareSnapshot *out` and the like) as a safe
/// value: NULL, or a struct of at least its `struct_size` writable bytes. Checked by
/// [`VersionedOut::check`], written by [`CheckedOut::write`].
pub(crate) struct VersionedOut<'a, T: VersionedOutput> {
    ptr: *mut T,
    _caller: PhantomData<&'a mut T>,
}

impl<'a, T: VersionedOutput> VersionedOut<'a, T> {
    /// The caller's output pointer.
    ///
    /// # Safety
    /// `ptr` is NULL or, when aligned, points to a struct whose first field
    /// (`struct_size`, a `uint32_t`) is readable and which has at least `struct_size`
    /// writable bytes, none of them accessed otherwise during `'a`.
    pub(crate) unsafe fn new(ptr: *mut T) -> Self {
        VersionedOut {
            ptr,
            _caller: PhantomData,
        }
    }

    /// Checks the struct, the argument `arg` (a `what`): non-NULL, aligned, a valid
    /// `struct_size` ([`struct_prefix`]); returns the struct with how many leading
    /// bytes to write.
    pub(crate) fn check(self, arg: &str, what: &str) -> Result<CheckedOut<'a, T>, Error> {
        check_out(self.ptr, arg)?;
        // SAFETY: non-NULL and aligned, so by `new`'s contract its first field, a
        // `u32`, is readable.
        let struct_size = unsafe { self.ptr.cast::<u32>().read() };
        let prefix = struct_prefix::<T>(what, struct_size, T::ENDS)?;
        Ok(CheckedOut {
            ptr: self.ptr,
            prefix,
            _caller: PhantomData,
        })
    }
}

/// A caller's versioned output struct that passed [`VersionedOut::check`]: non-NULL,
/// aligned, with at least `prefix` writable bytes.
pub(crate) struct CheckedOut<'a, T: VersionedOutput> {
    ptr: *mut T,
    /// The end of the last field lying wholly inside the caller's `struct_size`.
    prefix: usize,
    _caller: PhantomData<&'a mut T>,
}

impl<T: VersionedOutput> CheckedOut<'_, T> {
    /// Copies the fields of `value` lying wholly inside the caller's `struct_size` to
    /// the caller's struct, except its leading `u32` (`struct_size`, which stays the
    /// caller's).
    pub(crate) fn write(self, value: &T) {
        let skip = size_of::<u32>();
        // SAFETY: `ptr` is non-NULL, aligned and has at least `prefix` writable bytes
        // (`check`, by `VersionedOut::new`'s contract); `prefix` is a field end of `T`
        // ([`struct_prefix`]), so at least 4 (the minimum covers two fields) and at
        // most `size_of::<T>()`; `T` has no padding (`VersionedOutput`), so every byte
        // copied from `value`, a separate Rust value, is initialised.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::from_ref(value).cast::<u8>().add(skip),
                self.ptr.cast::<u8>().add(skip),
                self.prefix - skip,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;
    use std::mem::offset_of;

    /// `struct_prefix` of `T` for each `(struct_size, prefix)`; `None`: refused.
    fn check_prefixes<T>(ends: &[usize], cases: &[(u32, Option<usize>)]) {
        for &(size, want) in cases {
            assert_eq!(
                struct_prefix::<T>("s", size, ends).ok(),
                want,
                "struct_size {size}"
            );
        }
    }

    #[test]
    fn struct_prefix_rounds_down_to_field_boundaries() {
        assert_eq!(
            FlareSnapshot::FIELD_ENDS.last().copied(),
            Some(size_of::<FlareSnapshot>())
        );
        check_prefixes::<FlareSnapshot>(
            &FlareSnapshot::FIELD_ENDS,
            &[
                (0, None),
                (7, None),
                (4097, None),
                (8, Some(8)),
                (23, Some(16)),
                // A caller compiled before reuse_forced_hits (240 bytes) gets the
                // fields up to reserve_failures.
                (240, Some(240)),
                (247, Some(240)),
                // A caller compiled before the segment counters (304 bytes, up to
                // stream_call_failures): not one of them.
                (304, Some(304)),
                (311, Some(304)),
                // Ending inside block_free_bytes (344..352): the fields before it.
                (351, Some(344)),
                (352, Some(352)),
                // Ending inside segment_lent_bytes (360..368).
                (367, Some(360)),
                // A caller compiled before the thread-cache counters (368 bytes, up to
                // segment_lent_bytes): not one of them.
                (368, Some(368)),
                (375, Some(368)),
                // Ending inside thread_cache_hits (384..392): the fields before it.
                (391, Some(384)),
                (392, Some(392)),
                // A caller compiled before the sleep counters (400 bytes, up to
                // remote_frees, issue 13): not one of them.
                (400, Some(400)),
                (407, Some(400)),
                // Ending inside offloaded_bytes (440..448): the fields before it.
                (447, Some(440)),
                // A caller compiled before the sleeping block counters (448 bytes, up
                // to offloaded_bytes): not one of them.
                (448, Some(448)),
                (455, Some(448)),
                // Ending inside sleeping_block_bytes (456..464).
                (463, Some(456)),
                // A caller compiled before the kept host buffer (464 bytes, up to
                // sleeping_block_bytes): not it.
                (464, Some(464)),
                (471, Some(464)),
                // This header's 472 bytes, and a newer caller's larger struct: all.
                (472, Some(472)),
                (4096, Some(472)),
            ],
        );
        // best_fit_max_waste_percent (4 bytes at 60) filled what was the tail
        // padding; cross_stream_reuse (4 bytes at 64) grew the struct to 72, with 4
        // bytes of tail padding; segment_whole_threshold_bytes (a u64, 8-aligned:
        // at 72, after those 4 bytes, now interior padding) grew it to 80, no tail
        // padding; thread_cache_entries (4 bytes at 80) and thread_cache_bytes (a
        // u64: at 88, after 4 bytes of interior padding) grew it to 96.
        assert_eq!(offset_of!(FlarePoolConfig, best_fit_max_waste_percent), 60);
        assert_eq!(offset_of!(FlarePoolConfig, cross_stream_reuse), 64);
        assert_eq!(
            offset_of!(FlarePoolConfig, segment_whole_threshold_bytes),
            72
        );
        assert_eq!(offset_of!(FlarePoolConfig, thread_cache_entries), 80);
        assert_eq!(offset_of!(FlarePoolConfig, thread_cache_bytes), 88);
        // record_path (a pointer at 96) grew it to 104.
        assert_eq!(offset_of!(FlarePoolConfig, record_path), 96);
        assert_eq!(FlarePoolConfig::FIELD_ENDS.last().copied(), Some(104));
        assert_eq!(size_of::<FlarePoolConfig>(), 104);
        check_prefixes::<FlarePoolConfig>(
            &FlarePoolConfig::FIELD_ENDS,
            &[
                (104, Some(104)),
                (4096, Some(104)),
                // A caller compiled before record_path (sizeof 96): every field up to
                // thread_cache_bytes, not record_path (read as NULL).
                (96, Some(96)),
                (103, Some(96)),
                // A caller compiled before the thread-cache fields (sizeof 80): up to
                // segment_whole_threshold_bytes, neither of them.
                (80, Some(80)),
                (83, Some(80)),
                // Covering thread_cache_entries but not thread_cache_bytes: the padding
                // at 84..88 is no field, so up to 95 the prefix ends at 84.
                (84, Some(84)),
                (88, Some(84)),
                (95, Some(84)),
                // A caller compiled before segment_whole_threshold_bytes (sizeof 72):
                // up to cross_stream_reuse; the padding after it is no field.
                (72, Some(68)),
                (79, Some(68)),
                // A caller compiled before cross_stream_reuse (sizeof 64): every field
                // up to best_fit_max_waste_percent, not the new one.
                (64, Some(64)),
                (67, Some(64)),
                (68, Some(68)),
                // An older caller whose struct ended with sim_device_count (at 60).
                (60, Some(60)),
                // peer_device_count ends at 36; 40 has padding, then
                // sim_capacity_bytes.
                (40, Some(36)),
            ],
        );
        assert_eq!(FlareDestroyReport::FIELD_ENDS, [4, 8, 16, 24, 32, 40]);
    }

    #[test]
    fn snapshot_layout_keeps_its_order_and_adds_at_the_end() {
        // The offsets of the C struct as 0.1.0's first header had them, by hand: the
        // new field goes after them, nothing moves.
        assert_eq!(offset_of!(FlareSnapshot, scope_open), 4);
        assert_eq!(offset_of!(FlareSnapshot, granularity_bytes), 8);
        assert_eq!(offset_of!(FlareSnapshot, oom_retries), 8 + 18 * 8);
        assert_eq!(offset_of!(FlareSnapshot, map_failures), 8 + 19 * 8);
        assert_eq!(offset_of!(FlareSnapshot, scopes_aborted), 8 + 26 * 8);
        assert_eq!(offset_of!(FlareSnapshot, create_failures), 224);
        assert_eq!(offset_of!(FlareSnapshot, reserve_failures), 232);
        assert_eq!(offset_of!(FlareSnapshot, reuse_forced_hits), 240);
        // The stream-order counters (issue 11), after it: 8 at 248, the last of 7
        // ending at 304 (0.1.0's second header).
        assert_eq!(offset_of!(FlareSnapshot, events_outstanding), 248);
        assert_eq!(offset_of!(FlareSnapshot, stream_call_failures), 296);
        // The eight segment counters (issue 12), after those: 304 to 368.
        assert_eq!(offset_of!(FlareSnapshot, segment_count), 304);
        assert_eq!(offset_of!(FlareSnapshot, segment_handles), 312);
        assert_eq!(offset_of!(FlareSnapshot, segment_mapped_bytes), 320);
        assert_eq!(offset_of!(FlareSnapshot, block_live_count), 328);
        assert_eq!(offset_of!(FlareSnapshot, block_live_bytes), 336);
        assert_eq!(offset_of!(FlareSnapshot, block_free_bytes), 344);
        assert_eq!(offset_of!(FlareSnapshot, segment_handles_lent), 352);
        assert_eq!(offset_of!(FlareSnapshot, segment_lent_bytes), 360);
        // The four thread-cache counters (issue 13), after those: 368 to 400.
        assert_eq!(offset_of!(FlareSnapshot, thread_cache_count), 368);
        assert_eq!(offset_of!(FlareSnapshot, thread_cache_bytes), 376);
        assert_eq!(offset_of!(FlareSnapshot, thread_cache_hits), 384);
        assert_eq!(offset_of!(FlareSnapshot, remote_frees), 392);
        // The six sleep counters (issue 15), after those: 400 to 448.
        assert_eq!(offset_of!(FlareSnapshot, tags_sleeping), 400);
        assert_eq!(offset_of!(FlareSnapshot, sleeping_count), 408);
        assert_eq!(offset_of!(FlareSnapshot, sleeping_bytes), 416);
        assert_eq!(offset_of!(FlareSnapshot, sleeping_held_count), 424);
        assert_eq!(offset_of!(FlareSnapshot, sleeping_held_bytes), 432);
        assert_eq!(offset_of!(FlareSnapshot, offloaded_bytes), 440);
        // The two sleeping block counters (segments per tag), after those: 448 to 464.
        assert_eq!(offset_of!(FlareSnapshot, sleeping_block_count), 448);
        assert_eq!(offset_of!(FlareSnapshot, sleeping_block_bytes), 456);
        // The kept host buffer's bytes (issue 15), after those: 464 to 472.
        assert_eq!(offset_of!(FlareSnapshot, host_kept_bytes), 464);
        assert_eq!(size_of::<FlareSnapshot>(), 472);
        // The tag census: two u32, six u64; then the zeroing wake's two (issue 34).
        assert_eq!(offset_of!(FlareTagCensus, live_count), 8);
        assert_eq!(offset_of!(FlareTagCensus, offloaded_bytes), 48);
        assert_eq!(offset_of!(FlareTagCensus, zeroed_bytes), 56);
        assert_eq!(offset_of!(FlareTagCensus, zero_memsets), 64);
        assert_eq!(size_of::<FlareTagCensus>(), 72);
    }

    #[test]
    fn snapshot_conversion_copies_each_counter_to_its_own_field() {
        // Counters of each kind set to distinct values, the others left 0.
        let s = Snapshot {
            scope_open: true,
            granularity_bytes: 2 << 20,
            live_count: 3,
            live_requested_bytes: 5,
            reuse_hits: 7,
            reuse_exact_hits: 11,
            map_failures: 13,
            reserve_failures: 17,
            reuse_forced_hits: 19,
            segment_count: 23,
            segment_handles: 29,
            segment_mapped_bytes: 31,
            block_live_count: 37,
            block_live_bytes: 41,
            block_free_bytes: 43,
            segment_handles_lent: 47,
            segment_lent_bytes: 53,
            thread_cache_count: 59,
            thread_cache_bytes: 61,
            thread_cache_hits: 67,
            remote_frees: 71,
            tags_sleeping: 73,
            sleeping_count: 79,
            sleeping_bytes: 83,
            sleeping_held_count: 89,
            sleeping_held_bytes: 97,
            offloaded_bytes: 101,
            sleeping_block_count: 103,
            sleeping_block_bytes: 107,
            host_kept_bytes: 109,
            ..Snapshot::default()
        };
        let c = FlareSnapshot::from_snapshot(&s);
        assert_eq!((c.struct_size, c.scope_open), (472, 1));
        assert_eq!((c.sleeping_block_count, c.sleeping_block_bytes), (103, 107));
        assert_eq!(c.host_kept_bytes, 109);
        assert_eq!(
            (
                c.tags_sleeping,
                c.sleeping_count,
                c.sleeping_bytes,
                c.sleeping_held_count,
                c.sleeping_held_bytes,
                c.offloaded_bytes
            ),
            (73, 79, 83, 89, 97, 101)
        );
        assert_eq!(
            (c.granularity_bytes, c.live_count, c.live_requested_bytes),
            (2 << 20, 3, 5)
        );
        assert_eq!(
            (c.reuse_hits, c.reuse_exact_hits, c.reuse_forced_hits),
            (7, 11, 19)
        );
        assert_eq!((c.map_failures, c.reserve_failures), (13, 17));
        assert_eq!(
            (c.segment_count, c.segment_handles, c.segment_mapped_bytes),
            (23, 29, 31)
        );
        assert_eq!(
            (c.block_live_count, c.block_live_bytes, c.block_free_bytes),
            (37, 41, 43)
        );
        assert_eq!((c.segment_handles_lent, c.segment_lent_bytes), (47, 53));
        assert_eq!(
            (
                c.thread_cache_count,
                c.thread_cache_bytes,
                c.thread_cache_hits
            ),
            (59, 61, 67)
        );
        assert_eq!(c.remote_frees, 71);
        assert_eq!((c.frees, c.sync_failures, c.create_failures), (0, 0, 0));
        assert_eq!((c.stream_call_failures, c.capture_held_bytes), (0, 0));
    }

    #[test]
    fn enums_convert_from_their_numbers() {
        // The contract's numbers, written out.
        use FlareReusePolicy as P;
        assert_eq!(
            FlareBackend::from_raw(1),
            Some(FlareBackend::FLARE_BACKEND_SIMULATED)
        );
        assert_eq!(FlareBackend::from_raw(2), None);
        assert_eq!(P::from_raw(2), Some(P::FLARE_REUSE_NONE));
        assert_eq!(
            ReusePolicy::from(P::FLARE_REUSE_BEST_FIT),
            ReusePolicy::BestFit
        );
        assert_eq!(ReusePolicy::from(P::FLARE_REUSE_EXACT), ReusePolicy::Exact);
        assert_eq!(ReusePolicy::from(P::FLARE_REUSE_NONE), ReusePolicy::None);
        assert_eq!(P::from_raw(3), Some(P::FLARE_REUSE_SEGMENTS));
        assert_eq!(
            ReusePolicy::from(P::FLARE_REUSE_SEGMENTS),
            ReusePolicy::Segments
        );
        assert_eq!(P::FLARE_REUSE_SEGMENTS.name(), c"FLARE_REUSE_SEGMENTS");
        assert_eq!(P::ALL.len(), 4);
        // The cross-stream modes: 0 is the default, so that a zeroed field means it.
        use FlareCrossStreamReuse as X;
        assert_eq!(
            X::from_raw(0).map(CrossStreamReuse::from),
            Some(CrossStreamReuse::default())
        );
        assert_eq!(
            X::from_raw(0).map(CrossStreamReuse::from),
            Some(CrossStreamReuse::WhenComplete)
        );
        assert_eq!(
            X::from_raw(1).map(CrossStreamReuse::from),
            Some(CrossStreamReuse::Never)
        );
        assert_eq!(
            X::from_raw(2).map(CrossStreamReuse::from),
            Some(CrossStreamReuse::Wait)
        );
        assert_eq!(X::from_raw(3), None);
        assert_eq!(
            X::FLARE_CROSS_STREAM_WAIT.name(),
            c"FLARE_CROSS_STREAM_WAIT"
        );
        assert_eq!(
            X::parse(7, "cross_stream_reuse").map_err(|e| e.to_string()),
            Err(
                "invalid argument: cross_stream_reuse 7 is not a FlareCrossStreamReuse (0..2)"
                    .into()
            )
        );
        let call = FlareDriverCall::from_raw(4).map(DriverCall::from);
        assert_eq!(call, Some(DriverCall::Map));
        assert_eq!(
            FlareDriverCall::from_raw(8),
            None,
            "granularity is not in C"
        );
        assert_eq!(FlareDriverCall::ALL.len(), DriverCall::MEMORY_CALLS.len());
        assert_eq!(
            P::parse(4, "reuse_policy").map_err(|e| e.to_string()),
            Err("invalid argument: reuse_policy 4 is not a FlareReusePolicy (0..3)".into())
        );
        assert_eq!(
            FlareDriverCall::FLARE_CALL_SYNCHRONIZE.name(),
            c"FLARE_CALL_SYNCHRONIZE"
        );
        let name: &CStr = FlareBackend::FLARE_BACKEND_CUDA.name();
        assert_eq!(name, c"FLARE_BACKEND_CUDA");
    }
}
