//! The growth report of a pool through the C ABI (issue 38): step markers
//! (`flare_pool_mark_step`) and the report as text or JSON
//! (`flare_pool_growth_report`), over `Pool::mark_step` and `Pool::growth_report`.

use std::ffi::{c_char, c_int};
use std::mem::MaybeUninit;

use super::boundary::{c_buffer, copy_c_string, out_arg, pool_boundary};
use super::pool::FlarePool;
use super::types::FlareStatus;
use crate::growth::{GrowthOptions, GrowthReport, DEFAULT_MIN_STEPS, DEFAULT_STEP_EVENTS};

/// The options of a growth report from the C arguments: 0 is the default of each
/// (as in `FlarePoolConfig`).
pub(crate) fn options(step_events: u64, min_steps: u64) -> GrowthOptions {
    GrowthOptions {
        step_events: if step_events == 0 {
            DEFAULT_STEP_EVENTS
        } else {
            step_events
        },
        min_steps: if min_steps == 0 {
            DEFAULT_MIN_STEPS
        } else {
            min_steps
        },
    }
}

/// `report` as the caller asked: JSON when `json` is non-zero, else text.
pub(crate) fn render(report: &GrowthReport, json: c_int) -> String {
    if json != 0 {
        report.to_json()
    } else {
        report.to_string()
    }
}

/// Writes a step marker: the pool's allocations made from now on belong to the next
/// step of `flare_pool_growth_report`. Call it once per request or iteration of a
/// serving loop. A recording pool writes a `step` line.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for NULL. Thread-safe.
///
/// # Safety
/// `pool` is NULL or a live pool.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_mark_step(pool: *mut FlarePool) -> FlareStatus {
    // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
    flare_pool_mark_step_inner(unsafe { pool.as_ref() })
}

/// `flare_pool_mark_step` on the caller's pool.
fn flare_pool_mark_step_inner(pool: Option<&FlarePool>) -> FlareStatus {
    pool_boundary("flare_pool_mark_step", pool, |p| {
        p.pool.mark_step();
        p.injected_panic_point();
        Ok(())
    })
}

/// The pool's growth report: the allocations still live, grouped by tag, size and
/// the step they were made in, with the rate each group grows at, the groups that
/// keep growing first. Steps are the markers of `flare_pool_mark_step` when one was
/// written, else the retention scopes begun, else `step_events` allocations (0: 1000);
/// a group grows when its live allocations come from at least `min_steps` distinct
/// steps (0: 32), one of them in the last quarter of the steps. `json` 0: the text
/// people read (the rule and its thresholds included); non-zero: one JSON object
/// (its keys: docs/c-guide.md, "Growth report").
///
/// Copies the report (UTF-8) into `buf` as a NUL-terminated string truncated to
/// `len - 1` bytes and writes its full length in bytes, without the NUL, to
/// `*out_len` (so `*out_len >= len` means it was truncated: call again with a larger
/// buffer). `buf` NULL or `len` 0: only `*out_len` is written. The pool's state
/// changes in between, so the second call's report may be longer still.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL `pool` or `out_len` (nothing
/// written). Thread-safe; takes the pool's lock while it copies what is live.
///
/// # Safety
/// `pool` is NULL or a live pool; `buf` is NULL or points to at least `len` writable
/// bytes; `out_len` is NULL or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn flare_pool_growth_report(
    pool: *const FlarePool,
    step_events: u64,
    min_steps: u64,
    json: c_int,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> FlareStatus {
    flare_pool_growth_report_inner(
        // SAFETY: `pool` is NULL or a live pool, by the caller's contract.
        unsafe { pool.as_ref() },
        options(step_events, min_steps),
        json,
        // SAFETY: `buf` is NULL or has `len` writable bytes, by the caller's contract.
        unsafe { c_buffer(buf, len) },
        out_len,
    )
}

/// `flare_pool_growth_report` on the caller's pool and buffers.
fn flare_pool_growth_report_inner(
    pool: Option<&FlarePool>,
    options: GrowthOptions,
    json: c_int,
    buf: Option<&mut [MaybeUninit<c_char>]>,
    out_len: *mut usize,
) -> FlareStatus {
    pool_boundary("flare_pool_growth_report", pool, |p| {
        // SAFETY: `out_len` is NULL or a writable `size_t`, by the caller's
        // contract; `out_arg` refuses NULL and a misaligned pointer.
        let out = unsafe { out_arg(out_len, "out_len") }?;
        let text = render(&p.pool.growth_report(&options), json);
        p.injected_panic_point();
        out.write(copy_c_string(text.as_bytes(), buf));
        Ok(())
    })
}
