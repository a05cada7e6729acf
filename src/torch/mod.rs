//! PyTorch's allocator seams (issue 14), the safe half: one [`TorchAllocator`] holds,
//! per device, the pools behind `torch.cuda.memory.CUDAPluggableAllocator`. The C
//! functions PyTorch calls (`flare_torch_alloc`, `flare_torch_free` and the hooks) are
//! in `ffi/torch.rs`, over one process-wide allocator configured from the
//! environment ([`TorchConfig::from_env`]).
//!
//! Per device, created on first use, sharing one driver (one CUDA context, or one
//! simulated device whose streams every pool knows):
//! - the **tensor pool**: per-tensor mode (`change_current_allocator`); every tensor
//!   PyTorch allocates outside a graph pool; [`ReusePolicy::Segments`] by default, so
//!   small tensors share handles; stream-ordered (`allocate_async` on the tensor's
//!   stream, `free_async` on it: PyTorch passes the allocation's stream to the free);
//! - the **mempool pool**: pool mode (`torch.cuda.MemPool`), where PyTorch's caching
//!   allocator sub-allocates and asks us for its segments (2 MiB multiples); whole
//!   mappings of exactly the rounded size ([`ReusePolicy::Exact`]) and a release at
//!   each free once its stream's work is done, so that our physical bytes are the
//!   pool's reserved bytes;
//! - **graph pools**, one per PyTorch `MempoolId_t` given to the graph-pool hooks
//!   (`beginAllocateToPool` / `endAllocateToPool` / `releasePool`, called by
//!   `torch.cuda.graph` around each capture in per-tensor mode). Each is a [`Pool`] of
//!   its own with a retention scope open for its whole life: what a graph pool
//!   hands out, whenever it is freed (during the capture, or after it: a graph's
//!   output freed later), goes back to that pool only, is reused only by that pool's
//!   allocations, and is released only when PyTorch has released the pool and
//!   nothing allocated from it is live (after a device synchronize: replays run on
//!   streams the pool never sees).
//!
//! Which allocation goes to a graph pool: PyTorch's filter (a `std::function` the
//! hook receives) cannot be called from Rust, so we decide as it does: an allocation
//! on a stream that is being captured (`cuStreamGetCaptureInfo`) while a graph pool
//! is between begin and end on that device. PyTorch calls begin before
//! `cudaStreamBeginCapture`, on the capturing thread, so the capture id is bound to
//! a pool at its first allocation: the pool begun by the calling thread (most recent
//! first), else the most recently begun pool not bound yet. A capture with no pool
//! begun (raw CUDA capture) uses the tensor pool, whose own capture rules keep memory
//! freed in it for its graph.
//!
//! Frees find their pool by pointer: the allocations of graph pools are kept in a
//! map (looked up only while a graph pool exists), everything else is the tensor
//! pool's.
//!
//! [`Pool`]: crate::pool::Pool
//! [`ReusePolicy::Segments`]: crate::pool::ReusePolicy::Segments
//! [`ReusePolicy::Exact`]: crate::pool::ReusePolicy::Exact

#![forbid(unsafe_code)]

mod allocator;
mod config;
mod device;
mod growth;
mod json;
mod sleep;
mod stream_forget;
mod viz;

pub use allocator::{PoolKind, TorchAllocator};
pub use config::{TorchConfig, ENV_VARS};
pub use json::snapshot_json;

/// The most devices the allocator serves (ordinals `0..MAX_DEVICES`); a larger
/// ordinal is an invalid argument.
pub const MAX_DEVICES: usize = 64;

/// A PyTorch memory pool id (`c10::cuda::MempoolId_t`, a pair of `CaptureId_t`:
/// unsigned 64-bit integers): `(n, 0)` for a graph's own pool, `(0, n)` for one made
/// by `torch.cuda.graph_pool_handle()` or a `MemPool`.
pub type MempoolId = (u64, u64);

#[cfg(all(test, not(flare_loom)))]
mod tests;
#[cfg(all(test, not(flare_loom)))]
mod viz_tests;
