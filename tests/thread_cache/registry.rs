//! The registry of caches (at most 256 a pool): threads beyond it use the books,
//! exited threads' caches are adopted (their remote lists given back first), and a
//! pool dropped while threads hold its caches.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::caching::pool;
use crate::common;
use common::{assert_driver_empty, check, simulated_pool, GIB, MIB};
use flare_package::{DriverCall, Error, Pool, PoolConfig, ReusePolicy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// `docs/ARCHITECTURE.md`, "Threads": "A cache is registered on a thread's first
/// call (at most 256 per pool; further threads use the books". With 256 threads
/// holding caches, a 257th thread's free of an address a cached thread allocated
/// goes to the books: it is counted (frees, live bytes) and the memory becomes idle
/// in the books, reused by that thread's next allocation of the size.
#[test]
fn a_thread_beyond_the_cache_registry_frees_through_the_books() {
    use std::sync::{Arc, Barrier};
    let (pool, _sim) = simulated_pool(
        64 << 30,
        PoolConfig {
            // Freed memory stays idle (below the threshold), to be seen and reused.
            release_threshold_bytes: 1 << 30,
            ..PoolConfig::default()
        },
    );
    let pool = Arc::new(pool);
    // The caches serve inside a retention scope.
    pool.retention_begin().unwrap();
    const N: usize = 256;
    let registered = Arc::new(Barrier::new(N + 1));
    let done = Arc::new(Barrier::new(N + 1));
    let mut threads = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..N {
        let (pool, registered, done, tx) = (
            Arc::clone(&pool),
            Arc::clone(&registered),
            Arc::clone(&done),
            tx.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let p = pool.allocate_raw(MIB).unwrap();
            tx.send(p).unwrap();
            registered.wait();
            // Alive (its cache held) until the extra thread is done.
            done.wait();
        }));
    }
    registered.wait();
    let ptrs: Vec<u64> = rx.iter().take(N).collect();
    let before = check(&pool);
    assert_eq!(before.live_count, N as u64);
    let extra = {
        let pool = Arc::clone(&pool);
        let victim = ptrs[0];
        std::thread::spawn(move || {
            pool.free_raw(victim).unwrap();
            let s = check(&pool);
            assert_eq!(s.live_count, N as u64 - 1);
            assert_eq!(s.frees, 1);
            assert_eq!(s.live_mapped_bytes, (N as u64 - 1) * G);
            assert_eq!(s.idle_bytes, G, "idle in the books");
            // Not a cache's entry: nothing was cached.
            assert_eq!(s.thread_cache_count, 0);
            // Freed again: refused, it is no longer live.
            assert!(matches!(
                pool.free_raw(victim),
                Err(Error::UnknownPointer { .. })
            ));
            let again = pool.allocate_raw(MIB).unwrap();
            assert_eq!(again, victim, "the idle mapping is reused");
            pool.free_raw(again).unwrap();
        })
    };
    extra.join().unwrap();
    done.wait();
    for t in threads {
        t.join().unwrap();
    }
    for p in &ptrs[1..] {
        pool.free_raw(*p).unwrap();
    }
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!(s.live_count, 0);
    assert_eq!(s.frees, N as u64 + 1);
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// More threads at once than the registry holds (256 caches per pool): the threads
/// beyond it use the books ("further threads use the books"); frees across threads
/// with and without caches, of memory the caches and the books handed out, keep
/// the snapshot exact, and the scope's end releases everything.
#[test]
fn more_threads_than_caches() {
    let threads = 300usize;
    let (pool, _sim) = pool(4 * GIB, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    let phase = Barrier::new(threads);
    let ptrs: Vec<Mutex<u64>> = (0..threads).map(|_| Mutex::new(0)).collect();
    thread::scope(|t| {
        for i in 0..threads {
            let (pool, phase, ptrs) = (&pool, &phase, &ptrs);
            t.spawn(move || {
                let p = pool.allocate_raw(2 * MIB).unwrap();
                phase.wait();
                pool.free_raw(p).unwrap();
                phase.wait();
                *ptrs[i].lock().unwrap() = pool.allocate_raw(2 * MIB).unwrap();
                phase.wait();
                let q = *ptrs[(i + 1) % threads].lock().unwrap();
                pool.free_raw(q).unwrap();
            });
        }
    });
    let s = check(&pool);
    assert_eq!(
        s.mappings_created, threads as u64,
        "every second allocation reused"
    );
    assert_eq!(s.allocations, 2 * threads as u64);
    assert_eq!(s.reuse_hits, threads as u64);
    assert_eq!(s.thread_cache_hits, 256, "one hit per registered cache");
    assert_eq!(s.live_count, 0);
    assert_eq!(
        (s.idle_count, s.idle_bytes),
        (threads as u64, 2 * MIB * threads as u64)
    );
    assert!(s.thread_cache_count <= 256 * 2);
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.thread_cache_count), (0, 0));
    assert_driver_empty(&pool);
}

