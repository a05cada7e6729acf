//! Tags, sleep and wake (issue 15) on the real CUDA driver: the driver's free memory
//! rises by what a sleeping tag held, other code can allocate it (`cuMemAlloc`), and
//! wake restores every byte (offload) at the same addresses while the other tag never
//! changes. Ignored by default (CI has no GPU); run on the GPU machine with
//! `cargo test --release --features testing --test gpu_tags -- --include-ignored
//! --nocapture`. Each test fails loudly without a GPU.
#![cfg(not(flare_loom))] // the loom build runs tests/loom.rs alone

mod common;

use common::*;
use flare_package::driver::cuda::CudaDriver;
use flare_package::{Driver, Error, Pool, ReusePolicy, SleepMode};

fn cuda() -> CudaDriver {
    CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

/// The pattern of allocation `seed`: differs per allocation and per byte.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(131).wrapping_add(i as u64 * 7 + 3) % 251) as u8)
        .collect()
}

/// Writes allocation `seed`'s pattern into its whole request.
fn fill(d: &CudaDriver, ptr: u64, seed: u64, len: u64) {
    let p = pattern(seed, len as usize);
    // SAFETY: `ptr` is a live allocation of the test's pool of at least `len` bytes,
    // owned by this test, touched by nothing else.
    unsafe { d.copy_htod(ptr, &p) }.unwrap();
}

/// Whether allocation `seed` still reads its pattern.
fn intact(d: &CudaDriver, ptr: u64, seed: u64, len: u64) -> bool {
    let mut back = vec![0u8; len as usize];
    d.copy_dtoh(ptr, &mut back).unwrap();
    back == pattern(seed, len as usize)
}

/// Two tags of buffers (2 MiB, 64 MiB and 1 GiB, one odd size), filled with patterns;
/// tag 1 sleeps in `mode`: free memory rises by its physical bytes, `cuMemAlloc` takes
/// that memory and frees it, wake maps it back; every byte of tag 1 is back (offload)
/// and tag 2 never changed.
fn sleep_round(mode: SleepMode) {
    let d = cuda();
    let pool = pool(On::Cuda, ReusePolicy::BestFit);
    let sizes = [2 * MIB, 64 * MIB, GIB, 5 * MIB + 123];
    let t1: Vec<u64> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 1).unwrap())
        .collect();
    let t2: Vec<u64> = sizes
        .iter()
        .map(|&n| pool.allocate_tagged_raw(n, None, 2).unwrap())
        .collect();
    for (i, &n) in sizes.iter().enumerate() {
        fill(&d, t1[i], i as u64, n);
        fill(&d, t2[i], 100 + i as u64, n);
    }
    let held = pool.tag_census(1).physical_bytes;
    assert_eq!(held, 2 * MIB + 64 * MIB + GIB + 6 * MIB);
    // Offload pins one host buffer of the tag's requested bytes, and the driver
    // takes device memory of its own for pinned memory (measured on the H200: the
    // free memory rose by 2 MiB less than the tag held with offload, exactly by it
    // with discard). Measure that cost here, independently: pin as much, see the
    // free memory fall, unpin.
    let overhead = if mode == SleepMode::Offload {
        let requested: u64 = sizes.iter().sum();
        let before = d.mem_info().unwrap().free;
        let buf = d.host_alloc(requested).unwrap();
        let during = d.mem_info().unwrap().free;
        d.host_free(buf).unwrap();
        before.saturating_sub(during)
    } else {
        0
    };
    println!("{mode:?}: the driver's own device memory for the pinned buffer: {overhead} bytes");
    let before = d.mem_info().unwrap();
    let started = std::time::Instant::now();
    pool.sleep(1, mode).unwrap();
    let slept = started.elapsed();
    let after = d.mem_info().unwrap();
    let rose = after.free - before.free;
    println!(
        "{mode:?}: sleep of {} MiB took {:.1} ms; driver free memory rose by {} MiB",
        held >> 20,
        slept.as_secs_f64() * 1e3,
        rose >> 20
    );
    assert!(
        rose + overhead >= held && rose <= held + overhead,
        "free memory rose by {rose} bytes; the tag held {held}, the pinned buffer costs \
         the driver {overhead}"
    );
    let s = check(&pool);
    assert_eq!(s.sleeping_bytes, held);
    assert!(pool.tag_census(1).sleeping);
    // Other code takes the memory the tag gave back, then frees it.
    let other = d
        .plain_alloc(held)
        .expect("cuMemAlloc of what the tag released");
    d.plain_free(other).unwrap();
    let started = std::time::Instant::now();
    pool.wake(1).unwrap();
    println!(
        "{mode:?}: wake took {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    check(&pool);
    for (i, &n) in sizes.iter().enumerate() {
        if mode == SleepMode::Offload {
            assert!(
                intact(&d, t1[i], i as u64, n),
                "tag 1 allocation {i} changed"
            );
        } else {
            // Discard: valid again (readable and writable), contents unspecified.
            fill(&d, t1[i], 7, n);
            assert!(intact(&d, t1[i], 7, n));
        }
        assert!(
            intact(&d, t2[i], 100 + i as u64, n),
            "tag 2 allocation {i} changed"
        );
    }
    for p in t1.into_iter().chain(t2) {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_offload_sleep_and_wake_restore_every_byte() {
    sleep_round(SleepMode::Offload);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_discard_sleep_and_wake_give_valid_pointers() {
    sleep_round(SleepMode::Discard);
}

/// A wake that cannot fit (`cuMemAlloc` took the memory) fails with out-of-memory,
/// maps nothing and keeps the tag asleep with its host copy; once the memory is
/// freed, the wake succeeds with every byte back.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_wake_that_cannot_fit_fails_cleanly_then_succeeds() {
    let d = cuda();
    let pool: Pool = pool(On::Cuda, ReusePolicy::BestFit);
    let ptrs: Vec<u64> = (0..4)
        .map(|i| {
            let p = pool.allocate_tagged_raw(GIB, None, 3).unwrap();
            fill(&d, p, i, 64 * MIB);
            p
        })
        .collect();
    pool.sleep(3, SleepMode::Offload).unwrap();
    // Leave less than the 4 GiB the tag needs: take all but 1 GiB of what is free, in
    // 1 GiB pieces (then smaller), with cuMemAlloc.
    let mut taken = Vec::new();
    let mut chunk = GIB;
    while chunk >= 2 * MIB {
        let free = d.mem_info().unwrap().free;
        if free <= GIB + chunk {
            chunk /= 2;
            continue;
        }
        match d.plain_alloc(chunk) {
            Ok(p) => taken.push(p),
            Err(_) => chunk /= 2,
        }
    }
    let free = d.mem_info().unwrap().free;
    println!("free before the wake: {} MiB", free >> 20);
    assert!(free < 4 * GIB);
    let physical = pool.snapshot().physical_bytes;
    let err = pool.wake(3).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    let s = check(&pool);
    assert_eq!(s.physical_bytes, physical, "the failed wake holds nothing");
    assert!(pool.tag_census(3).sleeping);
    assert!(
        d.mem_info().unwrap().free >= free,
        "the failed wake released what it made"
    );
    for p in taken {
        d.plain_free(p).unwrap();
    }
    pool.wake(3).unwrap();
    for (i, &p) in ptrs.iter().enumerate() {
        assert!(intact(&d, p, i as u64, 64 * MIB), "allocation {i} changed");
    }
    for p in ptrs {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    check(&pool);
}
