//! One concern in one file: the failure classes.
//!
//! One regression test per failure class that public VMM allocators get wrong, on the
//! simulated driver: each a short sequence with the exact counters the contract
//! (docs/ARCHITECTURE.md, "Operations and their contracts" and the release ordering)
//! says it must leave. Then every error variant's message: the call, the `CUresult`
//! name and number, the sizes, and what to do.

use crate::common;

use common::{assert_driver_empty, check, GIB, MIB};
use flare_package::{
    CuResult, DriverCall, Error, Pool, PoolConfig, ReusePolicy, SimConfig, SimDriver,
};
use std::sync::Arc;

fn pool_with(threshold: u64, capacity: u64) -> (Pool, Arc<SimDriver>) {
    let pool = Pool::new(PoolConfig {
        release_threshold_bytes: threshold,
        ..PoolConfig::simulated(SimConfig {
            capacity_bytes: capacity,
            ..SimConfig::default()
        })
    })
    .unwrap();
    let sim = pool.sim_driver().unwrap().clone();
    (pool, sim)
}

fn sim_pool() -> (Pool, Arc<SimDriver>) {
    pool_with(0, 140 * GIB)
}

/// Calls of each kind: create, reserve, map, set-access, unmap, release, free VA, sync.
fn calls(sim: &SimDriver) -> [u64; 8] {
    use DriverCall::*;
    [
        Create,
        Reserve,
        Map,
        SetAccess,
        Unmap,
        Release,
        FreeReservation,
        Synchronize,
    ]
    .map(|c| sim.call_count(c))
}

fn driver_error(e: &Error) -> (DriverCall, CuResult, u64) {
    match e {
        Error::Driver { source, bytes } => (source.call, source.code, *bytes),
        e => panic!("expected a driver error, got {e:?}"),
    }
}

