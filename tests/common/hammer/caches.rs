//! The thread caches' mix of the stress driver: workers allocating and freeing from
//! their own sizes, passing allocations to each other to free, while a controller
//! begins and finishes scopes, trims, and checks a snapshot after every step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use super::{panic_message, LiveRanges, Rng, Totals};
use flare_package::pool::SEGMENT_BLOCK_ROUND_BYTES;
use flare_package::{CuResult, DevicePtr, Pool};

// The thread caches' stress (issue 13): each worker allocates from its own few
// sizes (so that most allocations are cache hits) and hands some of its
// allocations to another worker to free (pointers passed between threads: a free of
// memory another thread's cache handed out goes to that cache's remote list), while
// a controller thread begins and finishes scopes, trims, and checks a snapshot
// after every step. At the end the totals are exact and the pool holds nothing.

/// How hard to hammer the thread caches.
#[derive(Clone, Copy, Debug)]
pub struct CacheParams {
    /// Worker threads.
    pub threads: u64,
    /// Operations per worker (allocations and frees; the frees of what other workers
    /// passed on come on top).
    pub ops: u64,
    /// Allocations a worker holds live at most (what it passed on not counted).
    pub max_live: usize,
    /// Sizes each worker allocates from (its own, drawn from its seed).
    pub sizes: u64,
    /// Largest size, bytes.
    pub max_bytes: u64,
    /// Half of each worker's sizes small: 512 B to 1 MiB ([`Rng::small_size`]).
    pub small_sizes: bool,
    /// Of the frees, the percentage passed to another worker to do (when its inbox
    /// has room).
    pub cross_percent: u64,
    /// Allocations a worker's inbox holds at most (what others passed to it and it
    /// has not freed yet): a worker not scheduled for a while must not collect
    /// everyone's memory. When it is full, the worker that would pass an allocation
    /// on frees it itself.
    pub inbox: usize,
    /// The workers must all finish within this, else the test fails (deadlock).
    pub limit: Duration,
}

/// Writes something into each allocation and checks it is still there before the
/// allocation is freed (by whichever thread frees it).
pub trait Memory: Send + Sync {
    /// Called once `[ptr, ptr + bytes)` is handed out; `tag` is unique to it.
    fn fill(&self, ptr: DevicePtr, bytes: u64, tag: u64);
    /// Called right before the free of what [`Memory::fill`] was given.
    fn check(&self, ptr: DevicePtr, bytes: u64, tag: u64);
}

/// [`Memory`] on the simulated driver: every byte mapped, with access for device 0,
/// at the hand-out and right before the free (the simulated driver holds no data).
pub struct SimMemory(pub Arc<flare_package::SimDriver>);

impl Memory for SimMemory {
    fn fill(&self, ptr: DevicePtr, bytes: u64, tag: u64) {
        assert_eq!(
            self.0.touch(ptr, bytes, 0),
            CuResult::SUCCESS,
            "{ptr:#x} ({tag:#x})"
        );
    }
    fn check(&self, ptr: DevicePtr, bytes: u64, tag: u64) {
        self.fill(ptr, bytes, tag);
    }
}

/// What the controller thread did.
#[derive(Default, Debug, Clone, Copy)]
struct Control {
    scopes: u64,
    trims: u64,
    snapshots: u64,
}

/// One allocation: address, bytes asked, tag.
type Held = (DevicePtr, u64, u64);

