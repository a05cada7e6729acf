//! A request larger than the whole device is refused at once (the contract of
//! `Error::RequestTooLarge`, `Pool::allocate_raw` and the header's
//! `FLARE_STATUS_REQUEST_TOO_LARGE`: "no driver call, nothing released, nothing
//! counted"), whatever the pool holds: memory in a thread cache, free handles of
//! segments, stream-freed memory whose fences have completed, a stream being
//! captured. Found by the `c_abi` fuzz target (issue 34): the size was checked only
//! once the reuse attempts had run, which drained caches, released handles, polled
//! fences and counted captures. A request of exactly the device's total is not too
//! large.

use crate::common;

use common::{assert_driver_empty, check, simulated_pool, stream, MIB};
use flare_package::driver::sim::{SimState, SimStreamCall};
use flare_package::{
    CaptureMode, CuResult, DriverCall, DriverError, Error, Pool, PoolConfig, ReusePolicy,
    SimDriver, Snapshot,
};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// The simulated device's capacity: every request below is larger.
const CAPACITY: u64 = 64 * MIB;

/// What a refused request must leave as it was: the pool's counters, what the
/// driver holds, and every driver and stream call count.
#[derive(Debug, PartialEq)]
struct Seen {
    snapshot: Snapshot,
    held: SimState,
    calls: Vec<u64>,
    stream_calls: Vec<u64>,
}

fn seen(pool: &Pool, sim: &SimDriver) -> Seen {
    Seen {
        snapshot: pool.snapshot(),
        held: sim.state(),
        calls: DriverCall::ALL.iter().map(|&c| sim.call_count(c)).collect(),
        stream_calls: SimStreamCall::ALL
            .iter()
            .map(|&c| sim.stream_call_count(c))
            .collect(),
    }
}

/// Each request of `requests` is refused as too large and changes nothing.
#[track_caller]
fn refused_changing_nothing(
    pool: &Pool,
    sim: &SimDriver,
    requests: &[(&str, &dyn Fn() -> flare_package::Result<u64>)],
) {
    for (what, request) in requests {
        let before = seen(pool, sim);
        match request() {
            Err(Error::RequestTooLarge { device_total, .. }) => {
                assert_eq!(device_total, CAPACITY, "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(seen(pool, sim), before, "{what} changed the pool");
    }
}

fn config(policy: ReusePolicy) -> PoolConfig {
    PoolConfig {
        reuse_policy: policy,
        // Nothing is released at a free: caches hold memory, free handles stay.
        release_threshold_bytes: u64::MAX,
        ..PoolConfig::default()
    }
}

#[test]
fn with_memory_in_the_thread_cache() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = simulated_pool(CAPACITY, config(policy));
        // 1 MiB: a block a cache takes in segment mode too.
        let a = pool.allocate_raw(MIB).unwrap();
        pool.free_raw(a).unwrap();
        assert_eq!(pool.snapshot().thread_cache_count, 1, "{policy:?}");
        refused_changing_nothing(
            &pool,
            &sim,
            &[
                ("allocate", &|| pool.allocate_raw(CAPACITY + 1)),
                ("allocate of 2^62", &|| pool.allocate_raw(1 << 62)),
                ("tagged", &|| {
                    pool.allocate_tagged_raw(CAPACITY + 1, None, 3)
                }),
            ],
        );
    }
}

#[test]
fn with_free_handles_of_segments() {
    let (pool, sim) = simulated_pool(
        CAPACITY,
        PoolConfig {
            thread_cache_entries: 0,
            ..config(ReusePolicy::Segments)
        },
    );
    let s = stream(&sim);
    let a = pool.allocate_raw(MIB).unwrap();
    let b = pool.allocate_async_raw(3 * MIB, s).unwrap();
    let c = pool.allocate_tagged_raw(MIB, None, 5).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    pool.free_raw(c).unwrap();
    assert!(pool.snapshot().block_free_bytes > 0);
    refused_changing_nothing(
        &pool,
        &sim,
        &[
            ("allocate", &|| pool.allocate_raw(CAPACITY + 1)),
            ("allocate_async", &|| {
                pool.allocate_async_raw(CAPACITY + 1, s)
            }),
            ("tagged", &|| {
                pool.allocate_tagged_raw(CAPACITY + 1, None, 5)
            }),
            ("tagged on a stream", &|| {
                pool.allocate_tagged_raw(CAPACITY + 1, Some(s), 5)
            }),
        ],
    );
}

#[test]
fn with_stream_freed_memory_whose_work_completed() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = simulated_pool(CAPACITY, config(policy));
        let (s, t) = (stream(&sim), stream(&sim));
        let a = pool.allocate_async_raw(4 * MIB, s).unwrap();
        assert_eq!(sim.launch(s.0, a, 4 * MIB), CuResult::SUCCESS);
        pool.free_async_raw(a, s).unwrap();
        // The work is done, but no call has fenced or polled the free yet: another
        // stream's allocation would (an event recorded on `s`, then queried).
        assert_eq!(sim.stream_complete(s.0), CuResult::SUCCESS);
        refused_changing_nothing(
            &pool,
            &sim,
            &[
                ("allocate_async on another stream", &|| {
                    pool.allocate_async_raw(CAPACITY + 1, t)
                }),
                ("allocate", &|| pool.allocate_raw(CAPACITY + 1)),
                ("tagged on a stream", &|| {
                    pool.allocate_tagged_raw(CAPACITY + 1, Some(t), 2)
                }),
            ],
        );
    }
}

