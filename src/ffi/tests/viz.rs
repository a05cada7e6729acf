//! `flare_pool_dump_snapshot` and `flare_history_set_frame` (issue 38): NULL and
//! empty arguments refused, an unwritable path `FLARE_STATUS_IO`, the file a pickle
//! whose trace holds the calls made with the frame set.

use std::ffi::CString;

use super::*;

#[test]
fn dump_snapshot_refuses_null_and_empty_arguments() {
    let pool = create(&config());
    let path = CString::new("/tmp/x.pickle").unwrap_or_default();
    let empty = CString::default();
    // SAFETY: NULL, a live pool, NUL-terminated strings.
    unsafe {
        refused(
            flare_pool_dump_snapshot(ptr::null(), path.as_ptr()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_dump_snapshot",
            "pool is NULL",
        );
        refused(
            flare_pool_dump_snapshot(pool, ptr::null()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_dump_snapshot",
            "path is NULL",
        );
        refused(
            flare_pool_dump_snapshot(pool, empty.as_ptr()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_dump_snapshot",
            "path is empty",
        );
    }
    let bad = CString::new("/nonexistent-flare-dir/x.pickle").unwrap_or_default();
    // SAFETY: a live pool, a NUL-terminated string.
    let status = unsafe { flare_pool_dump_snapshot(pool, bad.as_ptr()) };
    refused(
        status,
        FlareStatus::FLARE_STATUS_IO,
        "flare_pool_dump_snapshot",
        "/nonexistent-flare-dir/x.pickle",
    );
    destroy(pool);
}

/// With `history_events` set and a frame, the file holds the allocation's events
/// with the frame's name (the pickle's bytes: its strings are stored as written).
#[test]
fn dump_snapshot_writes_the_calls_with_their_frame() {
    let mut c = config();
    c.history_events = 16;
    let pool = create(&c);
    let frame = CString::new("decode step").unwrap_or_default();
    // SAFETY: a NUL-terminated string.
    ok(unsafe { flare_history_set_frame(frame.as_ptr()) });
    let (status, p) = allocate(pool, 3 << 20);
    ok(status);
    // SAFETY: NULL clears the frame.
    ok(unsafe { flare_history_set_frame(ptr::null()) });
    let file = std::env::temp_dir().join(format!("flare-ffi-viz-{}.pickle", std::process::id()));
    let path = CString::new(file.to_string_lossy().as_bytes()).unwrap_or_default();
    // SAFETY: a live pool, a NUL-terminated string.
    ok(unsafe { flare_pool_dump_snapshot(pool, path.as_ptr()) });
    let bytes = std::fs::read(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(has("segment_map") && has("alloc") && has("decode step"));
    assert!(!has("free_requested"));
    ok(free(pool, p));
    destroy(pool);
}

#[test]
fn a_frame_that_is_not_utf8_is_refused() {
    let bad = CString::new(vec![0xff, 0xfe]).unwrap_or_default();
    // SAFETY: a NUL-terminated string.
    let status = unsafe { flare_history_set_frame(bad.as_ptr()) };
    refused(
        status,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_history_set_frame",
        "not UTF-8",
    );
}