/// Threads that exit holding cached memory: their entries stay counted (idle, in
/// the caches) until a thread adopts the orphaned cache, a miss or a release point
/// drains it; a free of memory an exited thread's cache handed out goes to that
/// cache's remote list. Nothing is lost or created twice: the next thread that
/// needs the sizes reuses them, and the scope's end releases everything.
#[test]
fn threads_exit_holding_cached_memory() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, _sim) = pool(GIB, policy);
        let unit = if policy.is_segments() { 8192 } else { 2 * MIB };
        pool.retention_begin().unwrap();
        // The main thread gets a cache of its own first (one entry of 7 units):
        // it never adopts an exited thread's.
        let m = pool.allocate_raw(7 * unit).unwrap();
        pool.free_raw(m).unwrap();
        // Four threads each cache four entries and leave one allocation live that
        // their cache handed out. Every thread allocates before any frees (no miss
        // drains another thread's cache).
        let allocated = Barrier::new(4);
        let live: Vec<u64> = thread::scope(|t| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    t.spawn(|| {
                        let ptrs: Vec<u64> = (1..=5)
                            .map(|i| pool.allocate_raw(i * unit).unwrap())
                            .collect();
                        allocated.wait();
                        for &p in &ptrs {
                            pool.free_raw(p).unwrap();
                        }
                        pool.allocate_raw(5 * unit).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let s = check(&pool);
        // 4 entries per exited thread, and the main thread's: with whole mappings it
        // stays cached (7 units is more than 30% above any request); in segment mode
        // the threads' first misses take every cached small block (the main thread's
        // included) back to its heap before a growth, where it coalesces.
        let main_cached = u64::from(!policy.is_segments());
        assert_eq!(s.thread_cache_count, 16 + main_cached, "{policy:?}");
        assert_eq!(s.thread_cache_hits, 4);
        assert_eq!(s.live_count, 4);
        let created = s.mappings_created;
        // The main thread frees what the exited threads' caches handed out.
        for p in live {
            pool.free_raw(p).unwrap();
        }
        let s = check(&pool);
        assert_eq!(
            s.thread_cache_count,
            20 + main_cached,
            "remote frees to the exited threads' caches"
        );
        assert_eq!(s.remote_frees, 4);
        assert_eq!(s.live_count, 0);
        // New threads need the same sizes: nothing new is created.
        thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| {
                    let ptrs: Vec<u64> = (1..=5)
                        .map(|i| pool.allocate_raw(i * unit).unwrap())
                        .collect();
                    for p in ptrs {
                        pool.free_raw(p).unwrap();
                    }
                });
            }
        });
        let s = check(&pool);
        assert_eq!(
            s.mappings_created, created,
            "{policy:?}: the cached memory served"
        );
        assert_eq!(s.live_count, 0);
        pool.retention_finish().unwrap();
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.physical_bytes), (0, 0));
        assert_driver_empty(&pool);
    }
}

