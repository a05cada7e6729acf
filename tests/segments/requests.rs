//! What a request in segment mode gets when it cannot be served as asked: a size of
//! 0 or one whose rounding overflows is refused; out of memory counts blocks as live
//! and retained, after the smallest fitting free block was looked for behind the
//! probed ones.
//!
//! Each test names the contract it checks (a doc comment of the API,
//! `docs/ARCHITECTURE.md` or `docs/vmm-semantics.md`); the expected values are
//! reasoned from there and from the simulated driver's documented behaviour, not
//! copied from a run.

use crate::common;
use crate::pools::seg_pool_on_device;
use common::{check, segment_pool, MIB};
use flare_package::{DriverCall, Error};

/// The simulated driver's default granularity.
const G: u64 = 2 * MIB;

/// `Pool::allocate_raw`: "[`Error::InvalidArgument`] for 0 bytes or a size whose
/// rounding overflows". In segment mode a request is rounded to a 512-byte block
/// (then its handle to the granularity) before anything else: 0 bytes, and sizes
/// within 512 bytes (or within the granularity) of `u64::MAX`, are refused on every
/// entry point (synchronous, stream-ordered, tagged), and nothing reaches the driver.
#[test]
fn segment_mode_refuses_zero_and_overflowing_sizes() {
    let (pool, sim) = segment_pool(1 << 30, 0);
    let s = common::stream(&sim);
    // u64::MAX: its 512-byte rounding overflows. u64::MAX - 1023: rounds to
    // u64::MAX - 511 (a multiple of 512), whose granularity rounding overflows.
    for bytes in [0, u64::MAX, u64::MAX - 1023] {
        for (what, r) in [
            ("sync", pool.allocate_raw(bytes)),
            ("async", pool.allocate_async_raw(bytes, s)),
            ("tagged", pool.allocate_tagged_raw(bytes, None, 3)),
        ] {
            match r {
                Err(Error::InvalidArgument(msg)) => {
                    if bytes == 0 {
                        assert!(msg.contains("0 bytes"), "{what} {bytes}: {msg}");
                    } else {
                        assert!(msg.contains("overflows"), "{what} {bytes}: {msg}");
                    }
                }
                other => panic!("{what} {bytes}: want InvalidArgument, got {other:?}"),
            }
        }
    }
    let snap = check(&pool);
    assert_eq!((snap.live_count, snap.allocations), (0, 0));
    assert_eq!(sim.call_count(DriverCall::Create), 0);
    assert_eq!(sim.call_count(DriverCall::Reserve), 0);
    // The largest size that rounds within range is not refused as invalid: it is
    // above the device's total, `Error::RequestTooLarge`.
    assert!(matches!(
        pool.allocate_raw(u64::MAX - (G - 1) - 511),
        Err(Error::RequestTooLarge { .. })
    ));
    // A small request still works.
    let p = pool.allocate_raw(1).unwrap();
    pool.free_raw(p).unwrap();
    check(&pool);
}

/// `Error::OutOfMemory` says `live`: "Bytes mapped to live allocations when the
/// request failed", and `idle`: "Bytes held idle (retained or cached)". In segment
/// mode live allocations are blocks and retained memory is free blocks, so a full
/// device reported "0 B live, 0 B retained idle" while the pool held all of it: the
/// message sends the user looking for memory elsewhere. Here a 2 MiB block is live
/// and a 2 MiB block retained (inside a scope) on a 4 MiB device.
#[test]
fn out_of_memory_counts_blocks_as_live_and_retained() {
    let (pool, _sim) = seg_pool_on_device(2 * G, 0);
    let scope = pool.retention_scope().unwrap();
    let a = pool.allocate_raw(G).unwrap();
    let b = pool.allocate_raw(G).unwrap();
    pool.free_raw(b).unwrap();
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.block_live_bytes), (2 * G, G));
    let e = pool.allocate_raw(2 * G).unwrap_err();
    match e {
        Error::OutOfMemory {
            live,
            idle,
            in_scope,
            ..
        } => assert_eq!((live, idle, in_scope), (G, G, true), "{e}"),
        _ => panic!("not out of memory: {e:?}"),
    }
    pool.free_raw(a).unwrap();
    scope.finish().unwrap();
}

/// `docs/ARCHITECTURE.md`: "When the driver is out of memory, the smallest idle
/// mapping that fits is taken whatever its size (the policy's bound chooses between
/// idle mappings; it is no reason to fail)"; the fit "probes the first 8 blocks of
/// the request's own bin ..., else takes the first block of the next non-empty bin".
/// With nine smaller blocks in front of the one block that fits in the request's own
/// bin (sizes 128 to 131 units of 512 bytes share a bin) and no larger free block,
/// the lookup gave up: the heap grew, and on a full device the request failed with
/// out-of-memory although a free block of its heap fits.
#[test]
fn a_fitting_free_block_behind_the_probed_ones_is_found() {
    const U: u64 = 512;
    // One 2 MiB handle: the small heap's segment, and the whole device.
    let (pool, _sim) = seg_pool_on_device(G, 0);
    let scope = pool.retention_scope().unwrap();
    let fits = pool.allocate_raw(131 * U).unwrap();
    let mut keep = vec![pool.allocate_raw(U).unwrap()];
    let mut small = Vec::new();
    for _ in 0..9 {
        small.push(pool.allocate_raw(128 * U).unwrap());
        keep.push(pool.allocate_raw(U).unwrap());
    }
    // The rest of the handle: 4096 - 131 - 9 * 128 - 10 units.
    keep.push(pool.allocate_raw(2048 * U).unwrap());
    keep.push(pool.allocate_raw(755 * U).unwrap());
    let s = check(&pool);
    assert_eq!((s.physical_bytes, s.block_free_bytes), (G, 0), "{s:#?}");
    // Freed first, so it is last in its bin; the nine 128-unit blocks in front.
    pool.free_raw(fits).unwrap();
    for p in small {
        pool.free_raw(p).unwrap();
    }
    let p = pool.allocate_raw(130 * U);
    assert_eq!(p.as_ref().ok(), Some(&fits), "{p:x?}");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, G, "no growth: {s:#?}");
    scope.finish().unwrap();
}
