//! Section 6: reuse throughput with 1 to 16 threads: own sizes, shared sizes with
//! cross-thread frees, and the stream-ordered pool with one stream per thread.

use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use serde::Serialize;

use flare_package::driver::cuda::TransferError;
use flare_package::{fmt_bytes, DevicePtr, Pool};
use flare_tools::cuda_baseline::StreamOrderedPool;

use crate::harness::measure_threads;
use crate::{Bench, BoxResult, MIB};

const THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// The sizes every thread of the shared-sizes section cycles through (section 6):
/// all multiples of the 2 MiB granularity, none within the best-fit waste bound (30%)
/// of another, so each is served from idle mappings of its own size.
pub(crate) const SHARED_SIZES: [u64; 4] = [2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB];
/// Entries of each thread's outgoing queue in the shared-sizes section.
pub(crate) const SHARED_QUEUE: usize = 16;
/// The most allocations of one size of [`SHARED_SIZES`] that one thread's
/// allocations can have live at once in the shared-sizes section: its queue holds
/// [`SHARED_QUEUE`] consecutive allocations of the cycle (at most
/// `ceil(SHARED_QUEUE / 4)` of one size), plus one between its allocation and the
/// push, and one between the next thread's pop and its free.
pub(crate) const SHARED_LIVE_PER_SIZE: usize = SHARED_QUEUE.div_ceil(SHARED_SIZES.len()) + 2;
/// Pairs between two looks at the stop flag in the thread sections.
const THREAD_BATCH: u64 = 256;

/// Own-sizes thread `i`'s size (section 6): `(i + 1) * 2 MiB`.
pub(crate) fn own_size(i: usize) -> u64 {
    (i as u64 + 1) * 2 * MIB
}

/// A row of section 6's own-sizes part: each thread its own size.
#[derive(Debug, Serialize)]
pub(crate) struct Threads {
    pub(crate) threads: usize,
    pub(crate) pairs: u64,
    pub(crate) seconds: f64,
    pub(crate) pairs_per_second: f64,
    /// Mappings created while measuring (0: every pair was a reuse hit).
    pub(crate) misses: u64,
    /// Snapshot deltas while measuring: allocations served from a thread cache, and
    /// frees passed back to another thread's cache through its remote list.
    pub(crate) thread_cache_hits: u64,
    pub(crate) remote_frees: u64,
}

/// A row of section 6's shared-sizes part: every free by another thread than the
/// allocation (`cross_thread`; with one thread, by the same thread through its
/// queue). `pairs`: the frees done while measuring.
#[derive(Debug, Serialize)]
pub(crate) struct SharedThreads {
    pub(crate) threads: usize,
    pub(crate) cross_thread: bool,
    pub(crate) pairs: u64,
    pub(crate) seconds: f64,
    pub(crate) pairs_per_second: f64,
    /// Mappings created while measuring (after the pre-warm and the warm-up).
    pub(crate) misses: u64,
    /// Snapshot deltas while measuring, as in [`Threads`].
    pub(crate) thread_cache_hits: u64,
    pub(crate) remote_frees: u64,
}

/// A row of section 6's stream-ordered part: one CUDA memory pool, one stream per
/// thread, each thread its own size.
#[derive(Debug, Serialize)]
pub(crate) struct StreamOrderedThreads {
    pub(crate) threads: usize,
    pub(crate) pairs: u64,
    pub(crate) seconds: f64,
    pub(crate) pairs_per_second: f64,
}