/// An exited thread's cache whose own entries are empty but whose remote list is
/// not is adopted with its remote list given back to the books first
/// (`Caches::register`: "an orphan adopted (what its exited thread left goes back
/// to the books first"; `Snapshot::thread_cache_count` counts remote lists).
///
/// This thread registers its cache first (a live 4 MiB allocation), so it is not
/// the one that adopts. Thread A allocates 2 MiB: a miss, a new mapping, live
/// through A's cache (the books' hand-out is adopted by the allocating thread); A
/// exits with nothing in its cache. This thread frees it: memory another thread's
/// cache handed out goes on that cache's remote list (`remote_frees` 1, counted in
/// `thread_cache_count` and `idle_count`). Thread C, with no cache, asks for 2 MiB:
/// it adopts A's cache, whose remote entry goes to the books first, so its own
/// cache is empty and the request is served by the books' idle mapping: a reuse hit
/// (the same address, no new mapping), not a thread-cache hit. Were the remote
/// list left in the adopted cache, C's pop would take it and count a cache hit.
#[test]
fn an_adopted_caches_remote_list_goes_back_to_the_books() {
    let (pool, sim) = simulated_pool(
        1 << 30,
        PoolConfig {
            release_threshold_bytes: u64::MAX,
            thread_cache_entries: 32,
            ..PoolConfig::default()
        },
    );
    let keep = pool.allocate_raw(4 * MIB).unwrap();
    let a = std::thread::scope(|t| t.spawn(|| pool.allocate_raw(2 * MIB).unwrap()).join()).unwrap();
    pool.free_raw(a).unwrap();
    let s = check(&pool);
    assert_eq!((s.remote_frees, s.frees), (1, 1));
    assert_eq!(
        (s.thread_cache_count, s.thread_cache_bytes, s.idle_count),
        (1, 2 * MIB, 1)
    );
    let c = std::thread::scope(|t| t.spawn(|| pool.allocate_raw(2 * MIB).unwrap()).join()).unwrap();
    assert_eq!(c, a, "the idle mapping the adoption gave back to the books");
    let s = check(&pool);
    assert_eq!(
        (s.reuse_hits, s.thread_cache_hits, s.mappings_created),
        (1, 0, 2),
        "served by the books, not by the adopted cache"
    );
    assert_eq!(sim.call_count(DriverCall::Create), 2);
    assert_eq!(
        (s.live_count, s.idle_count, s.thread_cache_count),
        (2, 0, 0)
    );
    pool.free_raw(c).unwrap();
    pool.free_raw(keep).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

/// Sets its flag when dropped, on a panic's unwinding too.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// With all 256 registry slots taken by live threads, a further thread has no
/// cache (its pair goes through the books); once one of those threads exits, the
/// further thread's next call adopts its orphaned cache (after draining it) and
/// then hits. The registry is not searched while it is full with no orphan, so
/// this checks that an exit is still seen.
#[test]
fn a_full_registry_hands_an_exited_threads_cache_to_a_waiting_thread() {
    let holders = 256usize;
    let (pool, sim) = pool(4 * GIB, ReusePolicy::BestFit);
    pool.retention_begin().unwrap();
    // Every holder allocates before any frees (a miss takes what fits from other
    // caches: a later holder would take an earlier one's idle 2 MiB).
    let allocated = Barrier::new(holders);
    let registered = Barrier::new(holders + 1);
    // Set on the way out of the scope, a panic included (a barrier would hang).
    let finished = AtomicBool::new(false);
    let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
    let mut leave_rx = Some(leave_rx);
    thread::scope(|t| {
        let _finish = SetOnDrop(&finished);
        let mut leaver = None;
        for i in 0..holders {
            let (pool, allocated, registered, finished) =
                (&pool, &allocated, &registered, &finished);
            let rx = if i == 0 { leave_rx.take() } else { None };
            let h = t.spawn(move || {
                let a = pool.allocate_raw(2 * MIB).unwrap();
                allocated.wait();
                pool.free_raw(a).unwrap();
                registered.wait();
                match rx {
                    Some(rx) => {
                        let _ = rx.recv();
                    }
                    None => {
                        while !finished.load(Ordering::SeqCst) {
                            thread::sleep(std::time::Duration::from_millis(1));
                        }
                    }
                }
            });
            if i == 0 {
                leaver = Some(h);
            }
        }
        registered.wait();
        // Every slot is a live thread's, each holding its own 2 MiB.
        let s = check(&pool);
        assert_eq!((s.thread_cache_count, s.thread_cache_hits), (256, 0));
        assert_eq!(s.mappings_created, 256);
        // No cache for this thread: 4 MiB is created (no 2 MiB entry fits it),
        // freed to the books and reused from them.
        let p = pool.allocate_raw(4 * MIB).unwrap();
        pool.free_raw(p).unwrap();
        assert_eq!(
            check(&pool).thread_cache_count,
            256,
            "the free went to the books"
        );
        assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), p);
        let s = check(&pool);
        assert_eq!((s.reuse_hits, s.thread_cache_hits), (1, 0));
        leave_tx.send(()).unwrap();
        leaver.take().unwrap().join().unwrap();
        // The leaver's cache is orphaned: this free registers, adopts it (its 2 MiB
        // goes to the books) and caches `p`; the next allocation hits.
        pool.free_raw(p).unwrap();
        let s = check(&pool);
        assert_eq!(
            (s.thread_cache_count, s.thread_cache_bytes),
            (256, 255 * 2 * MIB + 4 * MIB)
        );
        assert_eq!(pool.allocate_raw(4 * MIB).unwrap(), p);
        assert_eq!(check(&pool).thread_cache_hits, 1);
        pool.free_raw(p).unwrap();
    });
    pool.retention_finish().unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.mappings_created), (0, 257));
    assert_driver_empty(&pool);
    drop(sim);
}