/// A worker of [`hammer_caches`]: `p.ops` operations on its own sizes, some frees
/// passed to other workers through `peers`; then frees what it still holds and
/// what the others pass to it until they are all done.
fn cache_worker(
    pool: &Pool,
    me: u64,
    p: CacheParams,
    peers: Vec<(u64, mpsc::SyncSender<Held>)>,
    inbox: mpsc::Receiver<Held>,
    ranges: &LiveRanges,
    memory: &dyn Memory,
) -> Totals {
    let mut rng = Rng::new(0xCAC4_E000 + me);
    let sizes: Vec<u64> = (0..p.sizes)
        .map(|i| {
            if p.small_sizes && i % 2 == 0 {
                rng.small_size()
            } else {
                1 + rng.below(p.max_bytes)
            }
        })
        .collect();
    let align = if pool.policy().is_segments() {
        SEGMENT_BLOCK_ROUND_BYTES
    } else {
        pool.granularity()
    };
    let mut t = Totals::default();
    let free = |(ptr, bytes, tag): Held, t: &mut Totals| {
        memory.check(ptr, bytes, tag);
        ranges.remove(ptr);
        pool.free_raw(ptr)
            .unwrap_or_else(|e| panic!("worker {me}: free {ptr:#x} ({tag:#x}): {e}"));
        t.frees += 1;
    };
    let mut live: Vec<Held> = Vec::new();
    for op in 0..p.ops {
        while let Ok(h) = inbox.try_recv() {
            free(h, &mut t);
        }
        if (rng.below(2) == 0 && live.len() < p.max_live) || live.is_empty() {
            let bytes = sizes[rng.below(sizes.len() as u64) as usize];
            let ptr = pool
                .allocate_raw(bytes)
                .unwrap_or_else(|e| panic!("worker {me}: allocate {bytes}: {e}"));
            assert_eq!(ptr % align, 0, "{ptr:#x} for {bytes} bytes");
            let tag = (me << 40) | op;
            ranges.insert(ptr, bytes, me);
            memory.fill(ptr, bytes, tag);
            live.push((ptr, bytes, tag));
            t.allocations += 1;
        } else {
            let h = live.swap_remove(rng.below(live.len() as u64) as usize);
            if !peers.is_empty() && rng.below(100) < p.cross_percent {
                let (to, tx) = &peers[rng.below(peers.len() as u64) as usize];
                // A full inbox: this worker frees it itself.
                match tx.try_send(h) {
                    Ok(()) => t.passed += 1,
                    Err(mpsc::TrySendError::Full(h)) => free(h, &mut t),
                    Err(mpsc::TrySendError::Disconnected(_)) => {
                        panic!("worker {to}'s inbox closed while {me} could still send")
                    }
                }
            } else {
                free(h, &mut t);
            }
        }
    }
    for h in live {
        free(h, &mut t);
    }
    // The others may still pass allocations on: free them until every peer is done
    // (each drops its senders when its own operations are done).
    drop(peers);
    for h in inbox.iter() {
        free(h, &mut t);
    }
    t
}

/// The controller of [`hammer_caches`]: until `stop`, a scope (begun, a few
/// snapshots, finished), then a trim; every snapshot checked, its counters never
/// going back.
fn cache_controller(pool: &Pool, stop: &AtomicBool) -> Control {
    let mut c = Control::default();
    let mut last = pool.snapshot();
    let mut look = |c: &mut Control| {
        let s = pool.snapshot();
        if let Err(e) = s.check_invariants() {
            panic!("snapshot invariant broken mid-run: {e}\n{s:#?}");
        }
        assert!(s.allocations >= last.allocations && s.frees >= last.frees);
        assert!(s.reuse_hits >= last.reuse_hits);
        assert!(s.thread_cache_hits >= last.thread_cache_hits);
        assert!(s.remote_frees >= last.remote_frees);
        assert!(s.mappings_created >= last.mappings_created);
        assert!(s.mappings_released >= last.mappings_released);
        assert!(s.peak_physical_bytes >= last.peak_physical_bytes);
        last = s;
        c.snapshots += 1;
    };
    while !stop.load(Ordering::Relaxed) {
        pool.retention_begin()
            .expect("only the controller opens scopes");
        c.scopes += 1;
        for _ in 0..8 {
            look(&mut c);
            thread::sleep(Duration::from_micros(100));
        }
        pool.retention_finish().unwrap();
        look(&mut c);
        thread::sleep(Duration::from_micros(100));
        pool.trim().unwrap();
        c.trims += 1;
        look(&mut c);
    }
    c
}

/// What [`hammer_caches`] did, reconciled with the pool's snapshot.
#[derive(Clone, Copy, Debug)]
pub struct CacheReport {
    /// The snapshot after the workers stopped, before the final finish and trim.
    pub end: flare_package::Snapshot,
    /// Frees passed from one worker to another.
    pub passed: u64,
    pub scopes: u64,
    pub trims: u64,
    pub snapshots_checked: u64,
    pub seconds: f64,
}