#[test]
fn a_failed_map_after_create_releases_the_handle() {
    let (pool, sim) = sim_pool();
    for code in [CuResult::NOT_SUPPORTED, CuResult::INVALID_VALUE] {
        sim.inject_failure(DriverCall::Map, 1, code);
        let e = pool.allocate_raw(3 * MIB).unwrap_err();
        assert_eq!(driver_error(&e), (DriverCall::Map, code, 4 * MIB));
    }
    // Each attempt: create, reserve, map (fails); undone in reverse: free the
    // reservation, release the handle. No unmap (nothing was mapped), no set-access.
    assert_eq!(calls(&sim), [2, 2, 2, 0, 0, 2, 2, 0]);
    let s = check(&pool);
    assert_eq!(
        (
            s.map_failures,
            s.mappings_created,
            s.allocations,
            s.pending_count
        ),
        (2, 0, 0, 0)
    );
    assert_eq!((s.physical_bytes, s.reserved_bytes), (0, 0));
    assert_driver_empty(&pool);
    // Nothing is poisoned: the next allocation works.
    let p = pool.allocate_raw(3 * MIB).unwrap();
    assert_eq!(check(&pool).mappings_created, 1);
    pool.free_raw(p).unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn a_failed_set_access_unmaps_and_books_nothing() {
    let (pool, sim) = sim_pool();
    sim.inject_failure(DriverCall::SetAccess, 1, CuResult::INVALID_VALUE);
    let e = pool.allocate_raw(2 * MIB).unwrap_err();
    assert_eq!(
        driver_error(&e),
        (DriverCall::SetAccess, CuResult::INVALID_VALUE, 2 * MIB)
    );
    // create, reserve, map, set-access (fails); unmap, free VA, release.
    assert_eq!(calls(&sim), [1, 1, 1, 1, 1, 1, 1, 0]);
    let s = check(&pool);
    assert_eq!(
        (
            s.access_failures,
            s.live_count,
            s.idle_count,
            s.pending_count
        ),
        (1, 0, 0, 0)
    );
    assert_eq!(
        (s.physical_bytes, s.reserved_bytes, s.mappings_created),
        (0, 0, 0)
    );
    assert_driver_empty(&pool);
}

#[test]
fn a_failed_set_access_whose_unmap_also_fails_is_kept_pending_not_freed() {
    let (pool, sim) = sim_pool();
    sim.inject_failure(DriverCall::SetAccess, 1, CuResult::INVALID_VALUE);
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    let e = pool.allocate_raw(2 * MIB).unwrap_err();
    assert_eq!(
        driver_error(&e).0,
        DriverCall::SetAccess,
        "the first failure"
    );
    // The reservation is not freed under the live mapping, nor the handle released:
    // no free VA, no release after the failed unmap.
    assert_eq!(calls(&sim), [1, 1, 1, 1, 1, 0, 0, 0]);
    let s = check(&pool);
    assert_eq!(
        (
            s.access_failures,
            s.unmap_failures,
            s.reservation_free_failures
        ),
        (1, 1, 0)
    );
    assert_eq!((s.pending_count, s.pending_bytes), (1, 2 * MIB));
    assert_eq!((s.physical_bytes, s.reserved_bytes), (2 * MIB, 2 * MIB));
    let d = sim.state();
    assert_eq!(
        (d.mappings, d.access_grants),
        (1, 0),
        "mapped, never accessible"
    );
    // The next release point retries: unmap, release, free VA (no synchronize: no
    // work can touch a range that never had access).
    pool.trim().unwrap();
    assert_eq!(calls(&sim), [1, 1, 1, 1, 2, 1, 1, 0]);
    let s = check(&pool);
    assert_eq!(
        (
            s.pending_count,
            s.pending_bytes,
            s.physical_bytes,
            s.reserved_bytes
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(s.unmap_failures, 1);
    assert_driver_empty(&pool);
}

#[test]
fn out_of_memory_from_create_stops_before_reserve_and_map() {
    let (pool, sim) = sim_pool();
    pool.retention_begin().unwrap();
    let t = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(t).unwrap();
    let before = calls(&sim);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let e = pool.allocate_raw(2 * GIB).unwrap_err();
    match e {
        Error::OutOfMemory {
            requested,
            live,
            idle,
            in_scope,
            source,
        } => {
            assert_eq!((requested, live, idle, in_scope), (2 * GIB, 0, GIB, true));
            assert_eq!(
                source.map(|s| (s.call, s.code)),
                Some((DriverCall::Create, CuResult::OUT_OF_MEMORY))
            );
        }
        e => panic!("{e:?}"),
    }
    let after = calls(&sim);
    assert_eq!(after[0], before[0] + 1, "one create");
    assert_eq!(
        &after[1..],
        &before[1..],
        "no reserve, no map, nothing released"
    );
    let s = check(&pool);
    assert_eq!(
        (
            s.create_failures,
            s.oom_retries,
            s.idle_bytes,
            s.physical_bytes
        ),
        (1, 0, GIB, GIB)
    );
    pool.retention_finish().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn out_of_memory_outside_a_scope_releases_idle_then_retries_once() {
    let (pool, sim) = pool_with(u64::MAX, 140 * GIB);
    let a = pool.allocate_raw(GIB).unwrap();
    let b = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(a).unwrap();
    pool.free_raw(b).unwrap();
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let c = pool.allocate_raw(3 * GIB).unwrap();
    // create (fails), synchronize, 2 x (unmap, release, free VA), then a full create.
    assert_eq!(calls(&sim), [4, 3, 3, 3, 2, 2, 2, 1]);
    let s = check(&pool);
    assert_eq!(
        (
            s.oom_retries,
            s.create_failures,
            s.mappings_released,
            s.mappings_created
        ),
        (1, 1, 2, 3)
    );
    assert_eq!(
        (s.idle_bytes, s.physical_bytes, s.live_count),
        (0, 3 * GIB, 1)
    );
    pool.free_raw(c).unwrap();
    pool.trim().unwrap();
    assert_driver_empty(&pool);
}

#[test]
fn out_of_memory_outside_a_scope_with_a_refused_release_keeps_idle_reusable() {
    let (pool, sim) = pool_with(u64::MAX, 140 * GIB);
    let a = pool.allocate_raw(2 * GIB).unwrap();
    pool.free_raw(a).unwrap();
    sim.inject_failure(
        DriverCall::Synchronize,
        1,
        CuResult::STREAM_CAPTURE_UNSUPPORTED,
    );
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    sim.inject_failure(DriverCall::Create, 1, CuResult::OUT_OF_MEMORY);
    let e = pool.allocate_raw(5 * GIB).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory { requested, live: 0, idle, in_scope: false, source: Some(_) }
                if requested == 5 * GIB && idle == 2 * GIB
        ),
        "{e:?}"
    );
    assert_eq!(
        sim.call_count(DriverCall::Unmap),
        0,
        "a failed sync unmaps nothing"
    );
    let s = check(&pool);
    assert_eq!(
        (
            s.oom_retries,
            s.create_failures,
            s.sync_failures,
            s.idle_bytes
        ),
        (1, 2, 1, 2 * GIB)
    );
    // Still whole and reusable.
    assert_eq!(pool.allocate_raw(2 * GIB).unwrap(), a);
    assert_eq!(check(&pool).reuse_hits, 1);
    drop(pool);
    assert_eq!(sim.state().handles, 0);
}

#[test]
fn a_failed_unmap_never_frees_the_reservation_and_the_mapping_stays_reusable() {
    let (pool, sim) = sim_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    pool.free_raw(p).unwrap();
    // sync, unmap (fails): no release, no free VA.
    assert_eq!(calls(&sim)[4..], [1, 0, 0, 1]);
    let s = check(&pool);
    assert_eq!(
        (
            s.unmap_failures,
            s.reservation_free_failures,
            s.idle_count,
            s.idle_bytes
        ),
        (1, 0, 1, 2 * MIB)
    );
    assert_eq!(
        (
            s.pending_count,
            s.physical_bytes,
            s.reserved_bytes,
            s.mappings_released
        ),
        (0, 2 * MIB, 2 * MIB, 0)
    );
    assert_eq!(sim.state().access_grants, 1, "whole: mapped, access kept");
    // Reused with no driver call.
    let q = pool.allocate_raw(MIB).unwrap();
    assert_eq!(q, p);
    assert_eq!(calls(&sim)[4..], [1, 0, 0, 1]);
    // Freed again: released for good.
    pool.free_raw(q).unwrap();
    assert_eq!(calls(&sim)[4..], [2, 1, 1, 2]);
    let s = check(&pool);
    assert_eq!(
        (s.unmap_failures, s.mappings_released, s.reuse_hits),
        (1, 1, 1)
    );
    assert_driver_empty(&pool);
}

#[test]
fn a_failed_unmap_is_retried_at_the_next_release_point() {
    let (pool, sim) = pool_with(4 * MIB, 140 * GIB);
    let p = pool.allocate_raw(2 * MIB).unwrap();
    let big = pool.allocate_raw(8 * MIB).unwrap();
    pool.free_raw(p).unwrap(); // cached under the threshold
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    pool.free_raw(big).unwrap(); // over the threshold: released; the unmap fails
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.idle_bytes, s.unmap_failures),
        (2, 10 * MIB, 1)
    );
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.idle_count, s.mappings_released, s.physical_bytes),
        (0, 2, 0)
    );
    assert_eq!(sim.call_count(DriverCall::FreeReservation), 2);
    assert_driver_empty(&pool);
}