impl Bench {
    /// Section 6, own sizes: thread `i` allocates and frees [`own_size`]`(i)` on one
    /// pool inside a scope, after one warm-up pair of its own.
    pub(crate) fn threads(&self) -> BoxResult<Vec<Threads>> {
        let pool = Pool::new(self.config())?;
        let scope = pool.retention_scope()?;
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, own sizes, {n} thread(s)");
            let sizes: Vec<u64> = (0..n).map(own_size).collect();
            prewarm(&pool, &sizes)?;
            let mut before = None;
            let (pairs, seconds) = measure_threads(
                n,
                Duration::ZERO,
                self.run_for(),
                || before = Some(pool.snapshot()),
                |i, lane| {
                    let size = own_size(i);
                    let pair = || -> Result<(), String> {
                        let p = pool.allocate_raw(size).map_err(|e| e.to_string())?;
                        pool.free_raw(p).map_err(|e| e.to_string())
                    };
                    // Warm-up: the pre-warmed mapping of this thread's size (into this
                    // thread's cache, when the pool has them).
                    pair()?;
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pair()?;
                        }
                        pairs += THREAD_BATCH;
                    }
                    Ok(pairs)
                },
            )?;
            let before = before.ok_or("no snapshot before measuring")?;
            let (misses, thread_cache_hits, remote_frees) = cache_counts(&before, &pool.snapshot());
            out.push(Threads {
                threads: n,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
                misses,
                thread_cache_hits,
                remote_frees,
            });
        }
        scope.finish()?;
        Ok(out)
    }

    /// Section 6, shared sizes: thread `t` allocates [`SHARED_SIZES`] in turn and
    /// hands each pointer to thread `(t + 1) % n`, which frees it (see the crate
    /// documentation).
    pub(crate) fn threads_shared(&self) -> BoxResult<Vec<SharedThreads>> {
        let pool = Pool::new(self.config())?;
        let scope = pool.retention_scope()?;
        let warm = Duration::from_millis(if self.args.quick { 20 } else { 100 });
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, shared sizes, cross-thread frees, {n} thread(s)");
            let sizes: Vec<u64> = SHARED_SIZES
                .iter()
                .flat_map(|&size| std::iter::repeat_n(size, n * SHARED_LIVE_PER_SIZE))
                .collect();
            prewarm(&pool, &sizes)?;
            // `queues[t]`: what thread t frees, pushed by thread t - 1.
            let queues: Vec<ArrayQueue<DevicePtr>> =
                (0..n).map(|_| ArrayQueue::new(SHARED_QUEUE)).collect();
            let mut before = None;
            let measured = measure_threads(
                n,
                warm,
                self.run_for(),
                || before = Some(pool.snapshot()),
                |t, lane| {
                    let (inbox, outbox) = (&queues[t], &queues[(t + 1) % n]);
                    let mut next = t;
                    // Frees one pointer from the inbox if there is one, and allocates
                    // one for the outbox if it has room: the frees done (0 or 1).
                    let mut step = || -> Result<u64, String> {
                        let mut freed = 0;
                        if let Some(p) = inbox.pop() {
                            pool.free_raw(p).map_err(|e| e.to_string())?;
                            freed = 1;
                        }
                        if !outbox.is_full() {
                            let size = SHARED_SIZES[next % SHARED_SIZES.len()];
                            next += 1;
                            let p = pool.allocate_raw(size).map_err(|e| e.to_string())?;
                            // Only this thread pushes to its outbox, and it had room.
                            if let Err(p) = outbox.push(p) {
                                pool.free_raw(p).map_err(|e| e.to_string())?;
                                return Err("a shared-sizes queue was full".to_string());
                            }
                        } else if freed == 0 {
                            // Nothing to do until the next thread frees: let it run
                            // (threads may outnumber cores).
                            std::thread::yield_now();
                        }
                        Ok(freed)
                    };
                    while lane.warming() {
                        step()?;
                    }
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pairs += step()?;
                        }
                    }
                    lane.stop();
                    // Every thread is out of its loop: nothing more is pushed. Free
                    // what the previous thread left (not counted).
                    while let Some(p) = inbox.pop() {
                        pool.free_raw(p).map_err(|e| e.to_string())?;
                    }
                    Ok(pairs)
                },
            );
            // What a failed thread left in the queues.
            for q in &queues {
                while let Some(p) = q.pop() {
                    let _ = pool.free_raw(p);
                }
            }
            let (pairs, seconds) = measured?;
            let before = before.ok_or("no snapshot before measuring")?;
            let (misses, thread_cache_hits, remote_frees) = cache_counts(&before, &pool.snapshot());
            out.push(SharedThreads {
                threads: n,
                cross_thread: n > 1,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
                misses,
                thread_cache_hits,
                remote_frees,
            });
        }
        scope.finish()?;
        Ok(out)
    }

    /// Section 6, the stream-ordered pool: the own-sizes loop with
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` on one CUDA memory pool, each
    /// thread on a stream of its own. `None` on the simulated backend.
    pub(crate) fn threads_stream_ordered(&self) -> BoxResult<Option<Vec<StreamOrderedThreads>>> {
        if self.cuda.is_none() {
            return Ok(None);
        }
        let sop = StreamOrderedPool::new(self.args.device)?;
        let mut out = Vec::new();
        for n in THREADS {
            eprintln!("reuse throughput, stream-ordered pool, {n} thread(s), a stream each");
            let (pairs, seconds) = measure_threads(
                n,
                Duration::ZERO,
                self.run_for(),
                || {},
                |i, lane| {
                    let err = |e: TransferError| e.to_string();
                    let cur = sop.make_current().map_err(err)?;
                    let stream = sop.new_stream().map_err(err)?;
                    let size = own_size(i);
                    let pair = || -> Result<(), String> {
                        let p = cur.stream_alloc(&stream, size).map_err(err)?;
                        cur.stream_free(&stream, p).map_err(err)
                    };
                    // Warm-up: the pool holds this thread's size (release threshold
                    // u64::MAX keeps it).
                    pair()?;
                    lane.start();
                    let mut pairs = 0u64;
                    while lane.running() {
                        for _ in 0..THREAD_BATCH {
                            pair()?;
                        }
                        pairs += THREAD_BATCH;
                    }
                    lane.stop();
                    stream.synchronize().map_err(err)?;
                    Ok(pairs)
                },
            )?;
            out.push(StreamOrderedThreads {
                threads: n,
                pairs,
                seconds,
                pairs_per_second: pairs as f64 / seconds,
            });
        }
        drop(sop);
        Ok(Some(out))
    }
}

/// Section 6's pre-warm: on a helper thread (joined, so that whatever it cached
/// goes back to the pool when it exits), allocates every size of `sizes` (in
/// order, each held until all are allocated, so none is served from another's
/// mapping), then frees them all: inside the scope, they stay idle for the
/// measuring threads.
fn prewarm(pool: &Pool, sizes: &[u64]) -> BoxResult<()> {
    let joined = std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            let mut held = Vec::with_capacity(sizes.len());
            let mut result = Ok(());
            for &size in sizes {
                match pool.allocate_raw(size) {
                    Ok(p) => held.push(p),
                    Err(e) => {
                        result = Err(format!("pre-warm, {}: {e}", fmt_bytes(size)));
                        break;
                    }
                }
            }
            for p in held {
                if let Err(e) = pool.free_raw(p) {
                    result = result.and(Err(format!("pre-warm, free: {e}")));
                }
            }
            result
        })
        .join()
    });
    match joined {
        Ok(r) => Ok(r?),
        Err(_) => Err("the pre-warm thread panicked".into()),
    }
}

/// Mappings created, thread-cache hits and remote frees between two snapshots.
fn cache_counts(
    before: &flare_package::Snapshot,
    after: &flare_package::Snapshot,
) -> (u64, u64, u64) {
    (
        after
            .mappings_created
            .saturating_sub(before.mappings_created),
        after
            .thread_cache_hits
            .saturating_sub(before.thread_cache_hits),
        after.remote_frees.saturating_sub(before.remote_frees),
    )
}