/// Runs [`cache_worker`]s against `pool` (each its own sizes, some frees passed to
/// another worker) with a [`cache_controller`] beginning and finishing scopes,
/// trimming and checking snapshots all along; fails if they do not all finish
/// within `p.limit`. Then: the snapshot's counts are those the threads made, and a
/// trim leaves nothing (books and driver compared by [`super::check`]).
pub fn hammer_caches(pool: Arc<Pool>, p: CacheParams, memory: Arc<dyn Memory>) -> CacheReport {
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let controller = {
        let (pool, stop) = (pool.clone(), stop.clone());
        thread::spawn(move || cache_controller(&pool, &stop))
    };
    let ranges = Arc::new(LiveRanges::default());
    let (senders, inboxes): (Vec<_>, Vec<_>) =
        (0..p.threads).map(|_| mpsc::sync_channel(p.inbox)).unzip();
    let (tx, rx) = mpsc::channel();
    for (me, inbox) in (0..p.threads).zip(inboxes) {
        let peers: Vec<(u64, mpsc::SyncSender<Held>)> = (0..p.threads)
            .filter(|&i| i != me)
            .map(|i| (i, senders[i as usize].clone()))
            .collect();
        let (pool, tx, ranges, memory) = (pool.clone(), tx.clone(), ranges.clone(), memory.clone());
        thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                cache_worker(&pool, me, p, peers, inbox, &ranges, &*memory)
            }));
            drop(pool);
            let _ = tx.send((me, r.map_err(|p| panic_message(&*p))));
        });
    }
    drop((senders, tx));
    let deadline = start + p.limit;
    let mut total = Totals::default();
    for _ in 0..p.threads {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, Ok(t))) => total += t,
            Ok((i, Err(msg))) => panic!("worker {i} panicked: {msg}"),
            Err(e) => panic!(
                "workers did not finish within {:?} ({e}): deadlock or livelock?\n{:#?}",
                p.limit,
                pool.snapshot()
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let control = match controller.join() {
        Ok(c) => c,
        Err(e) => panic!("controller: {}", panic_message(&*e)),
    };
    let passed = total.passed;
    let end = pool.snapshot();
    if let Err(e) = end.check_invariants() {
        panic!("{e}\n{end:#?}");
    }
    // Every allocation was freed once, by its own worker or the one it was passed to.
    assert_eq!(
        end.allocations, total.allocations,
        "allocations: books vs threads"
    );
    assert_eq!(end.frees, total.frees, "frees: books vs threads");
    assert_eq!(
        (end.live_count, end.live_requested_bytes),
        (0, 0),
        "{end:#?}"
    );
    assert_eq!(end.scopes_finished, control.scopes, "{end:#?}");
    assert_eq!(end.driver_failures(), 0, "driver calls failed\n{end:#?}");
    assert!(control.scopes > 0 && control.trims > 0, "{control:?}");
    // A remote free is a free passed on (of memory a cache handed out).
    assert!(end.remote_frees <= passed, "{passed} passed on\n{end:#?}");
    assert!(
        end.thread_cache_hits > 0,
        "the caches were never used\n{end:#?}"
    );
    // The controller's last step was a trim, outside a scope: since then the
    // caches hold memory only with no release threshold. A last trim drains them.
    pool.trim().unwrap();
    let s = super::super::check(&pool);
    assert!(!s.scope_open);
    assert_eq!(
        (s.physical_bytes, s.idle_count, s.pending_count),
        (0, 0, 0),
        "{s:#?}"
    );
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes),
        (0, 0),
        "{s:#?}"
    );
    assert_eq!(s.block_free_bytes, 0, "{s:#?}");
    assert_eq!(s.mappings_created, s.mappings_released, "{s:#?}");
    // Counters the drain and the trim do not touch are those of the end.
    assert_eq!(
        (
            s.allocations,
            s.frees,
            s.reuse_hits,
            s.thread_cache_hits,
            s.remote_frees
        ),
        (
            end.allocations,
            end.frees,
            end.reuse_hits,
            end.thread_cache_hits,
            end.remote_frees
        )
    );
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{} threads x {} ops in {seconds:.2} s: {} allocations ({} reuse hits, {} from \
         thread caches, {} mappings created and released), {passed} frees passed on \
         ({} remote frees), {} scopes, {} trims, {} snapshots checked, peak physical {}",
        p.threads,
        p.ops,
        s.allocations,
        s.reuse_hits,
        s.thread_cache_hits,
        s.mappings_created,
        s.remote_frees,
        control.scopes,
        control.trims,
        control.snapshots,
        flare_package::fmt_bytes(s.peak_physical_bytes),
    );
    CacheReport {
        end,
        passed,
        scopes: control.scopes,
        trims: control.trims,
        snapshots_checked: control.snapshots,
        seconds,
    }
}