#[test]
fn a_failed_handle_release_is_retried_once_never_twice() {
    let (pool, sim) = sim_pool();
    let p = pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    pool.free_raw(p).unwrap();
    // sync, unmap, release (fails), free VA: the VA goes, the handle stays pending.
    assert_eq!(calls(&sim)[4..], [1, 1, 1, 1]);
    let s = check(&pool);
    assert_eq!(
        (s.release_failures, s.pending_count, s.pending_bytes),
        (1, 1, 2 * MIB)
    );
    assert_eq!(
        (
            s.physical_bytes,
            s.reserved_bytes,
            s.idle_count,
            s.mappings_released
        ),
        (2 * MIB, 0, 0, 0)
    );
    let d = sim.state();
    assert_eq!((d.handles, d.mappings, d.reservations), (1, 0, 0));
    // "Sleep / wake": the next release point releases the handle once.
    pool.trim().unwrap();
    assert_eq!(sim.call_count(DriverCall::Release), 2);
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!(
        (
            s.release_failures,
            s.pending_count,
            s.physical_bytes,
            s.mappings_released
        ),
        (1, 0, 0, 1),
        "no second release (which the driver would refuse with INVALID_VALUE)"
    );
    drop(pool);
    assert_eq!(sim.call_count(DriverCall::Release), 2);
    assert_eq!(sim.state().handles, 0);
}

