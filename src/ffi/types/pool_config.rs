//! `FlarePoolConfig`: a pool's settings, the enums of its fields (backend, reuse
//! policy, cross-stream reuse) and their defaults.

use std::mem::size_of;
use std::ptr;

use super::super::generate::{c_enum, versioned_struct};
use crate::pool::{
    cross_stream_modes, reuse_policies, CrossStreamReuse, ReusePolicy,
    DEFAULT_BEST_FIT_MAX_WASTE_PERCENT, DEFAULT_THREAD_CACHE_BYTES, DEFAULT_THREAD_CACHE_ENTRIES,
};

c_enum! {
    /// The driver a pool runs on.
    pub enum FlareBackend;
    /// The real CUDA driver (libcuda.so.1, loaded at run time), device `device`.
    FLARE_BACKEND_CUDA = 0;
    /// A deterministic simulated device (no GPU needed), sized by `sim_capacity_bytes`
    /// and `sim_granularity_bytes`. Supports fault injection.
    FLARE_BACKEND_SIMULATED = 1;
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
        /// replaying real traces, docs/benchmarks.md); 0 is also taken as that default (a
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
        /// Events the pool's history ring keeps (issue 38): its recent allocations,
        /// frees, mappings made and released and out-of-memory refusals, as PyTorch's
        /// memory_viz names them, the oldest overwritten once it is full; the
        /// `device_traces` of `flare_pool_dump_snapshot`. 0 (the default) turns it
        /// off: a branch per call. On, each event takes the ring's own lock and about
        /// 100 bytes. At offset 104. Added in 0.3.0 after `record_path` (`sizeof` grew
        /// from 104 to 112): an older caller's `struct_size` of 104 leaves it 0.
        pub history_events: u64,
    }
}

/// The value of `FlarePoolConfig::thread_cache_entries` that turns thread caches off
/// (issue 13): every free and every allocation goes to the pool's shared books, as
/// before thread caches existed. `UINT32_MAX`, because 0 in that field means the
/// default (32 entries), as in the configuration's other fields.
pub const FLARE_THREAD_CACHE_OFF: u32 = u32::MAX;
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
            history_events: 0,
        }
    }
}
