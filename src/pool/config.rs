//! Pool configuration.

pub use crate::driver::Backend;

/// The reuse policies, one row each: `/// doc`, the Rust variant and its number, the
/// C ABI's name (`FlareReusePolicy`, same number), the name on the command line and
/// in reports.
///
/// Written once: [`ReusePolicy`] with [`ReusePolicy::name`] (here) and the C ABI's
/// `FlareReusePolicy` with its integer conversion and name table (`ffi/types/pool_config.rs`)
/// are generated from it. `reuse_policies!(generator! { head })` expands to
/// `generator! { head rows }`.
macro_rules! reuse_policies {
    ($gen:ident! { $($head:tt)* }) => {
        $gen! {
            $($head)*
            /// The smallest idle mapping at least as large as the rounded request whose
            /// excess over it is at most the best-fit waste bound, a percentage of the
            /// request (`best_fit_max_waste_percent`, default 30%, chosen by replaying
            /// real traces, see docs/benchmarks.md). The default policy.
            BestFit = 0, FLARE_REUSE_BEST_FIT, "best-fit";
            /// Only an idle mapping of exactly the rounded size.
            Exact = 1, FLARE_REUSE_EXACT, "exact";
            /// Never reuse: a freed mapping is retained (inside a scope) or released. A
            /// baseline for comparison: a warmup that frees and allocates inside a scope
            /// keeps every mapping (the warmup-retention bug).
            None = 2, FLARE_REUSE_NONE, "none";
            /// Blocks carved from segments: a heap per stream (and one for the
            /// synchronous API) of reserved address ranges covered by whole physical
            /// handles mapped back to back, grown at their end; requests rounded to
            /// 512 bytes, placed by a bounded good fit (segregated bins), split and
            /// coalesced in software, so many tensors share a handle (see
            /// `docs/ARCHITECTURE.md`, "Segments").
            /// Requests above `segment_whole_threshold_bytes` take whole mappings,
            /// reused best-fit.
            Segments = 3, FLARE_REUSE_SEGMENTS, "segments";
        }
    };
}
pub(crate) use reuse_policies;

/// [`ReusePolicy`] and [`ReusePolicy::name`] from the rows of [`reuse_policies`].
macro_rules! rust_reuse_policy {
    (
        $(#[doc = $doc:literal])*
        pub enum ReusePolicy;
        $( $(#[doc = $vdoc:literal])* $v:ident = $n:literal, $c:ident, $s:literal; )*
    ) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ReusePolicy {
            $( $(#[doc = $vdoc])* $v = $n, )*
        }

        impl ReusePolicy {
            /// Every policy, in number order.
            const BY_NUMBER: [ReusePolicy; [$($n),*].len()] = [$(ReusePolicy::$v),*];

            /// The policy's name on the command line and in reports (`"best-fit"`).
            pub fn name(self) -> &'static str {
                match self {
                    $( ReusePolicy::$v => $s, )*
                }
            }
        }

        const _: () = assert!($crate::lists::numbered_from_zero(&[$($n),*]));
    };
}

reuse_policies!(rust_reuse_policy! {
    /// How a freed (idle) mapping is reused by a later allocation.
    pub enum ReusePolicy;
});

impl ReusePolicy {
    /// Every policy, in the order reports print them: from no reuse to the most
    /// (the whole-mapping policies in the reverse of their numbers, then segments).
    pub const ALL: [ReusePolicy; ReusePolicy::BY_NUMBER.len()] = [
        ReusePolicy::None,
        ReusePolicy::Exact,
        ReusePolicy::BestFit,
        ReusePolicy::Segments,
    ];

    /// Whether this policy carves blocks from segments ([`ReusePolicy::Segments`]).
    pub fn is_segments(self) -> bool {
        self == ReusePolicy::Segments
    }
}

/// Requests of at most this many bytes go to a heap's small segment (PyTorch's
/// small-pool limit, 1 MiB), larger ones to its large segment.
pub const SEGMENT_SMALL_MAX_BYTES: u64 = 1 << 20;

/// Block sizes in segments are multiples of this many bytes (PyTorch's caching
/// allocator rounds to 512 bytes too): a block's address is aligned to it.
pub const SEGMENT_BLOCK_ROUND_BYTES: u64 = 512;

/// The default of `segment_whole_threshold_bytes`: no request takes a whole mapping
/// in segment mode (chosen on the shipped traces, see docs/benchmarks.md).
pub const DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES: u64 = u64::MAX;

impl Default for ReusePolicy {
    /// [`ReusePolicy::BestFit`].
    fn default() -> Self {
        ReusePolicy::BestFit
    }
}

impl std::str::FromStr for ReusePolicy {
    type Err = String;
    /// A policy from its [`ReusePolicy::name`]; `bestfit` and `best_fit` are taken
    /// for `best-fit` too.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = match s {
            "bestfit" | "best_fit" => ReusePolicy::BestFit.name(),
            s => s,
        };
        ReusePolicy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = ReusePolicy::ALL.iter().map(|p| p.name()).collect();
                format!("unknown reuse policy {s:?} ({})", names.join(", "))
            })
    }
}