/// A pool dropped while other threads still hold its caches in their
/// thread-locals (cached entries and cache-handed memory included): the drop
/// releases everything, and those threads go on with other pools.
#[test]
fn pool_dropped_while_threads_hold_its_caches() {
    let go = Arc::new(Barrier::new(2));
    let dropped = Arc::new(Barrier::new(2));
    let (pool, sim) = pool(GIB, ReusePolicy::BestFit);
    let pool = Arc::new(pool);
    {
        let p2 = Arc::clone(&pool);
        let (go2, dropped2) = (Arc::clone(&go), Arc::clone(&dropped));
        let h = thread::spawn(move || {
            p2.retention_begin().unwrap();
            let a = p2.allocate_raw(2 * MIB).unwrap();
            p2.free_raw(a).unwrap();
            let live = p2.allocate_raw(2 * MIB).unwrap(); // cache-handed, never freed
            let b = p2.allocate_raw(4 * MIB).unwrap();
            p2.free_raw(b).unwrap(); // cached
            assert_eq!(p2.snapshot().thread_cache_hits, 1);
            let _ = live;
            drop(p2);
            go2.wait();
            dropped2.wait();
            // This thread's locals still name the dropped pool's cache; other pools
            // work, on this thread, many at once.
            let pools: Vec<Pool> = (0..20)
                .map(|_| Pool::new(PoolConfig::default()).unwrap())
                .collect();
            for p in &pools {
                p.retention_begin().unwrap();
            }
            for round in 0..3 {
                for p in &pools {
                    let x = p.allocate_raw(2 * MIB).unwrap();
                    p.free_raw(x).unwrap();
                    assert_eq!(p.snapshot().thread_cache_hits, round);
                }
            }
            for p in &pools {
                p.retention_finish().unwrap();
                let s = check(p);
                assert_eq!((s.physical_bytes, s.thread_cache_hits), (0, 2));
                assert_driver_empty(p);
            }
        });
        go.wait();
        // The last reference: the pool is dropped here, on another thread than the
        // one whose locals hold its cache.
        let pool = Arc::try_unwrap(pool).expect("the other thread let go");
        drop(pool);
        dropped.wait();
        h.join().unwrap();
    }
    let d = sim.state();
    assert_eq!(
        (d.physical_bytes, d.handles, d.mappings, d.reservations),
        (0, 0, 0, 0)
    );
}
