//! Allocate and free, the snapshot, the retention scope, trim and the recording's
//! calls through the C ABI (`src/ffi/memory.rs`).

use std::ffi::CString;

use super::*;

#[test]
fn allocate_refuses_bad_outputs_and_sizes_and_writes_nothing() {
    let pool = create(&config());
    // NULL output.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_package_allocate(pool, 1, ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_package_allocate: invalid argument: out_ptr is NULL"
    );
    // A misaligned output: refused, not written.
    let mut words = [0x1111_u64; 3];
    let misaligned = words
        .as_mut_ptr()
        .cast::<u8>()
        .wrapping_add(1)
        .cast::<*mut c_void>();
    // SAFETY: `pool` is live; a misaligned output is refused before any write.
    let st = unsafe { flare_package_allocate(pool, 1, misaligned) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_package_allocate: invalid argument: out_ptr is misaligned"
    );
    assert_eq!(words, [0x1111; 3]);
    // A size of 0, and one whose rounding to the granularity overflows.
    for size in [0, usize::MAX] {
        let (st, p) = allocate(pool, size);
        refused(
            st,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_package_allocate",
            "invalid argument",
        );
        assert_eq!(p, SENTINEL, "size {size}: nothing written");
    }
    // The refusals changed nothing, and no mapping was made.
    let s = snap(pool);
    assert_eq!(
        (
            s.allocations,
            s.live_count,
            s.physical_bytes,
            s.mappings_created
        ),
        (0, 0, 0, 0)
    );
    // A NULL output is checked before the pool is asked: no allocation is leaked.
    assert_eq!(snap(pool).allocations, 0);
    destroy(pool);
}

#[test]
fn an_allocate_and_free_pair_moves_the_counters_as_the_contract_says() {
    // Defaults: best fit, release threshold 0 (a free outside a scope releases).
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    assert!(!p.is_null() && p != SENTINEL);
    assert_eq!(p as u64 % GRANULARITY, 0, "aligned to the granularity");
    // One byte is rounded up to the granularity: one 2 MiB mapping.
    let s = snap(pool);
    assert_eq!(s.struct_size, size_of::<FlareSnapshot>() as u32);
    assert_eq!(s.scope_open, 0);
    assert_eq!(s.granularity_bytes, GRANULARITY);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (1, 1, GRANULARITY)
    );
    assert_eq!(
        (s.physical_bytes, s.reserved_bytes, s.peak_physical_bytes),
        (GRANULARITY, GRANULARITY, GRANULARITY)
    );
    assert_eq!(
        (s.allocations, s.frees, s.mappings_created, s.reuse_hits),
        (1, 0, 1, 0)
    );
    assert_eq!((s.idle_count, s.idle_bytes, s.pending_count), (0, 0, 0));
    // A second allocation of 3 MiB + 1 maps 4 MiB.
    let (st, q) = allocate(pool, 3 * MIB as usize + 1);
    ok(st);
    assert_ne!(p, q);
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (2, 3 * MIB + 2, 3 * GRANULARITY)
    );
    assert_eq!(s.peak_live_mapped_bytes, 3 * GRANULARITY);
    // Free the first: released at once (threshold 0), the peaks stay.
    ok(free(pool, p));
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (1, 3 * MIB + 1, 2 * GRANULARITY)
    );
    assert_eq!((s.idle_count, s.idle_bytes), (0, 0));
    assert_eq!(s.physical_bytes, 2 * GRANULARITY);
    assert_eq!(s.peak_physical_bytes, 3 * GRANULARITY);
    assert_eq!((s.allocations, s.frees, s.mappings_released), (2, 1, 1));
    // The invariant the snapshot documents.
    assert_eq!(
        s.physical_bytes,
        s.live_mapped_bytes + s.idle_bytes + s.pending_bytes + s.segment_mapped_bytes
    );
    assert_eq!(s.allocations, s.frees + s.live_count);
    // A second free of `p`, an interior pointer of `q`, an address never handed
    // out: unknown, nothing changes.
    for bad in [
        p,
        q.cast::<u8>().wrapping_add(4096).cast::<c_void>(),
        0x7f00_0000_0000_usize as *mut c_void,
    ] {
        refused(
            free(pool, bad),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_free",
            "",
        );
    }
    // SAFETY: `pool` is live; the pointers are only compared.
    unsafe {
        refused(
            flare_package_free_async(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_free_async",
            "",
        );
        refused(
            flare_package_record_stream(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_record_stream",
            "",
        );
    }
    // NULL: success, nothing happens.
    ok(free(pool, ptr::null_mut()));
    let after = snap(pool);
    assert_eq!(
        after, s,
        "the refused frees and the NULL free changed nothing"
    );
    ok(free(pool, q));
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.physical_bytes, s.reserved_bytes, s.frees),
        (0, 0, 0, 2)
    );
    destroy(pool);
}

