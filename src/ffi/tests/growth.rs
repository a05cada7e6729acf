//! Step markers and the growth report through the C ABI (`src/ffi/growth.rs`,
//! `src/ffi/torch_growth.rs`): NULL arguments, the length and truncation
//! conventions, text and JSON, the defaults of 0, a poisoned pool.

use std::ffi::c_int;

use crate::growth::GrowthOptions;

use super::*;

/// `flare_pool_growth_report` into a buffer of `len` bytes (NULL for 0): status,
/// the written text, the length written to `out_len`.
fn report(
    pool: *const FlarePool,
    step_events: u64,
    min_steps: u64,
    json: c_int,
    len: usize,
) -> (FlareStatus, String, usize) {
    let mut buf = vec![b'#' as c_char; len.max(1)];
    let mut out_len = usize::MAX;
    let p = if len == 0 {
        ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    };
    // SAFETY: `pool` is live or NULL; `buf` has `len` writable bytes; `out_len` is
    // writable.
    let st = unsafe {
        flare_pool_growth_report(pool, step_events, min_steps, json, p, len, &mut out_len)
    };
    let text = if len == 0 {
        String::new()
    } else {
        if st == FlareStatus::FLARE_STATUS_SUCCESS {
            // SAFETY: NUL-terminated within `len` bytes on success.
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::from_utf8_lossy(&buf.iter().map(|&c| c as u8).collect::<Vec<_>>()).into_owned()
        }
    };
    (st, text, out_len)
}

#[test]
fn nulls_are_refused_and_nothing_is_written() {
    // SAFETY: a NULL pool is refused.
    refused(
        unsafe { flare_pool_mark_step(NULL_POOL) },
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_mark_step",
        "pool is NULL",
    );
    let (st, text, out_len) = report(NULL_POOL, 0, 0, 0, 8);
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_growth_report",
        "pool is NULL",
    );
    assert_eq!((text.as_str(), out_len), ("########", usize::MAX));

    let pool = create(&config());
    let mut buf = [b'#' as c_char; 4];
    // SAFETY: `pool` is live; a NULL `out_len` is refused before `buf` is written.
    let st =
        unsafe { flare_pool_growth_report(pool, 0, 0, 0, buf.as_mut_ptr(), 4, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_growth_report",
        "out_len is NULL",
    );
    assert_eq!(buf, [b'#' as c_char; 4]);
    destroy(pool);

    // The PyTorch allocator's: a NULL `out_len` is refused before the allocator is
    // made (these tests leave the process-wide allocator alone).
    // SAFETY: NULL buffers; a NULL `out_len` is refused.
    let st = unsafe { flare_torch_growth_report(0, 0, 0, 0, ptr::null_mut(), 0, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_torch_growth_report",
        "out_len is NULL",
    );
}

/// 40 marked steps keeping a 1 MiB allocation each: the report is the pool's own
/// (`Pool::growth_report` with the defaults 0 stands for), its length returned
/// whatever the buffer, truncated to `len - 1` bytes; the JSON form carries the
/// options given.
#[test]
#[allow(clippy::unwrap_used)] // a test: a failed step is its failure
fn the_report_as_text_and_json_with_its_length() {
    let pool = create(&config());
    for _ in 0..40 {
        // SAFETY: `pool` is live.
        ok(unsafe { flare_pool_mark_step(pool) });
        let (st, _) = allocate(pool, MIB as usize);
        ok(st);
    }
    // SAFETY: `pool` is live; read through the Rust API for the expected text.
    let want = unsafe { &(*pool).pool }
        .growth_report(&GrowthOptions::default())
        .to_string();
    assert!(want.contains("; 1 grows\n"), "{want}");
    // Only the length.
    let (st, _, n) = report(pool, 0, 0, 0, 0);
    ok(st);
    assert_eq!(n, want.len());
    // The whole text, in a buffer with room for its NUL.
    let (st, text, n) = report(pool, 0, 0, 0, want.len() + 1);
    ok(st);
    assert_eq!((text.as_str(), n), (want.as_str(), want.len()));
    // Truncated: 9 bytes and the NUL, the full length returned.
    let (st, text, n) = report(pool, 0, 0, 0, 10);
    ok(st);
    assert_eq!((text.as_str(), n), (&want[..9], want.len()));

    // JSON; the options passed through (5 allocations a step is unused: markers).
    let (st, json, n) = report(pool, 5, 7, 1, 1 << 16);
    ok(st);
    assert_eq!(n, json.len());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["step_kind"], "markers");
    assert_eq!(
        (v["steps"].as_u64(), v["min_steps"].as_u64()),
        (Some(41), Some(7))
    );
    assert_eq!(v["growing"], 1);
    assert_eq!(v["groups"][0]["bytes"], MIB);
    assert_eq!(v["groups"][0]["count"], 40);
    // 0 is the default threshold.
    let (st, json, _) = report(pool, 0, 0, 1, 1 << 16);
    ok(st);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["min_steps"], 32);
    destroy(pool);
}

/// A panic in the report is caught: `FLARE_STATUS_INTERNAL`, nothing written, the
/// pool poisoned; its markers are refused from then on.
#[test]
fn a_panic_in_the_report_poisons_the_pool() {
    let pool = create(&config());
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_inject_panic(pool) });
    let (st, text, n) = report(pool, 0, 0, 0, 4);
    refused(
        st,
        FlareStatus::FLARE_STATUS_INTERNAL,
        "flare_pool_growth_report",
        "injected by flare_sim_inject_panic",
    );
    assert_eq!((text.as_str(), n), ("####", usize::MAX));
    // SAFETY: `pool` is live (poisoned).
    refused(
        unsafe { flare_pool_mark_step(pool) },
        FlareStatus::FLARE_STATUS_INTERNAL,
        "flare_pool_mark_step",
        "poisoned",
    );
    destroy(pool);
}