#[test]
fn a_failed_reservation_free_is_retried_once() {
    let (pool, sim) = sim_pool();
    let p = pool.allocate_raw(4 * MIB).unwrap();
    sim.inject_failure(DriverCall::FreeReservation, 1, CuResult::UNKNOWN);
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!(
        (
            s.reservation_free_failures,
            s.pending_count,
            s.pending_bytes
        ),
        (1, 1, 0)
    );
    assert_eq!((s.physical_bytes, s.reserved_bytes), (0, 4 * MIB));
    let q = pool.allocate_raw(4 * MIB).unwrap();
    assert_ne!(q, p, "a pending leftover is never handed out");
    pool.free_raw(q).unwrap(); // a release point: the leftover is retried too
    assert_eq!(calls(&sim)[4..], [2, 2, 3, 2]);
    let s = check(&pool);
    assert_eq!(
        (
            s.reservation_free_failures,
            s.pending_count,
            s.reserved_bytes,
            s.mappings_released
        ),
        (1, 0, 0, 2)
    );
    assert_driver_empty(&pool);
}

#[test]
fn a_failed_capability_query_does_not_poison_later_calls() {
    let sim = Arc::new(SimDriver::default());
    sim.inject_failure(DriverCall::Granularity, 1, CuResult::UNKNOWN);
    let e = Pool::with_driver(PoolConfig::default(), sim.clone()).unwrap_err();
    assert_eq!(
        driver_error(&e),
        (DriverCall::Granularity, CuResult::UNKNOWN, 0)
    );
    assert_eq!(
        e.to_string(),
        "driver call cuMemGetAllocationGranularity failed with CUDA_ERROR_UNKNOWN (999); \
         nothing was leaked; the pool is still usable"
    );
    let pool = Pool::with_driver(PoolConfig::default(), sim.clone()).unwrap();
    assert_eq!(pool.granularity(), 2 * MIB);
    let p = pool.allocate_raw(MIB).unwrap();
    pool.free_raw(p).unwrap();
    let s = pool.snapshot();
    assert_eq!(
        (s.mappings_created, s.mappings_released, s.physical_bytes),
        (1, 1, 0)
    );
    assert_eq!(sim.state().handles, 0);
}

#[test]
fn nothing_is_unmapped_while_work_is_in_flight() {
    let (pool, sim) = sim_pool();
    let p = pool.allocate_raw(64 * MIB).unwrap();
    sim.mark_busy(p, 64 * MIB);
    // A capture elsewhere: the synchronize is refused, so nothing is unmapped.
    assert!(sim.begin_capture().is_success());
    pool.free_raw(p).unwrap();
    let s = check(&pool);
    assert_eq!(
        (s.sync_failures, s.idle_count, s.idle_bytes),
        (1, 1, 64 * MIB)
    );
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    let e = pool.trim().unwrap_err();
    assert_eq!(
        driver_error(&e),
        (
            DriverCall::Synchronize,
            CuResult::STREAM_CAPTURE_UNSUPPORTED,
            0
        )
    );
    assert_eq!(sim.end_capture(), CuResult::STREAM_CAPTURE_INVALIDATED);
    // A lost context: refused again, still nothing unmapped.
    sim.inject_failure(DriverCall::Synchronize, 1, CuResult::ILLEGAL_ADDRESS);
    assert!(pool.trim().is_err());
    assert_eq!(sim.call_count(DriverCall::Unmap), 0);
    assert_eq!(sim.busy_ranges(), vec![(p, 64 * MIB)]);
    // The work is done at the next successful synchronize; then it goes.
    pool.trim().unwrap();
    let s = check(&pool);
    assert_eq!(
        (
            s.sync_failures,
            s.idle_count,
            s.physical_bytes,
            s.mappings_released
        ),
        (3, 0, 0, 1)
    );
    assert!(sim.faults().is_empty());
    assert_driver_empty(&pool);
}

