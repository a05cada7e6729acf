//! The content model's copies (`cuMemcpyDtoH`, `cuMemcpyHtoD`) and host buffers
//! (`cuMemHostAlloc`, `cuMemFreeHost`): a copy moves exactly its range, a range over
//! two adjacent mappings is contiguous, a host range must lie inside a live buffer.
//! Expected values come from the call's documentation, not from running the simulator.

use crate::common;
use crate::vmm_rows::{sim, G, INVALID, OK};
use common::mapped_for;

/// `cuMemcpyDtoH` / `cuMemcpyHtoD` copy exactly `size` bytes between the given
/// offsets, across page boundaries and at offsets inside pages (the content model's
/// 4096-byte pages are the simulator's own, invisible to a caller): the bytes before
/// and after the destination range are untouched, and host bytes never written read
/// as zeros ("a page never written reads as zeros"), also where they land over
/// written device bytes.
#[test]
fn copies_move_exactly_their_range() {
    const PAGE: usize = 4096;
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let a: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8 + 1).collect();
    assert_eq!(d.write(va, &a), OK);
    let r2 = va + (1 << 20);
    assert_eq!(d.write(r2, &[0xee; 4 * PAGE]), OK);
    let host = d.mem_host_alloc(4 * PAGE as u64).unwrap();
    // Host bytes [100, 5100) get a[3000..8000); the rest of the buffer is never written.
    assert_eq!(d.memcpy_dtoh(host, 100, va + 3000, 5000), OK);
    // Host [0, 6000) to r2 + 50: zeros, a[3000..8000), zeros.
    assert_eq!(d.memcpy_htod(r2 + 50, host, 0, 6000), OK);
    // Host [2 pages + 10, + 3000), never written, to r2 + 9000: zeros.
    assert_eq!(
        d.memcpy_htod(r2 + 9000, host, 2 * PAGE as u64 + 10, 3000),
        OK
    );
    let mut want = vec![0xee; 4 * PAGE];
    want[50..150].fill(0);
    want[150..5150].copy_from_slice(&a[3000..8000]);
    want[5150..6050].fill(0);
    want[9000..12000].fill(0);
    let got = d.read(r2, 4 * PAGE as u64).unwrap();
    let first_diff = got.iter().zip(&want).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "r2 differs from byte {first_diff:?} on");
    // The source range is unchanged by the copy out of it.
    assert_eq!(d.read(va, 3 * PAGE as u64).unwrap(), a);
}

/// A range over two adjacent mappings of two handles is one range to a kernel and
/// to `cuMemcpyDtoH` / `cuMemcpyHtoD` (row "unmap one range covering two adjacent
/// whole mappings of two handles: success": the VA is contiguous): bytes written
/// across the boundary read back whole, each handle holding its part, and a copy
/// out of and back into such ranges moves them exactly; device bytes never written
/// read as stale bytes (`SIM_STALE_BYTE`: new physical memory is not zeroed), at the
/// right length.
#[test]
fn ranges_across_two_mappings_are_contiguous() {
    let d = sim();
    let va = d.mem_address_reserve(2 * G, 0).unwrap();
    let (h1, h2) = (d.mem_create(G).unwrap(), d.mem_create(G).unwrap());
    assert_eq!(d.mem_map(va, G, 0, h1), OK);
    assert_eq!(d.mem_map(va + G, G, 0, h2), OK);
    assert_eq!(d.mem_set_access(va, G, &[0]), OK);
    assert_eq!(d.mem_set_access(va + G, G, &[0]), OK);
    // 5000 bytes on each side of the boundary (more than one 4096-byte page each).
    let p: Vec<u8> = (0..10_000).map(|i| (i % 241) as u8 + 7).collect();
    let at = va + G - 5000;
    assert_eq!(d.write(at, &p), OK);
    assert_eq!(d.read(at, 10_000).unwrap(), p);
    assert_eq!(d.read(va + G, 5000).unwrap(), &p[5000..]);
    assert_eq!(d.read(va + G - 5000, 5000).unwrap(), &p[..5000]);
    // A never-written stretch reads as stale bytes, its length exact.
    let stale = flare_package::driver::sim::SIM_STALE_BYTE;
    assert_eq!(d.read(va + 4096 + 10, 9000).unwrap(), vec![stale; 9000]);
    // Out to the host and back in at another place across the boundary.
    let host = d.mem_host_alloc(16_384).unwrap();
    assert_eq!(d.memcpy_dtoh(host, 100, at, 10_000), OK);
    let back = va + G - 7000;
    assert_eq!(d.memcpy_htod(back, host, 100, 10_000), OK);
    assert_eq!(d.read(back, 10_000).unwrap(), p);
}

/// `cuMemcpyDtoH` / `cuMemcpyHtoD`: "`CUDA_ERROR_INVALID_VALUE` (nothing copied)
/// when ... the host range is not inside a live buffer": a range ending exactly at
/// the buffer's end is inside it; one byte further is not, nor is a freed buffer.
#[test]
fn a_host_range_may_end_at_its_buffers_end_and_no_further() {
    let d = sim();
    let va = mapped_for(&d, G, &[0]);
    let host = d.mem_host_alloc(8192).unwrap();
    assert_eq!(d.memcpy_dtoh(host, 8192 - 6000, va, 6000), OK);
    assert_eq!(d.memcpy_htod(va, host, 8192 - 6000, 6000), OK);
    assert_eq!(d.memcpy_dtoh(host, 8192 - 5999, va, 6000), INVALID);
    assert_eq!(d.memcpy_htod(va, host, 8192 - 5999, 6000), INVALID);
    assert_eq!(d.mem_free_host(host), OK);
    assert_eq!(d.memcpy_dtoh(host, 0, va, 4096), INVALID);
}

/// `cuMemHostAlloc`: "returns its address (never 0, never reused)"; "Errors:
/// `CUDA_ERROR_INVALID_VALUE` for 0 bytes"; `host_bytes`: bytes allocated and not
/// yet freed. `cuMemFreeHost`: `CUDA_ERROR_INVALID_VALUE` for an address that is
/// not a live host buffer (one freed already).
#[test]
fn host_buffers_are_distinct_nonzero_and_counted() {
    let d = sim();
    assert_eq!(d.mem_host_alloc(0), Err(INVALID));
    let a = d.mem_host_alloc(1000).unwrap();
    let b = d.mem_host_alloc(3000).unwrap();
    assert!(a != 0 && b != 0 && a != b, "{a:#x} {b:#x}");
    assert_eq!(d.host_bytes(), 4000);
    assert_eq!(d.mem_free_host(a), OK);
    assert_eq!(d.host_bytes(), 3000);
    assert_eq!(d.mem_free_host(a), INVALID);
    let c = d.mem_host_alloc(10).unwrap();
    assert!(c != 0 && c != a && c != b, "reused {c:#x}");
    assert_eq!(d.mem_free_host(b), OK);
    assert_eq!(d.mem_free_host(c), OK);
    assert_eq!(d.host_bytes(), 0);
}