#[test]
fn out_of_memory_is_its_own_status_and_writes_nothing() {
    // A 4 MiB device: a second 2 MiB mapping after 4 MiB does not fit now, but is
    // not larger than the device (so not REQUEST_TOO_LARGE).
    let mut c = config();
    c.sim_capacity_bytes = 4 * MIB;
    let pool = create(&c);
    let (st, p) = allocate(pool, 4 * MIB as usize);
    ok(st);
    let (st, q) = allocate(pool, 1);
    refused(
        st,
        FlareStatus::FLARE_STATUS_OUT_OF_MEMORY,
        "flare_package_allocate",
        "",
    );
    assert_eq!(q, SENTINEL);
    let (st, _) = allocate(pool, 4 * MIB as usize + 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    let s = snap(pool);
    assert_eq!((s.live_count, s.physical_bytes), (1, 4 * MIB));
    ok(free(pool, p));
    // Released: the device has room again.
    let (st, q) = allocate(pool, 1);
    ok(st);
    ok(free(pool, q));
    destroy(pool);
}

#[test]
fn request_too_large_is_not_out_of_memory() {
    let mut c = config();
    c.sim_capacity_bytes = 1 << 30;
    let pool = create(&c);
    let before = snap(pool);
    let (st, p) = allocate(pool, (1 << 30) + 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    assert_eq!(p, 0x5e5e as *mut c_void, "no output on failure");
    assert!(
        last_error().contains("request too large"),
        "{}",
        last_error()
    );
    assert_eq!(snap(pool), before, "nothing counted");
    // The whole device is not too large: with 2 MiB live, it is full now.
    let (st, live) = allocate(pool, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    let (st, _) = allocate(pool, 1 << 30);
    assert_eq!(st, FlareStatus::FLARE_STATUS_OUT_OF_MEMORY);
    // SAFETY: `pool` is live, `live` its allocation.
    unsafe {
        assert_eq!(
            flare_package_free(pool, live),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        let (st, whole) = allocate(pool, 1 << 30);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!(
            flare_package_free(pool, whole),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(flare_pool_destroy(pool), FlareStatus::FLARE_STATUS_SUCCESS);
    }
}

#[test]
fn snapshot_refuses_bad_outputs_and_writes_only_inside_struct_size() {
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    // NULL and misaligned outputs.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_pool_snapshot(pool, ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_pool_snapshot: invalid argument: out is NULL"
    );
    let mut b = Buf::with_struct_size(size_of::<FlareSnapshot>() as u32);
    // SAFETY: `pool` is live; `b` has 512 writable bytes; the output is misaligned.
    let st = unsafe {
        flare_pool_snapshot(
            pool,
            b.0.as_mut_ptr().wrapping_add(4).cast::<FlareSnapshot>(),
        )
    };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_pool_snapshot: invalid argument: out is misaligned"
    );
    assert!(b.untouched_from(4));
    // struct_size below the two first fields, or above 4096: refused, nothing
    // written, the message names it.
    for bad in [0_u32, 4, 7, 4097, u32::MAX] {
        let mut b = Buf::with_struct_size(bad);
        // SAFETY: `pool` is live; `b` has 512 writable bytes, aligned.
        let st = unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) };
        refused(
            st,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_snapshot",
            &format!("snapshot.struct_size is {bad}"),
        );
        assert_eq!(b.u32_at(0), bad);
        assert!(b.untouched_from(4), "struct_size {bad}: nothing written");
    }
    // Layout: struct_size 0..4, scope_open 4..8, granularity_bytes 8..16,
    // live_count 16..24, live_requested_bytes 24..32.
    // 8: scope_open only.
    let mut b = Buf::with_struct_size(8);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u32_at(4)), (8, 0));
    assert!(b.untouched_from(8));
    // 20: up to granularity_bytes (live_count does not fit whole).
    let mut b = Buf::with_struct_size(20);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u64_at(8)), (20, GRANULARITY));
    assert!(b.untouched_from(16));
    // 32: through live_requested_bytes.
    let mut b = Buf::with_struct_size(32);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u64_at(16), b.u64_at(24)), (1, 1));
    assert!(b.untouched_from(32));
    // A newer caller's larger struct: this library's fields, the rest untouched,
    // struct_size the caller's.
    let mut b = Buf::with_struct_size(512);
    // SAFETY: as above (512 bytes).
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!(b.u32_at(0), 512);
    assert_eq!(b.u64_at(8), GRANULARITY);
    assert!(b.untouched_from(size_of::<FlareSnapshot>()));
    ok(free(pool, p));
    destroy(pool);
}