#[test]
fn drop_retries_once_and_leaves_refused_memory_in_order() {
    // One refused synchronize: drop's retry releases everything.
    let (pool, sim) = sim_pool();
    pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Synchronize, 1, CuResult::ILLEGAL_ADDRESS);
    pool.destroy().unwrap();
    assert_eq!(sim.call_count(DriverCall::Synchronize), 2);
    assert_eq!(sim.state(), Default::default());

    // Refused twice: reported, and nothing unmapped under possible work.
    let (pool, sim) = sim_pool();
    pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Synchronize, 1, CuResult::ILLEGAL_ADDRESS);
    sim.inject_failure(DriverCall::Synchronize, 1, CuResult::ILLEGAL_ADDRESS);
    let e = pool.destroy().unwrap_err();
    assert_eq!(driver_error(&e).0, DriverCall::Synchronize);
    assert_eq!(calls(&sim)[4..], [0, 0, 0, 2]);
    let d = sim.state();
    assert_eq!((d.handles, d.mappings, d.reservations), (1, 1, 1));

    // Unmap refused twice: the reservation is never freed under the mapping.
    let (pool, sim) = sim_pool();
    pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    let e = pool.destroy().unwrap_err();
    assert_eq!(driver_error(&e).0, DriverCall::Unmap);
    assert_eq!(calls(&sim)[4..], [2, 0, 0, 2]);
    let d = sim.state();
    assert_eq!((d.handles, d.mappings, d.reservations), (1, 1, 1));

    // A handle release refused once: retried by drop, released exactly once.
    let (pool, sim) = sim_pool();
    pool.allocate_raw(2 * MIB).unwrap();
    sim.inject_failure(DriverCall::Release, 1, CuResult::UNKNOWN);
    drop(pool);
    assert_eq!(calls(&sim)[4..], [1, 2, 1, 1]);
    assert_eq!(sim.state(), Default::default());
}