/// The default waste bound of [`ReusePolicy::BestFit`], percent of the rounded
/// request. Chosen by replaying the four shipped real traces
/// (`flare-replay --policy best-fit --best-fit-waste-percent N tests/data/*.trace`,
/// table in docs/benchmarks.md): every bound from 20% to 37% keeps best-fit at or below
/// `exact` on every trace (above 37% the graph-warmup segment trace peaks 0.8 GiB
/// higher than `exact`), while the tensor traces' peaks fall with the bound; 30% is
/// the middle of that band.
pub const DEFAULT_BEST_FIT_MAX_WASTE_PERCENT: u32 = 30;

/// The cross-stream reuse modes, one row each, as [`reuse_policies`] (C ABI
/// `FlareCrossStreamReuse`, same numbers; 0 is the default, so a zeroed C field
/// means it).
macro_rules! cross_stream_modes {
    ($gen:ident! { $($head:tt)* }) => {
        $gen! {
            $($head)*
            /// Memory freed on stream T is handed to an allocation on another stream
            /// S only once T's work up to the free has completed (a fence event
            /// recorded on T and polled with `cuEventQuery`). The default: no stream
            /// ever waits on another because of the pool.
            WhenComplete = 0, FLARE_CROSS_STREAM_WHEN_COMPLETE, "when-complete";
            /// Memory freed on T is reused only by allocations on T (or once a
            /// release point has seen T's work complete).
            Never = 1, FLARE_CROSS_STREAM_NEVER, "never";
            /// Memory freed on T is handed to S at once, after making S wait on a
            /// fence event recorded on T (`cuStreamWaitEvent`): the least memory, at
            /// the price of a cross-stream dependency.
            Wait = 2, FLARE_CROSS_STREAM_WAIT, "wait";
        }
    };
}
pub(crate) use cross_stream_modes;

