//! The zeroing wake (issue 34) on the real CUDA driver: a tag put to sleep in discard
//! mode wakes on physical memory another allocation just filled with garbage, and
//! `Pool::wake_zeroed` leaves exactly the requested bytes of each live allocation
//! zero (whole mappings and segment blocks); and the rows of `docs/vmm-semantics.md`,
//! "Memset", that the simulated driver reproduces. Ignored by default (CI has no
//! GPU); run on the GPU machine with `cargo test --release --features testing --test
//! gpu -- --include-ignored --nocapture wake_zeroed::`. Each test fails loudly without
//! a GPU.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use common::*;
use flare_package::driver::cuda::CudaDriver;
use flare_package::driver::{CuResult, DriverCall};
use flare_package::{Driver, Pool, ReusePolicy, SleepMode, Stream};

fn cuda() -> CudaDriver {
    CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

/// A byte pattern with no zero byte, different per allocation.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((seed * 131 + i * 7 + 3) % 251) as u8 + 1)
        .collect()
}

fn read(d: &CudaDriver, ptr: u64, len: u64) -> Vec<u8> {
    let mut back = vec![0u8; len as usize];
    d.copy_dtoh(ptr, &mut back).unwrap();
    back
}

/// Fills the device's free memory (all but `keep` bytes) with 0xAB through
/// `cuMemAlloc`, then frees it: the handles a wake creates next are likely to be
/// made of pages that hold 0xAB, as a KV cache woken on another model's memory.
fn dirty_free_memory(d: &CudaDriver, keep: u64) {
    let free = d.mem_info().unwrap().free;
    let n = free.saturating_sub(keep) / (2 * MIB) * (2 * MIB);
    if n == 0 {
        return;
    }
    let p = d.plain_alloc(n).unwrap();
    // SAFETY: `[p, p + n)` is plain device memory this test just allocated and owns.
    unsafe { d.memset_d8(p, 0xAB, n) }.unwrap();
    d.synchronize(0).unwrap();
    d.plain_free(p).unwrap();
}

