//! `record_stream` (issue 11): memory recorded on another stream is held until that
//! stream completes too, and recording the legacy stream on itself defers nothing.
//! The simulated driver counts every contract fault: every test ends with none.

use crate::common;

use crate::stream_order::{pool_with, syncs, G};
use common::{check, no_faults, stream};
use flare_package::{CrossStreamReuse, Error, Stream};

/// record_stream: memory used on T too is not reused on its own stream, nor released,
/// until T's work up to the free completes.
#[test]
fn record_stream_holds_memory_until_the_recorded_stream_completes() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let (s, t) = (stream(&sim), stream(&sim));
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.record_stream(p, t).unwrap();
    sim.launch(t.0, p, G);
    pool.free_async_raw(p, s).unwrap();
    let snap = check(&pool);
    assert_eq!(snap.event_wait_bytes, G);
    assert_eq!(
        snap.events_outstanding, 1,
        "a fence on T, recorded at the free"
    );
    let q = pool.allocate_async_raw(G, s).unwrap();
    assert_ne!(q, p, "T's kernel still reads p");
    sim.stream_complete(t.0);
    let r = pool.allocate_async_raw(G, s).unwrap();
    assert_eq!(r, p, "T completed: p is S's again");
    assert!(matches!(
        pool.record_stream(0x1234, t),
        Err(Error::UnknownPointer { ptr: 0x1234 })
    ));
    no_faults(&sim);
}

/// Found by the property test: memory freed on S with a recorded stream comes back
/// to S's bucket after the recorded stream's fence, and a finish then waits on a
/// fence of S too and releases it (it was left idle, unfenced).
#[test]
fn finish_releases_memory_that_waited_on_a_recorded_stream() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, 0);
    let s = stream(&sim);
    let p = pool.allocate_async_raw(G, s).unwrap();
    pool.retention_begin().unwrap();
    pool.record_stream(p, Stream::LEGACY).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, s).unwrap();
    pool.retention_finish().unwrap();
    let snap = check(&pool);
    assert_eq!((snap.idle_bytes, snap.physical_bytes), (0, 0), "{snap:#?}");
    assert_eq!(syncs(&sim), 0);
    no_faults(&sim);
}

/// `record_stream` with the legacy stream's other handle (1, `CU_STREAM_LEGACY`) on
/// memory freed on the legacy stream (0) records nothing: it is the same stream, and
/// the memory is reused on it at once.
#[test]
fn record_stream_of_the_same_legacy_stream_defers_nothing() {
    let (pool, sim) = pool_with(CrossStreamReuse::WhenComplete, u64::MAX);
    let p = pool.allocate_async_raw(G, Stream::LEGACY).unwrap();
    pool.record_stream(p, Stream(1)).unwrap();
    sim.launch(0, p, G);
    pool.free_async_raw(p, Stream::LEGACY).unwrap();
    assert_eq!(check(&pool).events_outstanding, 0);
    assert_eq!(pool.allocate_async_raw(G, Stream(1)).unwrap(), p);
    no_faults(&sim);
}