#[test]
fn the_retention_scope_opens_once_and_retains_until_it_closes() {
    let pool = create(&config());
    // SAFETY: `pool` is live throughout.
    unsafe {
        // No scope: finish and abort are refused.
        refused(
            flare_retention_finish(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_finish",
            "",
        );
        refused(
            flare_retention_abort(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_abort",
            "",
        );
        ok(flare_retention_begin(pool));
        assert_eq!(snap(pool).scope_open, 1);
        refused(
            flare_retention_begin(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_begin",
            "",
        );
        refused(
            flare_pool_trim(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_pool_trim",
            "",
        );
        // Freed inside the scope: retained idle, still mapped.
        let (st, p) = allocate(pool, 1);
        ok(st);
        ok(free(pool, p));
        let s = snap(pool);
        assert_eq!(
            (s.live_count, s.idle_count, s.idle_bytes, s.physical_bytes),
            (0, 1, GRANULARITY, GRANULARITY)
        );
        // Reused with no new mapping.
        let (st, q) = allocate(pool, 1);
        ok(st);
        assert_eq!(q, p, "the idle mapping is handed out again");
        let s = snap(pool);
        assert_eq!(
            (s.reuse_hits, s.reuse_exact_hits, s.mappings_created),
            (1, 1, 1)
        );
        ok(free(pool, q));
        // Finish releases what is idle.
        ok(flare_retention_finish(pool));
        let s = snap(pool);
        assert_eq!(
            (
                s.scope_open,
                s.idle_count,
                s.physical_bytes,
                s.scopes_finished
            ),
            (0, 0, 0, 1)
        );
        // Abort is counted apart.
        ok(flare_retention_begin(pool));
        ok(flare_retention_abort(pool));
        let s = snap(pool);
        assert_eq!((s.scopes_finished, s.scopes_aborted), (1, 1));
    }
    destroy(pool);
}

#[test]
fn trim_releases_what_the_threshold_cached() {
    let mut c = config();
    c.release_threshold_bytes = 64 * MIB;
    let pool = create(&c);
    let (st, p) = allocate(pool, 1);
    ok(st);
    ok(free(pool, p));
    // Under the threshold: cached idle.
    let s = snap(pool);
    assert_eq!(
        (
            s.idle_count,
            s.idle_bytes,
            s.physical_bytes,
            s.mappings_released
        ),
        (1, GRANULARITY, GRANULARITY, 0)
    );
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    let s = snap(pool);
    assert_eq!(
        (
            s.idle_count,
            s.idle_bytes,
            s.physical_bytes,
            s.reserved_bytes
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(s.mappings_released, 1);
    // Nothing left: trim again succeeds and changes nothing.
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    assert_eq!(snap(pool), s);
    destroy(pool);
}

/// The recording's C calls: a flush of a pool that records writes its lines; an
/// unwritable path never fails a call, and `flare_pool_record_error` says why (0
/// for a pool that works, one that does not record, and NULL).
#[test]
#[allow(clippy::unwrap_used)] // a test: a failed step is its failure
fn record_flush_and_record_error() {
    let dir = std::env::temp_dir().join(format!("flare-abi-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let error_of = |pool: *const FlarePool| -> (usize, String) {
        let mut buf = [0 as c_char; 512];
        // SAFETY: `pool` is NULL or live; `buf` has 512 writable bytes.
        let n = unsafe { flare_pool_record_error(pool, buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated by the call (or still all zeros).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        (n, text)
    };
    // A pool that records into a file that can be written.
    let good = CString::new(dir.join("good.trace").to_str().unwrap()).unwrap();
    let mut c = config();
    c.record_path = good.as_ptr();
    let pool = create(&c);
    let (status, p) = allocate(pool, 4096);
    ok(status);
    ok(free(pool, p));
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    let text = std::fs::read_to_string(dir.join("good.trace")).unwrap();
    assert!(text.starts_with("# flare-trace v1\n"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("a ")).count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("f ")).count(),
        1,
        "{text}"
    );
    assert_eq!(error_of(pool), (0, String::new()));
    destroy(pool);
    // A path in a directory that does not exist: calls succeed, the error is kept.
    let bad = CString::new(dir.join("missing").join("x.trace").to_str().unwrap()).unwrap();
    c.record_path = bad.as_ptr();
    let pool = create(&c);
    let (status, p) = allocate(pool, 4096);
    ok(status);
    ok(free(pool, p));
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    let (n, text) = error_of(pool);
    assert!(n > 0 && n == text.len(), "{n} {text:?}");
    assert!(text.contains("x.trace"), "{text}");
    // Truncated to the buffer, the full length returned; no buffer: the length.
    let mut small = [0x55 as c_char; 8];
    // SAFETY: a live pool; `small` has 8 writable bytes.
    let m = unsafe { flare_pool_record_error(pool, small.as_mut_ptr(), small.len()) };
    assert_eq!(m, n);
    assert_eq!(small[7], 0);
    // SAFETY: a live pool; NULL buffer.
    let m = unsafe { flare_pool_record_error(pool, ptr::null_mut(), 0) };
    assert_eq!(m, n);
    destroy(pool);
    // A pool that does not record, and NULL.
    let pool = create(&config());
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    assert_eq!(error_of(pool).0, 0);
    destroy(pool);
    assert_eq!(error_of(ptr::null()).0, 0);
    // SAFETY: NULL is refused.
    refused(
        unsafe { flare_pool_record_flush(ptr::null()) },
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_record_flush",
        "NULL",
    );
}

/// `flare_pool_record_error` with no error to copy (a pool whose recording works,
/// one that does not record, NULL) still leaves `buf` a C string: the empty one,
/// its NUL in `buf[0]`, nothing after it written (found by the `c_abi` fuzz target:
/// the buffer was left as it was, so a caller printing it read what was there).
#[test]
#[allow(clippy::unwrap_used)] // a test: a failed step is its failure
fn record_error_without_an_error_writes_the_empty_string() {
    let path =
        std::env::temp_dir().join(format!("flare-abi-record-ok-{}.trace", std::process::id()));
    let path_c = CString::new(path.to_str().unwrap()).unwrap();
    let mut recording = config();
    recording.record_path = path_c.as_ptr();
    let recording = create(&recording);
    let plain = create(&config());
    for pool in [recording.cast_const(), plain.cast_const(), ptr::null()] {
        let mut buf = [0x55 as c_char; 16];
        // SAFETY: `pool` is NULL or live; `buf` has 16 writable bytes.
        let n = unsafe { flare_pool_record_error(pool, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 0);
        assert_eq!(buf[0], 0, "the empty string");
        assert!(buf[1..].iter().all(|&b| b == 0x55), "{buf:?}");
        // `len` 0: nothing written.
        let mut untouched = [0x55 as c_char; 4];
        // SAFETY: as above; `len` 0.
        let n = unsafe { flare_pool_record_error(pool, untouched.as_mut_ptr(), 0) };
        assert_eq!((n, untouched), (0, [0x55 as c_char; 4]));
    }
    destroy(recording);
    destroy(plain);
    let _ = std::fs::remove_file(&path);
}
