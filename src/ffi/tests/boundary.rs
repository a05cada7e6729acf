//! The panic boundary, the statuses and their names, the NULL pool every call
//! refuses, poisoning, and the last error's copy-out (`src/ffi/boundary.rs`).

use crate::ffi::boundary::boundary;
use crate::Error;

use super::*;

#[test]
fn a_panic_is_an_internal_status_with_its_message() {
    let status = boundary("flare_test", || panic!("boom {}", 42));
    assert_eq!(status, FlareStatus::FLARE_STATUS_INTERNAL);
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` has 256 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    assert_eq!(n, msg.len());
    assert!(msg.starts_with("flare_test: internal error") && msg.ends_with("boom 42"));
}

#[test]
fn errors_map_to_their_statuses() {
    let status = boundary("flare_test", || Err(Error::UnknownPointer { ptr: 0x10 }));
    assert_eq!(status, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
    let status = boundary("flare_test", || {
        Err(Error::RequestTooLarge {
            requested: 2 << 30,
            device_total: 1 << 30,
        })
    });
    assert_eq!(status, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    let status = boundary("flare_test", || Err(Error::NoDriver("x".into())));
    assert_eq!(status, FlareStatus::FLARE_STATUS_NO_DRIVER);
    // SAFETY: NULL with length 0 writes nothing.
    let n = unsafe { flare_last_error_message(ptr::null_mut(), 0) };
    assert_eq!(n, "flare_test: no CUDA driver: x".len());
}

#[test]
fn status_names_match_the_enum() {
    // The contract's numbers and names, written out here rather than derived from
    // the enum, for every status and a few values outside it.
    let table: [(u32, &str); 16] = [
        (0, "FLARE_STATUS_SUCCESS"),
        (1, "FLARE_STATUS_INVALID_ARGUMENT"),
        (2, "FLARE_STATUS_OUT_OF_MEMORY"),
        (3, "FLARE_STATUS_NOT_SUPPORTED"),
        (4, "FLARE_STATUS_UNKNOWN_POINTER"),
        (5, "FLARE_STATUS_SCOPE_STATE"),
        (6, "FLARE_STATUS_DRIVER_ERROR"),
        (7, "FLARE_STATUS_NO_DRIVER"),
        (8, "FLARE_STATUS_INTERNAL"),
        (9, "FLARE_STATUS_REQUEST_TOO_LARGE"),
        (10, "FLARE_STATUS_TAG_STATE"),
        (11, "FLARE_STATUS_STREAM_STATE"),
        (12, "FLARE_STATUS_IO"),
        (13, "FLARE_STATUS_UNRECOGNIZED"),
        (0x8000_0000, "FLARE_STATUS_UNRECOGNIZED"),
        (u32::MAX, "FLARE_STATUS_UNRECOGNIZED"),
    ];
    for (value, name) in table {
        // SAFETY: flare_status_name returns a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(flare_status_name(RawStatus(value))) };
        assert_eq!(got.to_str().ok(), Some(name), "status {value}");
    }
    // The enum's discriminants are the contract's numbers, and its Rust names the C
    // names.
    for (value, name) in table {
        let status = FlareStatus::from_raw(value);
        if name == "FLARE_STATUS_UNRECOGNIZED" {
            assert_eq!(status, None, "status {value}");
        } else {
            let status = status.unwrap_or_else(|| panic!("status {value} missing"));
            assert_eq!((status as u32, format!("{status:?}")), (value, name.into()));
        }
    }
    assert_eq!(FlareStatus::ALL.len(), 13); // 0 to 12 (FLARE_STATUS_IO, issue 38)
}

#[test]
fn every_call_on_a_pool_refuses_a_null_pool() {
    let mut out = SENTINEL;
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    let mut c = FlareTagCensus {
        struct_size: size_of::<FlareTagCensus>() as u32,
        ..FlareTagCensus::default()
    };
    // SAFETY: NULL pools are refused before anything else is read; the outputs are
    // writable locals.
    let calls: [(&str, FlareStatus); 13] = unsafe {
        [
            (
                "flare_package_allocate",
                flare_package_allocate(NULL_POOL, 1, &mut out),
            ),
            (
                "flare_package_free",
                flare_package_free(NULL_POOL, SENTINEL),
            ),
            ("flare_retention_begin", flare_retention_begin(NULL_POOL)),
            ("flare_retention_finish", flare_retention_finish(NULL_POOL)),
            ("flare_retention_abort", flare_retention_abort(NULL_POOL)),
            ("flare_pool_trim", flare_pool_trim(NULL_POOL)),
            (
                "flare_pool_snapshot",
                flare_pool_snapshot(NULL_POOL, &mut s),
            ),
            (
                "flare_package_allocate_tagged",
                flare_package_allocate_tagged(NULL_POOL, 1, ptr::null_mut(), 1, &mut out),
            ),
            (
                "flare_pool_sleep",
                flare_pool_sleep(NULL_POOL, 1, RawSleepMode(0)),
            ),
            ("flare_pool_wake", flare_pool_wake(NULL_POOL, 1)),
            (
                "flare_pool_wake_zeroed",
                flare_pool_wake_zeroed(NULL_POOL, 1, ptr::null_mut()),
            ),
            (
                "flare_pool_tag_census",
                flare_pool_tag_census(NULL_POOL, 1, &mut c),
            ),
            (
                "flare_sim_inject_failure",
                flare_sim_inject_failure(NULL_POOL, RawDriverCall(0), 1, 999),
            ),
        ]
    };
    for (name, status) in calls {
        assert_eq!(status, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, "{name}");
    }
    // Each call replaced the message; the last one's is exact.
    assert_eq!(
        last_error(),
        "flare_sim_inject_failure: invalid argument: pool is NULL"
    );
    // Nothing was written.
    assert_eq!(out, SENTINEL);
    assert_eq!(s.granularity_bytes, 0);
    assert_eq!(c.live_count, 0);
    // One at a time, each names itself.
    // SAFETY: as above.
    unsafe {
        refused(
            flare_pool_trim(NULL_POOL),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_trim",
            "pool is NULL",
        );
        refused(
            flare_pool_snapshot(NULL_POOL, &mut s),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_snapshot",
            "pool is NULL",
        );
        refused(
            flare_package_free(NULL_POOL, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_package_free",
            "pool is NULL",
        );
    }
}

#[test]
fn a_panic_in_a_call_poisons_the_pool_and_destroy_still_releases() {
    let pool = create(&config());
    let sim = snap_sim(pool);
    let (st, a) = allocate(pool, 3 * MIB as usize);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    // SAFETY: `pool` is live (poisoned pools stay allocated until destroy).
    unsafe {
        assert_eq!(
            flare_sim_inject_panic(pool),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        // The panic fires after the allocation is made, before its pointer is
        // returned.
        let (st, b) = allocate(pool, MIB as usize);
        assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL);
        assert_eq!(b, 0x5e5e as *mut c_void, "no output");
        let msg = last_error();
        assert!(
            msg.starts_with("flare_package_allocate: internal error"),
            "{msg}"
        );
        assert!(msg.contains("injected by flare_sim_inject_panic"), "{msg}");
        assert!(msg.contains("poisoned"), "{msg}");
        // Every later call is refused, and says why.
        let mut s = FlareSnapshot {
            struct_size: size_of::<FlareSnapshot>() as u32,
            ..FlareSnapshot::default()
        };
        let refused = [
            flare_package_free(pool, a),
            flare_package_free(pool, ptr::null_mut()),
            allocate(pool, 1).0,
            flare_retention_begin(pool),
            flare_retention_finish(pool),
            flare_retention_abort(pool),
            flare_pool_trim(pool),
            flare_pool_snapshot(pool, &mut s),
            flare_pool_wake_zeroed(pool, 1, ptr::null_mut()),
            flare_sim_inject_failure(pool, RawDriverCall(0), 1, 2),
            flare_sim_inject_panic(pool),
        ];
        for (i, st) in refused.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL, "call {i}");
        }
        assert_eq!(s.live_count, 0, "the snapshot was not written");
        let msg = last_error();
        assert!(
            msg.starts_with("flare_sim_inject_panic: the pool is poisoned")
                && msg.contains("flare_package_allocate: injected by flare_sim_inject_panic"),
            "{msg}"
        );
        // The driver holds both allocations (the panicking call's too).
        assert_eq!(sim.state().handles, 2);
    }
    // Destroy releases everything the pool holds, and reports both allocations.
    let (st, r) = destroy_report(pool);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS, "{}", last_error());
    assert_eq!((r.live_count, r.live_requested_bytes), (2, 4 * MIB));
    let d = sim.state();
    assert_eq!(
        (d.handles, d.reservations, d.mappings, d.physical_bytes),
        (0, 0, 0, 0),
        "destroy released what the driver held"
    );
    // Another pool is not affected.
    let other = create(&config());
    let (st, p) = allocate(other, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    // SAFETY: `other` is live.
    unsafe {
        assert_eq!(
            flare_package_free(other, p),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(flare_pool_destroy(other), FlareStatus::FLARE_STATUS_SUCCESS);
    }
}

#[test]
fn the_last_error_is_copied_truncated_with_its_full_length() {
    // A failure whose message is known exactly.
    let (st, _) = allocate(NULL_POOL, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    let message = "flare_package_allocate: invalid argument: pool is NULL";
    let len = message.len();
    // SAFETY: NULL with any length writes nothing.
    let (n0, n64) = unsafe {
        (
            flare_last_error_message(ptr::null_mut(), 0),
            flare_last_error_message(ptr::null_mut(), 64),
        )
    };
    assert_eq!((n0, n64), (len, len));
    // A zero length writes nothing, even to a real buffer.
    let mut buf = [0x55 as c_char; 80];
    // SAFETY: `buf` has 80 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 0) };
    assert_eq!(n, len);
    assert!(buf.iter().all(|&b| b == 0x55));
    // A 1-byte buffer gets the NUL alone.
    // SAFETY: as above.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 1) };
    assert_eq!(n, len);
    assert_eq!((buf[0], buf[1]), (0, 0x55));
    // 8 bytes: the first 7 and the NUL, nothing past.
    let mut buf = [0x55 as c_char; 80];
    // SAFETY: as above.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 8) };
    assert_eq!(n, len);
    // SAFETY: NUL-terminated within the buffer.
    let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(got.to_bytes(), &message.as_bytes()[..7]);
    assert!(buf[8..].iter().all(|&b| b == 0x55));
    // Exactly len bytes: truncated by one; len + 1: whole.
    for (size, want) in [(len, &message[..len - 1]), (len + 1, message)] {
        let mut buf = [0x55 as c_char; 80];
        // SAFETY: as above.
        let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), size) };
        assert_eq!(n, len);
        // SAFETY: NUL-terminated within the buffer.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(got.to_str().ok(), Some(want), "size {size}");
        assert!(buf[size..].iter().all(|&b| b == 0x55), "size {size}");
    }
    // A success leaves the message as it is.
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    assert_eq!(last_error(), message);
    ok(free(pool, p));
    destroy(pool);
    // Each thread has its own: a new thread starts empty.
    let other = std::thread::spawn(|| {
        // SAFETY: NULL writes nothing.
        unsafe { flare_last_error_message(ptr::null_mut(), 0) }
    })
    .join()
    .unwrap_or(usize::MAX);
    assert_eq!(other, 0);
}
