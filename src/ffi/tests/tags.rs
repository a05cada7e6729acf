//! Tagged allocation, sleep, wake, wake zeroed and the tag census through the C ABI
//! (`src/ffi/tags.rs`).

use super::*;

#[test]
fn tags_sleep_and_wake_with_their_statuses_and_census() {
    let pool = create(&config());
    const TAG: u32 = 3;
    // A tag never used reads all zeros.
    let zero = census(pool, TAG);
    assert_eq!(
        zero,
        FlareTagCensus {
            struct_size: size_of::<FlareTagCensus>() as u32,
            ..FlareTagCensus::default()
        }
    );
    // NULL census output, and a struct_size below its two first fields.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_pool_tag_census(pool, TAG, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_tag_census",
        "out is NULL",
    );
    let mut b = Buf::with_struct_size(4);
    // SAFETY: `pool` is live; `b` has 512 writable bytes.
    let st = unsafe { flare_pool_tag_census(pool, TAG, b.0.as_mut_ptr().cast()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_tag_census",
        "tag census.struct_size is 4",
    );
    assert!(b.untouched_from(4));
    // A NULL output for the tagged allocation.
    // SAFETY: `pool` is live; the NULL output is refused.
    let st =
        unsafe { flare_package_allocate_tagged(pool, 1, ptr::null_mut(), TAG, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_package_allocate_tagged",
        "out_ptr is NULL",
    );
    // One byte for the tag: a whole 2 MiB mapping of its own.
    let (st, p) = allocate_tagged(pool, 1, TAG);
    ok(st);
    assert!(!p.is_null() && p != SENTINEL);
    let c = census(pool, TAG);
    assert_eq!(
        (c.sleeping, c.live_count, c.live_bytes, c.peak_live_bytes),
        (0, 1, GRANULARITY, GRANULARITY)
    );
    assert_eq!(
        (c.idle_bytes, c.physical_bytes, c.offloaded_bytes),
        (0, GRANULARITY, 0)
    );
    // A partial census: struct_size 8 writes `sleeping` only.
    let mut b = Buf::with_struct_size(8);
    // SAFETY: as above.
    ok(unsafe { flare_pool_tag_census(pool, TAG, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u32_at(4)), (8, 0));
    assert!(b.untouched_from(8));
    // SAFETY: `pool` is live throughout.
    unsafe {
        // An unknown mode, and waking a tag that does not sleep.
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(2)),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_sleep",
            "mode",
        );
        refused(
            flare_pool_wake(pool, TAG),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake",
            "",
        );
        // No sleep inside a retention scope.
        ok(flare_retention_begin(pool));
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(1)),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_pool_sleep",
            "",
        );
        ok(flare_retention_finish(pool));
        // Offload: the physical bytes go, the requested byte is kept on the host.
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(1)));
        let c = census(pool, TAG);
        assert_eq!(
            (
                c.sleeping,
                c.live_count,
                c.physical_bytes,
                c.offloaded_bytes
            ),
            (1, 1, 0, 1)
        );
        assert_eq!(snap(pool).physical_bytes, 0);
        // While it sleeps: a second sleep, an allocation, a record_stream of its
        // allocation are refused.
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(0)),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_sleep",
            "",
        );
        let (st, q) = allocate_tagged(pool, 1, TAG);
        refused(
            st,
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_package_allocate_tagged",
            "",
        );
        assert_eq!(q, SENTINEL);
        refused(
            flare_package_record_stream(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_package_record_stream",
            "",
        );
        // Other tags are untouched.
        let (st, other) = allocate_tagged(pool, 1, TAG + 1);
        ok(st);
        assert_eq!(census(pool, TAG + 1).physical_bytes, GRANULARITY);
        ok(free(pool, other));
        // Wake: mapped again at the same address, the host copy freed.
        ok(flare_pool_wake(pool, TAG));
        let c = census(pool, TAG);
        assert_eq!(
            (
                c.sleeping,
                c.live_count,
                c.physical_bytes,
                c.offloaded_bytes
            ),
            (0, 1, GRANULARITY, 0)
        );
        refused(
            flare_pool_wake(pool, TAG),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake",
            "",
        );
    }
    ok(free(pool, p));
    let c = census(pool, TAG);
    assert_eq!((c.live_count, c.live_bytes, c.physical_bytes), (0, 0, 0));
    destroy(pool);
}

/// `flare_pool_wake_zeroed`'s documented statuses, each naming the function: a tag
/// never used and a tag awake are `FLARE_STATUS_TAG_STATE`, a stream that is not live
/// `FLARE_STATUS_DRIVER_ERROR` (the tag still asleep, its census unchanged); after a
/// discard sleep it wakes the tag and the census counts the requested bytes (1000,
/// not the 2 MiB mapped) and one memset. A panic inside the call is
/// `FLARE_STATUS_INTERNAL`, never an unwind into C: the wake it made stands (the tag
/// awake, zeroed) and the pool is poisoned.
#[test]
fn wake_zeroed_statuses_and_a_panic_inside_it() {
    let pool = create(&config());
    const TAG: u32 = 6;
    let bad_stream = 0xdead_0000usize as FlareStream;
    // SAFETY: `pool` is live throughout; streams are only passed to the driver.
    unsafe {
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake_zeroed",
            "tag 6",
        );
        let (st, p) = allocate_tagged(pool, 1000, TAG);
        ok(st);
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake_zeroed",
            "does not sleep",
        );
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(0)));
        let asleep = census(pool, TAG);
        refused(
            flare_pool_wake_zeroed(pool, TAG, bad_stream),
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_pool_wake_zeroed",
            "cuStreamGetCaptureInfo",
        );
        assert_eq!(census(pool, TAG), asleep);
        assert_eq!(asleep.sleeping, 1);
        ok(flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()));
        let c = census(pool, TAG);
        assert_eq!(
            (c.sleeping, c.physical_bytes, c.zeroed_bytes, c.zero_memsets),
            (0, GRANULARITY, 1000, 1)
        );
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(0)));
        ok(flare_sim_inject_panic(pool));
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INTERNAL,
            "flare_pool_wake_zeroed",
            "injected by flare_sim_inject_panic",
        );
        let mut c = FlareTagCensus {
            struct_size: size_of::<FlareTagCensus>() as u32,
            ..FlareTagCensus::default()
        };
        assert_eq!(
            flare_pool_tag_census(pool, TAG, &mut c),
            FlareStatus::FLARE_STATUS_INTERNAL,
            "poisoned"
        );
        let _ = p;
    }
    let (st, r) = destroy_report(pool);
    ok(st);
    assert_eq!((r.live_count, r.live_requested_bytes), (1, 1000));
    assert_eq!(
        r.physical_bytes, GRANULARITY,
        "awake: its handle was mapped again"
    );
}
