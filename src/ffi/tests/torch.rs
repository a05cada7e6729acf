//! PyTorch's allocator entry points through the C ABI (`src/ffi/torch.rs`): what
//! they check before the process-wide allocator is made.

use std::ffi::c_int;

use super::*;

#[test]
fn torch_outputs_and_nulls_are_checked_before_the_allocator() {
    // These return before the process-wide allocator is made (it is made from the
    // environment on first use; these tests leave it alone).
    let before = flare_torch_hook_failures();
    // SAFETY: NULL outputs are refused; NULL pointers are no-ops; nothing is read.
    unsafe {
        refused(
            flare_torch_sim_stream_create(0, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_stream_create",
            "out_stream is NULL",
        );
        refused(
            flare_torch_sim_end_capture(0, ptr::null_mut(), ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_end_capture",
            "out_valid is NULL",
        );
        let mut words = [3_u64; 2];
        let misaligned = words
            .as_mut_ptr()
            .cast::<u8>()
            .wrapping_add(1)
            .cast::<c_int>();
        refused(
            flare_torch_sim_end_capture(0, ptr::null_mut(), misaligned),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_end_capture",
            "out_valid is misaligned",
        );
        refused(
            flare_torch_sim_faults(0, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_faults",
            "out_faults is NULL",
        );
        assert_eq!(words, [3; 2]);
        // 0 bytes: NULL, no error, no allocator.
        assert!(flare_torch_alloc(0, 0, ptr::null_mut()).is_null());
        // NULL frees and record_stream: nothing, no failure counted.
        flare_torch_free(ptr::null_mut(), 0, 0, ptr::null_mut());
        flare_torch_pool_free(ptr::null_mut(), 0, 0, ptr::null_mut());
        flare_torch_record_stream(ptr::null_mut(), ptr::null_mut());
    }
    assert_eq!(flare_torch_hook_failures(), before);
}
