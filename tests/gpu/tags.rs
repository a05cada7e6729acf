//! Tags, sleep and wake (issue 15) on the real CUDA driver: the driver's free memory
//! rises by what a sleeping tag held, other code can allocate it (`cuMemAlloc`), and
//! wake restores every byte (offload) at the same addresses while the other tag never
//! changes. Ignored by default (CI has no GPU); run on the GPU machine with
//! `cargo test --release --features testing --test gpu -- --include-ignored
//! --nocapture tags::`. Each test fails loudly without a GPU.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

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
    let _serial = one_at_a_time();
    sleep_round(SleepMode::Offload);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_discard_sleep_and_wake_give_valid_pointers() {
    let _serial = one_at_a_time();
    sleep_round(SleepMode::Discard);
}

/// A wake that cannot fit (`cuMemAlloc` took the memory) fails with out-of-memory,
/// maps nothing and keeps the tag asleep with its host copy; once the memory is
/// freed, the wake succeeds with every byte back.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_wake_that_cannot_fit_fails_cleanly_then_succeeds() {
    let _serial = one_at_a_time();
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

/// Segment mode: each tag's blocks come from its own heap, so a tag (tag 0
/// included) sleeps without touching the other's bytes: the driver's free memory
/// rises by the sleeping tag's physical bytes, and wake (offload) restores every byte
/// of its blocks at the same addresses.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_segment_tags_sleep_apart() {
    let _serial = one_at_a_time();
    let d = cuda();
    let pool: Pool = pool(On::Cuda, ReusePolicy::Segments);
    // Blocks of 4 KiB to 64 MiB (one odd size): a few handles per heap.
    let sizes = [4096, 3 * MIB + 100, 64 * MIB, 700_000];
    let mut mine: Vec<(u32, u64, u64, u64)> = Vec::new();
    for tag in [0u32, 1] {
        for (i, &n) in sizes.iter().enumerate() {
            let p = pool.allocate_tagged_raw(n, None, tag).unwrap();
            let seed = u64::from(tag) * 100 + i as u64;
            fill(&d, p, seed, n);
            mine.push((tag, p, seed, n));
        }
    }
    check(&pool);
    for tag in [1u32, 0] {
        let held = pool.tag_census(tag).physical_bytes;
        assert!(held > 0);
        // The pinned buffer's own device memory (see sleep_round).
        let requested: u64 = sizes.iter().sum();
        let before = d.mem_info().unwrap().free;
        let buf = d.host_alloc(requested).unwrap();
        let overhead = before.saturating_sub(d.mem_info().unwrap().free);
        d.host_free(buf).unwrap();
        let before = d.mem_info().unwrap().free;
        let started = std::time::Instant::now();
        pool.sleep(tag, SleepMode::Offload).unwrap();
        let slept = started.elapsed();
        let rose = d.mem_info().unwrap().free.saturating_sub(before);
        println!(
            "segments, tag {tag}: sleep of {} MiB took {:.1} ms; free memory rose by {} MiB",
            held >> 20,
            slept.as_secs_f64() * 1e3,
            rose >> 20
        );
        assert!(rose + overhead >= held && rose <= held + overhead);
        let s = check(&pool);
        assert_eq!(s.sleeping_block_count, sizes.len() as u64);
        for &(t, p, seed, n) in &mine {
            if t != tag {
                assert!(intact(&d, p, seed, n), "tag {t} changed while {tag} slept");
            }
        }
        pool.wake(tag).unwrap();
        check(&pool);
        for &(_, p, seed, n) in &mine {
            assert!(intact(&d, p, seed, n), "{p:#x} changed");
        }
    }
    for (_, p, _, _) in mine {
        pool.free_raw(p).unwrap();
    }
    pool.trim().unwrap();
    assert_eq!(check(&pool).physical_bytes, 0);
}

/// A capture of a blocking stream the pool has never seen, in global mode: sleep is
/// a scope-state error found before any synchronize (the legacy stream's capture
/// query answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), and the capture stays valid
/// (its end gives a graph). Then the documented limit: a non-blocking stream's capture
/// cannot be seen; the sleep's synchronize fails (the tag stays awake) and that
/// capture is invalidated. Prints what the driver did in both cases.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sleep_during_a_capture_the_pool_never_saw() {
    let _serial = one_at_a_time();
    let d = cuda();
    let pool: Pool = pool(On::Cuda, ReusePolicy::Segments);
    let a = pool.allocate_tagged_raw(MIB, None, 1).unwrap();
    fill(&d, a, 5, MIB);
    let blocking = d.stream_create_blocking().unwrap();
    d.stream_begin_capture(blocking, flare_package::CaptureMode::Global)
        .unwrap();
    let r = pool.sleep(1, SleepMode::Offload);
    let ended = d.stream_end_capture(blocking);
    println!(
        "blocking stream: sleep {r:?}; end capture ok: {}",
        ended.is_ok()
    );
    assert!(matches!(r, Err(Error::ScopeState(_))), "{r:?}");
    let graph = ended.expect("the capture stays valid");
    d.graph_destroy(graph).unwrap();
    assert!(!pool.tag_census(1).sleeping);
    d.stream_destroy(blocking).unwrap();

    let other = d.stream_create_non_blocking().unwrap();
    d.stream_begin_capture(other, flare_package::CaptureMode::Global)
        .unwrap();
    let r = pool.sleep(1, SleepMode::Offload);
    let ended = d.stream_end_capture(other);
    println!(
        "non-blocking stream (the documented limit): sleep {r:?}; end capture ok: {}",
        ended.is_ok()
    );
    assert!(matches!(r, Err(Error::Driver { .. })), "{r:?}");
    assert!(!pool.tag_census(1).sleeping);
    if let Ok(g) = ended {
        d.graph_destroy(g).unwrap();
    }
    d.stream_destroy(other).unwrap();
    // Usable afterwards.
    pool.sleep(1, SleepMode::Offload).unwrap();
    pool.wake(1).unwrap();
    assert!(intact(&d, a, 5, MIB));
    pool.free_raw(a).unwrap();
    check(&pool);
}