/// [`CrossStreamReuse`] and its name from the rows of [`cross_stream_modes`].
macro_rules! rust_cross_stream {
    (
        $(#[doc = $doc:literal])*
        pub enum CrossStreamReuse;
        $( $(#[doc = $vdoc:literal])* $v:ident = $n:literal, $c:ident, $s:literal; )*
    ) => {
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum CrossStreamReuse {
            $( $(#[doc = $vdoc])* $v = $n, )*
        }

        impl CrossStreamReuse {
            /// Every mode, in number order.
            pub const ALL: [CrossStreamReuse; [$($n),*].len()] = [$(CrossStreamReuse::$v),*];

            /// The mode's name on the command line and in reports (`"when-complete"`).
            pub fn name(self) -> &'static str {
                match self {
                    $( CrossStreamReuse::$v => $s, )*
                }
            }
        }

        const _: () = assert!($crate::lists::numbered_from_zero(&[$($n),*]));
    };
}

cross_stream_modes!(rust_cross_stream! {
    /// When memory freed on one stream (`free_async`) may be handed to an allocation
    /// on another (`allocate_async`). Memory freed on the allocating stream itself is
    /// always reused at once: stream order makes it safe.
    pub enum CrossStreamReuse;
});

impl Default for CrossStreamReuse {
    /// [`CrossStreamReuse::WhenComplete`].
    fn default() -> Self {
        CrossStreamReuse::WhenComplete
    }
}

impl std::str::FromStr for CrossStreamReuse {
    type Err = String;
    /// A mode from its [`CrossStreamReuse::name`].
    fn from_str(s: &str) -> Result<Self, String> {
        CrossStreamReuse::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = CrossStreamReuse::ALL.iter().map(|m| m.name()).collect();
                format!(
                    "unknown cross-stream reuse mode {s:?} ({})",
                    names.join(", ")
                )
            })
    }
}

/// Settings of a [`Pool`](crate::Pool).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// The driver to run on (default: the simulated H200).
    pub backend: Backend,
    /// CUDA device ordinal whose memory the pool allocates (default 0).
    pub device: i32,
    /// Reuse policy (default best-fit).
    pub reuse_policy: ReusePolicy,
    /// Outside a retention scope, a freed mapping stays cached (idle, reusable) while
    /// the pool's idle bytes stay at or under this many bytes; above it, the freed
    /// mapping is released. Default 0: release at once.
    pub release_threshold_bytes: u64,
    /// Other device ordinals that get read/write access to every mapping
    /// (`cuMemSetAccess` per mapping: peer access enabling does not cover VMM memory).
    pub peer_devices: Vec<i32>,
    /// Best-fit only: the largest excess of an idle mapping over the rounded request,
    /// in percent of the request, that a reuse accepts (100: up to twice the size).
    /// Default [`DEFAULT_BEST_FIT_MAX_WASTE_PERCENT`].
    pub best_fit_max_waste_percent: u32,
    /// When memory freed on one stream may serve an allocation on another (default
    /// [`CrossStreamReuse::WhenComplete`]).
    pub cross_stream_reuse: CrossStreamReuse,
    /// [`ReusePolicy::Segments`] only: a request of more than this many bytes takes
    /// a whole mapping of its own (reused best-fit) instead of a block of a segment.
    /// Default [`DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES`] (every request in segments).
    pub segment_whole_threshold_bytes: u64,
    /// Entries each thread's cache may hold (issue 13): idle allocations freed with
    /// the synchronous `free` and reused by the same thread's `allocate` with no
    /// lock and no shared write. 0 turns thread caches off. Default
    /// [`DEFAULT_THREAD_CACHE_ENTRIES`]. Caches hold memory only while nothing would
    /// be released anyway (a retention scope is open, or `release_threshold_bytes`
    /// is `u64::MAX`), and never under [`ReusePolicy::None`].
    pub thread_cache_entries: u32,
    /// Bytes each thread's cache may hold (default [`DEFAULT_THREAD_CACHE_BYTES`]);
    /// a free over it goes to the books. The cache's remote list (frees by other
    /// threads of what this thread allocated) is bounded by the same entries and
    /// bytes, so a cache holds at most twice these bounds. Memory idle in one thread's cache is
    /// reused by another thread only after a drain (a miss of the pool drains every
    /// cache before it creates memory, and every release point drains them).
    pub thread_cache_bytes: u64,
    /// Record every call the pool serves to this file as flare-trace v1
    /// (`docs/trace-format.md`, "Recorded traces"; default `None`: off). The file is
    /// created (or truncated) when the pool is created, with a header naming this
    /// configuration; lines are buffered and written by a thread of the pool's, and
    /// the pool's drop (or [`Pool::destroy`](crate::Pool::destroy)) writes the rest.
    /// A recording pool runs its calls one at a time (the file is the order they
    /// ran in, so a replay decides as they did: issue 34), a cost for diagnosis,
    /// not for production.
    /// A file that cannot be created or written (a missing directory, no
    /// permission, a full disk) stops the recording and never fails a pool call,
    /// creation included: the error is reported once on standard error and kept
    /// ([`Pool::record_error`](crate::Pool::record_error)); a pool is not lost to a
    /// condition of the file system, which may come and go. An empty path names no
    /// file at all, a mistake seen before anything is made:
    /// [`Pool::new`](crate::Pool::new) refuses it with [`Error::InvalidArgument`]
    /// (issue 34).
    ///
    /// [`Error::InvalidArgument`]: crate::Error::InvalidArgument
    pub record_path: Option<std::path::PathBuf>,
    /// Events the history ring keeps (issue 38; default 0: off): the pool's recent
    /// allocations, frees, mappings made and released and out-of-memory refusals,
    /// as PyTorch's memory_viz names them, the oldest overwritten once the ring is
    /// full ([`Pool::history`](crate::Pool::history), and the `device_traces` of
    /// [`Pool::dump_snapshot`](crate::Pool::dump_snapshot)). Off, it costs one
    /// branch per call; on, each event takes the ring's own lock (a free writes
    /// two events) and about 100 bytes of the ring.
    pub history_events: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            backend: Backend::default(),
            device: 0,
            reuse_policy: ReusePolicy::BestFit,
            release_threshold_bytes: 0,
            peer_devices: Vec::new(),
            best_fit_max_waste_percent: DEFAULT_BEST_FIT_MAX_WASTE_PERCENT,
            cross_stream_reuse: CrossStreamReuse::WhenComplete,
            segment_whole_threshold_bytes: DEFAULT_SEGMENT_WHOLE_THRESHOLD_BYTES,
            thread_cache_entries: DEFAULT_THREAD_CACHE_ENTRIES,
            thread_cache_bytes: DEFAULT_THREAD_CACHE_BYTES,
            record_path: None,
            history_events: 0,
        }
    }
}

/// Default [`PoolConfig::thread_cache_entries`]: 32 idle allocations per thread, as
/// many sizes as a compiled forward's transients cycle through on one thread.
pub const DEFAULT_THREAD_CACHE_ENTRIES: u32 = 32;

/// Default [`PoolConfig::thread_cache_bytes`]: 1 GiB per thread. It bounds what one
/// thread keeps idle, not what the pool holds: a miss drains every cache before the
/// pool creates memory. 64 MiB spilled to the books in the cross-thread benchmark
/// (2 to 8 MiB allocations, 16 in flight per thread: docs/benchmarks.md).
pub const DEFAULT_THREAD_CACHE_BYTES: u64 = 1 << 30;

impl PoolConfig {
    /// This configuration with `policy`.
    pub fn with_policy(mut self, policy: ReusePolicy) -> Self {
        self.reuse_policy = policy;
        self
    }
}