/// Whole mappings (best-fit) and segment blocks of tag 1, each filled with a pattern
/// over its whole request; discard sleep; the freed memory dirtied; a zeroing wake
/// on a non-blocking stream; after that stream's work, every requested byte reads 0,
/// and the census counts each allocation's requested bytes and one memset each. A
/// plain wake after a discard sleep is shown for comparison (what it reads is
/// printed: the driver guarantees nothing).
fn zeroing_round(policy: ReusePolicy) {
    let d = cuda();
    let pool: Pool = pool(On::Cuda, policy);
    let sizes = [4096, 3 * MIB + 100, 64 * MIB, 700_001];
    let ptrs: Vec<u64> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 1).unwrap())
        .collect();
    for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        // SAFETY: `p` is a live allocation of this test's pool of at least `n` bytes.
        unsafe { d.copy_htod(p, &pattern(i as u64, n)) }.unwrap();
    }
    let requested: u64 = sizes.iter().sum();

    // A plain wake first: what discarded memory holds on this GPU (printed only).
    pool.sleep(1, SleepMode::Discard).unwrap();
    dirty_free_memory(&d, 256 * MIB);
    pool.wake(1).unwrap();
    let nonzero: usize = ptrs
        .iter()
        .zip(&sizes)
        .map(|(&p, &n)| read(&d, p, n).iter().filter(|&&b| b != 0).count())
        .sum();
    println!("{policy:?}: a plain wake after a discard sleep: {nonzero} of {requested} requested bytes non-zero");
    assert_eq!(pool.tag_census(1).zeroed_bytes, 0);

    // The zeroing wake.
    pool.sleep(1, SleepMode::Discard).unwrap();
    dirty_free_memory(&d, 256 * MIB);
    let stream = d.stream_create_non_blocking().unwrap();
    let started = std::time::Instant::now();
    pool.wake_zeroed(1, stream).unwrap();
    let queued = started.elapsed();
    d.stream_synchronize(stream).unwrap();
    println!(
        "{policy:?}: zeroing wake of {} MiB requested: {:.2} ms to queue, {:.2} ms with the memsets done",
        requested >> 20,
        queued.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64() * 1e3
    );
    for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        let back = read(&d, p, n);
        let first = back.iter().position(|&b| b != 0);
        assert_eq!(
            first, None,
            "allocation {i} ({n} bytes): byte {first:?} not zero"
        );
    }
    let c = pool.tag_census(1);
    assert!(!c.sleeping);
    assert_eq!(c.zeroed_bytes, requested);
    assert_eq!(c.zero_memsets, sizes.len() as u64);
    // An offload sleep's wake restores the bytes: zeroing does nothing.
    for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        // SAFETY: as above.
        unsafe { d.copy_htod(p, &pattern(10 + i as u64, n)) }.unwrap();
    }
    pool.sleep(1, SleepMode::Offload).unwrap();
    pool.wake_zeroed(1, stream).unwrap();
    d.stream_synchronize(stream).unwrap();
    for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
        assert!(
            read(&d, p, n) == pattern(10 + i as u64, n),
            "allocation {i} changed"
        );
    }
    assert_eq!(
        pool.tag_census(1).zeroed_bytes,
        requested,
        "nothing more zeroed"
    );
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    d.stream_destroy(stream).unwrap();
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_zeroing_wake_zeroes_whole_mappings() {
    let _serial = one_at_a_time();
    zeroing_round(ReusePolicy::BestFit);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_zeroing_wake_zeroes_segment_blocks() {
    let _serial = one_at_a_time();
    zeroing_round(ReusePolicy::Segments);
}

/// `docs/vmm-semantics.md`, "Memset": `cuMemsetD8Async` on a mapped range with
/// access sets it (read back after the stream's work); on a reserved range with
/// nothing mapped, on a mapping with no access granted, and on a range running from
/// a mapping into unmapped addresses, the call is refused with
/// `CUDA_ERROR_INVALID_VALUE` and writes nothing. Prints every answer (and that of
/// 0 bytes on an unmapped address, which no row settles: the pool never asks it).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_memset_rows() {
    let _serial = one_at_a_time();
    let d = cuda();
    let g = d.granularity().unwrap();
    let r = d.reserve(4 * g).unwrap();
    let h = d.create(g).unwrap();
    d.map(r.ptr, h).unwrap();
    d.set_access(r.ptr, g, &[0]).unwrap();
    // A second handle mapped without access, at the third granule.
    let h2 = d.create(g).unwrap();
    d.map(r.ptr + 2 * g, h2).unwrap();
    let s = Stream::LEGACY;
    let ok = d.memset_async(r.ptr, 0x5A, g, s);
    d.synchronize(0).unwrap();
    println!("mapped with access: {ok:?}");
    assert_eq!(ok, Ok(()));
    assert!(read(&d, r.ptr, g).iter().all(|&b| b == 0x5A));
    let code = |r: Result<(), flare_package::DriverError>| r.err().map(|e| (e.call, e.code));
    let want = Some((DriverCall::MemsetD8Async, CuResult::INVALID_VALUE));
    let unmapped = code(d.memset_async(r.ptr + g, 0, 4096, s));
    let no_access = code(d.memset_async(r.ptr + 2 * g, 0, 4096, s));
    let across = code(d.memset_async(r.ptr + g - 4096, 0, 8192, s));
    let empty = code(d.memset_async(r.ptr + g, 0, 0, s));
    println!(
        "unmapped: {unmapped:?}; no access: {no_access:?}; across: {across:?}; 0 bytes: {empty:?}"
    );
    // A refused call leaves the context usable and wrote nothing.
    d.synchronize(0).unwrap();
    assert!(read(&d, r.ptr, g).iter().all(|&b| b == 0x5A));
    assert_eq!(unmapped, want);
    assert_eq!(no_access, want);
    assert_eq!(across, want);
    d.unmap(r.ptr, g).unwrap();
    d.unmap(r.ptr + 2 * g, g).unwrap();
    d.release(h).unwrap();
    d.release(h2).unwrap();
    d.free_reservation(r).unwrap();
}