#[test]
fn every_error_message_says_call_code_sizes_and_what_to_do() {
    let (pool, sim) = pool_with(0, 4 * GIB);
    assert_eq!(
        pool.allocate_raw(0).unwrap_err().to_string(),
        "invalid argument: allocation of 0 bytes"
    );
    assert_eq!(
        pool.free_raw(0x1234).unwrap_err().to_string(),
        "unknown pointer 0x1234: not an allocation of this pool (interior pointer, or already freed)"
    );
    assert_eq!(
        pool.trim().map(|_| "ok").unwrap(),
        "ok",
        "nothing to release is no error"
    );
    // Out of memory inside a scope.
    pool.retention_begin().unwrap();
    assert_eq!(
        pool.retention_begin().unwrap_err().to_string(),
        "retention scope state: a retention scope is already open"
    );
    assert_eq!(
        pool.trim().unwrap_err().to_string(),
        "retention scope state: trim inside a retention scope: finish the scope instead"
    );
    let live = pool.allocate_raw(2 * GIB).unwrap();
    let t = pool.allocate_raw(GIB).unwrap();
    pool.free_raw(t).unwrap();
    assert_eq!(
        pool.allocate_raw(2 * GIB).unwrap_err().to_string(),
        "out of memory inside a retention scope: 2.0 GiB live, 1.0 GiB retained idle, \
         2.0 GiB requested (cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY (2)); \
         finish the scope or free live allocations"
    );
    pool.retention_finish().unwrap();
    assert_eq!(
        pool.retention_finish().unwrap_err().to_string(),
        "retention scope state: no retention scope is open"
    );
    // Out of memory outside a scope: idle released, retried once, still too big.
    assert_eq!(
        pool.allocate_raw(3 * GIB).unwrap_err().to_string(),
        "out of memory: 2.0 GiB live, 0 B retained idle, 3.0 GiB requested \
         (cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY (2)); idle mappings were \
         released and the allocation retried once; free live allocations"
    );
    // Beyond the whole device (4 GiB here): no driver call, says so.
    assert_eq!(
        pool.allocate_raw(1 << 50).unwrap_err().to_string(),
        "request too large: 1.0 PiB requested (1125899906842624 bytes), more than the \
         device's total memory of 4.0 GiB (4294967296 bytes); no amount of freeing can \
         make room"
    );
    pool.free_raw(live).unwrap();
    // Driver errors: each names the call, code name and number, the size, the remedy.
    sim.inject_failure(DriverCall::Map, 1, CuResult::NOT_SUPPORTED);
    assert_eq!(
        pool.allocate_raw(3 * MIB).unwrap_err().to_string(),
        "driver call cuMemMap failed with CUDA_ERROR_NOT_SUPPORTED (801) on 4.0 MiB; \
         the driver refuses this mapping (only whole handles can be mapped)"
    );
    sim.inject_failure(DriverCall::Reserve, 1, CuResult::INVALID_VALUE);
    assert_eq!(
        pool.allocate_raw(MIB).unwrap_err().to_string(),
        "driver call cuMemAddressReserve failed with CUDA_ERROR_INVALID_VALUE (1) on \
         2.0 MiB; nothing was leaked; the pool is still usable"
    );
    let p = pool.allocate_raw(MIB).unwrap();
    pool.retention_begin().unwrap();
    pool.free_raw(p).unwrap();
    sim.inject_failure(
        DriverCall::Synchronize,
        1,
        CuResult::STREAM_CAPTURE_UNSUPPORTED,
    );
    assert_eq!(
        pool.retention_finish().unwrap_err().to_string(),
        "driver call cuCtxSynchronize failed with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED \
         (900); a stream is being captured, and a device synchronize breaks its capture: \
         keep releases and sleeps out of captures (a retention scope around the capture \
         keeps the pool from releasing); what needed it is retried at the next release \
         point"
    );
    sim.inject_failure(DriverCall::Synchronize, 1, CuResult::ILLEGAL_ADDRESS);
    assert_eq!(
        pool.trim().unwrap_err().to_string(),
        "driver call cuCtxSynchronize failed with CUDA_ERROR_ILLEGAL_ADDRESS (700); the \
         context is lost (sticky fault): recreate the context"
    );
    sim.inject_failure(DriverCall::Unmap, 1, CuResult::UNKNOWN);
    assert_eq!(
        pool.trim().unwrap_err().to_string(),
        "driver call cuMemUnmap failed with CUDA_ERROR_UNKNOWN (999) on 2.0 MiB; the \
         memory is kept and the step retried at the next release point"
    );
    pool.trim().unwrap();
    assert_driver_empty(&pool);
    // Variants the simulated pool cannot produce here.
    assert_eq!(
        Error::NotSupported("fault injection on a CUDA pool").to_string(),
        "not supported: fault injection on a CUDA pool"
    );
    match Pool::new(PoolConfig::cuda(0)) {
        Err(e @ Error::NoDriver(_)) => {
            // No libcuda on a CI machine: the message says so rather than naming a
            // driver call that never ran.
            assert_eq!(
                e.to_string(),
                "no CUDA driver: libcuda.so.1 could not be loaded: no NVIDIA driver on \
                 this machine (the simulated backend needs none)"
            );
        }
        Err(e) => panic!("unexpected {e:?}"),
        Ok(_) => {} // a machine with a GPU
    }
    let _ = ReusePolicy::BestFit;
}