#[test]
fn on_a_stream_being_captured() {
    for policy in [ReusePolicy::BestFit, ReusePolicy::Segments] {
        let (pool, sim) = simulated_pool(CAPACITY, config(policy));
        let s = stream(&sim);
        assert_eq!(
            sim.stream_begin_capture(s.0, CaptureMode::Global),
            CuResult::SUCCESS
        );
        refused_changing_nothing(
            &pool,
            &sim,
            &[
                ("allocate_async", &|| {
                    pool.allocate_async_raw(CAPACITY + 1, s)
                }),
                ("tagged on it", &|| {
                    pool.allocate_tagged_raw(CAPACITY + 1, Some(s), 4)
                }),
            ],
        );
        assert_eq!(pool.snapshot().captures_seen, 0, "{policy:?}");
        assert_eq!(sim.stream_end_capture(s.0), CuResult::SUCCESS);
    }
}

/// `Pool::allocate_raw`: "[`Error::RequestTooLarge`] when the rounded size is
/// *above* the device's total memory". A request of exactly the total is a valid
/// request: on an empty device whose capacity is the total, it succeeds; beside a
/// live allocation it is an out-of-memory, not too large.
#[test]
fn a_request_of_exactly_the_device_total_is_not_too_large() {
    let total = 64 * MIB;
    let (pool, sim) = simulated_pool(total, PoolConfig::default());
    assert_eq!(sim.mem_get_info().unwrap().total, total);
    let all = pool.allocate_raw(total).expect("the whole empty device");
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.live_mapped_bytes), (total, total));
    assert_eq!(sim.state().physical_bytes, total);
    pool.free_raw(all).unwrap();
    assert_driver_empty(&pool);

    // One byte less, rounded up: the same total.
    let all = pool
        .allocate_raw(total - 1)
        .expect("rounds up to the total");
    pool.free_raw(all).unwrap();

    // Beside a live allocation: out of memory (after the release and retry),
    // never too large.
    let small = pool.allocate_raw(G).unwrap();
    let err = pool.allocate_raw(total).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: total,
            live: G,
            idle: 0,
            in_scope: false,
            source: Some(DriverError::new(
                DriverCall::Create,
                CuResult::OUT_OF_MEMORY
            )),
        }
    );
    // One byte more rounds to a granule more: too large, at once.
    let before = check(&pool);
    let creates = sim.call_count(DriverCall::Create);
    let err = pool.allocate_raw(total + 1).unwrap_err();
    assert_eq!(
        err,
        Error::RequestTooLarge {
            requested: total + G,
            device_total: total,
        }
    );
    assert_eq!(check(&pool), before, "nothing counted");
    assert_eq!(
        sim.call_count(DriverCall::Create),
        creates,
        "no driver call"
    );
    pool.free_raw(small).unwrap();
    assert_driver_empty(&pool);
}
