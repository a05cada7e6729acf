//! The growth report of the PyTorch allocator for the Python package (issue 38:
//! `mark_step()`, `growth_report()`), over `TorchAllocator::mark_step` and
//! `TorchAllocator::growth_report`.

use std::ffi::{c_char, c_int};
use std::mem::MaybeUninit;

use super::boundary::{boundary, c_buffer, copy_c_string, out_arg};
use super::growth::{options, render};
use super::torch::allocator;
use super::types::FlareStatus;
use crate::growth::GrowthOptions;

/// Writes a step marker for every pool of every device (`mark_step()` in Python):
/// allocations made from now on belong to the next step of
/// `flare_torch_growth_report`. Recording pools write a `step` line.
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a bad `FLARE_TORCH_*` variable.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn flare_torch_mark_step() -> FlareStatus {
    boundary("flare_torch_mark_step", || {
        allocator()?.mark_step();
        Ok(())
    })
}

/// The growth report of `device`'s per-tensor allocations (`growth_report()` in
/// Python): what is live in its tensor pool and every graph pool, grouped by tag,
/// size and step, as `flare_pool_growth_report` says (the same arguments, buffer and
/// length conventions; steps counted over every pool of every device).
///
/// Errors: `FLARE_STATUS_INVALID_ARGUMENT` for a NULL `out_len`, a device outside
/// `0..64` (or beyond the simulated machine's) or a bad `FLARE_TORCH_*` variable
/// (nothing written). Thread-safe.
///
/// # Safety
/// `buf` is NULL or points to at least `len` writable bytes; `out_len` is NULL or
/// points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn flare_torch_growth_report(
    device: c_int,
    step_events: u64,
    min_steps: u64,
    json: c_int,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> FlareStatus {
    flare_torch_growth_report_inner(
        device,
        options(step_events, min_steps),
        json,
        // SAFETY: `buf` is NULL or has `len` writable bytes, by the caller's contract.
        unsafe { c_buffer(buf, len) },
        out_len,
    )
}

/// `flare_torch_growth_report` into the caller's buffers.
fn flare_torch_growth_report_inner(
    device: c_int,
    options: GrowthOptions,
    json: c_int,
    buf: Option<&mut [MaybeUninit<c_char>]>,
    out_len: *mut usize,
) -> FlareStatus {
    boundary("flare_torch_growth_report", || {
        // SAFETY: `out_len` is NULL or a writable `size_t`, by the caller's
        // contract; `out_arg` refuses NULL and a misaligned pointer.
        let out = unsafe { out_arg(out_len, "out_len") }?;
        let report = allocator()?.growth_report(device, &options)?;
        out.write(copy_c_string(render(&report, json).as_bytes(), buf));
        Ok(())
    })
}
