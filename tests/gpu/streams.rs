//! Stream order on the real GPU (issue 11, "On the H200"): `allocate_async`,
//! `free_async` and the release on fence events, with hand-written PTX kernels
//! (`tests/common/kernels.rs`) keeping memory in flight for about 0.7 s on
//! non-blocking streams, and a stream capture in global mode (PyTorch's) with no
//! retention scope.
//!
//! Every GPU test is ignored by default (CI has no GPU); run them on the GPU machine
//! with `--include-ignored`. Each fails loudly without a GPU. The pool runs on a
//! [`Counting`] driver, so each test checks that the pool made no `cuCtxSynchronize`
//! (a device-wide wait, which would also break an open capture). The one test that
//! runs everywhere checks that the counter does see the synchronize of a plain free.
//!
//! The tests take one lock and run one at a time (`crate::one_at_a_time`): a stream
//! query, a stream synchronize or a synchronous copy made by any thread in global
//! capture mode invalidates a capture open on another (`docs/vmm-semantics.md`), and
//! the tests make such calls while the capture test's capture may be open.

use crate::common;
use crate::one_at_a_time::one_at_a_time;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::counting::Counting;
use common::kernels::{SumRun, PTX};
use common::{check, MIB};
use flare_package::driver::cuda::{CudaDriver, TestKernel};
use flare_package::driver::{CaptureMode, DriverCall, Stream};
use flare_package::{CrossStreamReuse, DevicePtr, Driver, Pool, PoolConfig, SimDriver};

/// The buffer the long kernels read: 64 MiB, a multiple of the H200's 2 MiB
/// granularity, so the mapping behind it is exactly this size.
const SIZE: u64 = 64 * MIB;

/// A pool on device 0 through a [`Counting`] driver, the `sum_repeat` kernel, and the
/// streams a test made (destroyed by [`Rig::finish`], after the pool is dropped: the
/// pool may record fences on them until then).
struct Rig {
    d: Arc<CudaDriver>,
    counted: Arc<Counting<CudaDriver>>,
    pool: Pool,
    kernel: TestKernel,
    streams: Vec<Stream>,
}

impl Rig {
    fn new(config: PoolConfig) -> Rig {
        let d = Arc::new(
            CudaDriver::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}")),
        );
        let counted = Arc::new(Counting::new(d.clone()));
        let pool = Pool::with_driver(config, counted.clone()).unwrap();
        let kernel = d.load_test_kernel(PTX, "sum_repeat").unwrap();
        Rig {
            d,
            counted,
            pool,
            kernel,
            streams: Vec::new(),
        }
    }

    /// A new non-blocking stream (as PyTorch's side and capture streams are): not
    /// ordered with the legacy stream nor with any other stream.
    fn stream(&mut self) -> Stream {
        let s = self.d.stream_create_non_blocking().unwrap();
        self.streams.push(s);
        s
    }

    /// `sum_repeat` over the `bytes` bytes at `data` (every byte `fill`) into `out`.
    fn sum(&self, data: DevicePtr, bytes: u64, out: DevicePtr, fill: u8) -> SumRun<'_> {
        SumRun {
            driver: &self.d,
            device: 0,
            kernel: &self.kernel,
            data,
            n: bytes / 4,
            out,
            fill,
        }
    }

    /// Sets every byte of `[ptr, ptr + bytes)` to `value`, queued on `stream`.
    fn fill(&self, ptr: DevicePtr, bytes: u64, value: u8, stream: Stream) {
        // SAFETY: every caller passes a live allocation of this test's pool of at
        // least `bytes` bytes, which nothing else touches until `stream` gets to it.
        unsafe { self.d.memset_d8_async(ptr, value, bytes, stream) }.unwrap();
    }

    /// `cuCtxSynchronize` calls the pool made so far.
    fn device_syncs(&self) -> u64 {
        self.counted.count(DriverCall::Synchronize)
    }

    /// Drops the pool, then waits for and destroys the streams, and unloads the
    /// kernel.
    fn finish(self) {
        let Rig {
            d,
            counted: _,
            pool,
            kernel,
            streams,
        } = self;
        drop(pool);
        for s in streams {
            d.stream_synchronize(s).unwrap();
            d.stream_destroy(s).unwrap();
        }
        d.unload_test_kernel(kernel).unwrap();
    }
}

/// Fails unless `stream` still has work running: a check made after a pool call is
/// only evidence if the kernel was still running when the call returned.
#[track_caller]
fn assert_running(d: &CudaDriver, stream: Stream, kernel_time: Duration) {
    assert!(
        !d.stream_query(stream).unwrap(),
        "the kernel (about {kernel_time:?}) had already finished, so this check shows \
         nothing (the calibration made it too short?)"
    );
}

/// A pool configuration on device 0 with `reuse` and a release threshold.
fn config(reuse: CrossStreamReuse, release_threshold_bytes: u64) -> PoolConfig {
    PoolConfig {
        cross_stream_reuse: reuse,
        release_threshold_bytes,
        ..PoolConfig::cuda(0)
    }
}

/// Runs everywhere: the counter the GPU tests rely on does count the device-wide
/// synchronize of the synchronous path. A free outside a scope with the release
/// threshold at 0 releases the mapping after one `cuCtxSynchronize` of the pool's one
/// device (the contract of `free_raw`, unchanged by issue 11), so a "zero
/// synchronizes" check on the stream paths is not zero for want of counting.
#[test]
fn the_counter_sees_the_synchronize_of_a_plain_free() {
    let counted = Arc::new(Counting::new(Arc::new(SimDriver::default())));
    let pool = Pool::with_driver(PoolConfig::default(), counted.clone()).unwrap();
    let p = pool.allocate_raw(MIB).unwrap();
    assert_eq!(counted.count(DriverCall::Create), 1);
    assert_eq!(counted.count(DriverCall::Synchronize), 0);
    pool.free_raw(p).unwrap();
    assert_eq!(counted.count(DriverCall::Synchronize), 1);
    assert_eq!(counted.count(DriverCall::Unmap), 1);
    assert_eq!(counted.count(DriverCall::Release), 1);
    assert_eq!(pool.snapshot().physical_bytes, 0);
}

/// (a) Memory freed on S while a kernel on S still reads it comes back to the next
/// allocation on S at once, without waiting for the kernel (stream order makes it
/// safe), and work queued on S after it sees what it writes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_same_stream_reuse_is_immediate_and_stream_ordered() {
    let _serial = one_at_a_time();
    let mut rig = Rig::new(config(CrossStreamReuse::WhenComplete, 0));
    let s = rig.stream();
    let (pool, d) = (&rig.pool, &rig.d);
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out_a = pool.allocate_async_raw(4, s).unwrap();
    let out_b = pool.allocate_async_raw(4, s).unwrap();
    rig.fill(data, SIZE, 3, s);
    let a = rig.sum(data, SIZE, out_a, 3);
    // SAFETY: `data` and `out_a` are live allocations of this test, kept mapped
    // until the kernels are done (what the pool must guarantee).
    let (one, iters) = unsafe { a.calibrate_on(s) };
    let kernel_time = one.mul_f64(iters as f64);
    let before = check(pool);

    let t = Instant::now();
    // SAFETY: as above; `data` is freed on S behind the kernel, which the pool must
    // not release before the kernel is done.
    unsafe { a.launch_on(iters, s) };
    pool.free_async_raw(data, s).unwrap();
    let freed = check(pool);
    let again = pool.allocate_async(SIZE, s).unwrap();
    let took = t.elapsed();
    assert_running(d, s, kernel_time);
    assert_eq!(again.ptr(), data, "the memory freed on S comes back on S");
    assert_eq!(again.stream(), Some(s));
    assert!(
        took < kernel_time / 4,
        "launch + free + allocate took {took:?}: it waited for the kernel (~{kernel_time:?})"
    );
    // Freed: idle and waiting on S's fence, still mapped.
    assert_eq!(
        (freed.idle_bytes, freed.event_wait_bytes),
        (SIZE, SIZE),
        "{freed:#?}"
    );
    assert_eq!(freed.physical_bytes, before.physical_bytes);
    assert_eq!(freed.mappings_released, before.mappings_released);
    // Reused: one more hit, no new mapping, nothing across streams.
    let hit = check(pool);
    assert_eq!(hit.reuse_hits, before.reuse_hits + 1);
    assert_eq!(hit.mappings_created, before.mappings_created);
    assert_eq!((hit.cross_stream_hits, hit.cross_stream_waits), (0, 0));
    assert_eq!((hit.idle_bytes, hit.event_wait_bytes), (0, 0));

    // Queued after the kernel on S: overwrite with 5s and sum them.
    rig.fill(again.ptr(), SIZE, 5, s);
    let b = rig.sum(again.ptr(), SIZE, out_b, 5);
    // SAFETY: `again` and `out_b` are live allocations of this test.
    unsafe { b.launch_on(2, s) };
    assert_eq!(
        a.read_out_on(s),
        a.expected(iters),
        "the first kernel read 3s to its end: the memory was neither released nor \
         overwritten under it"
    );
    assert_eq!(
        b.read_out(),
        b.expected(2),
        "the kernel after it read the 5s"
    );

    drop(again); // the guard frees on S
    let after = check(pool);
    assert_eq!(after.frees, hit.frees + 1);
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    pool.free_async_raw(out_a, s).unwrap();
    pool.free_async_raw(out_b, s).unwrap();
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    rig.finish();
}

/// (b) Memory freed on S while S's kernel runs is not handed to T (with
/// `WhenComplete` and `Never`); with `WhenComplete` it is once the kernel is done.
fn other_stream_does_not_get_memory_in_flight(reuse: CrossStreamReuse) {
    let _serial = one_at_a_time();
    // A threshold that keeps every freed mapping cached: what T can get is then a
    // question of reuse alone, never of a release.
    let mut rig = Rig::new(config(reuse, u64::MAX));
    let (s, t) = (rig.stream(), rig.stream());
    let (pool, d) = (&rig.pool, &rig.d);
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out_a = pool.allocate_async_raw(4, s).unwrap();
    let out_t = pool.allocate_async_raw(4, t).unwrap();
    rig.fill(data, SIZE, 3, s);
    let a = rig.sum(data, SIZE, out_a, 3);
    // SAFETY: `data` and `out_a` are live allocations of this test, kept mapped
    // until the kernels are done.
    let (one, iters) = unsafe { a.calibrate_on(s) };
    let kernel_time = one.mul_f64(iters as f64);
    let before = check(pool);

    // SAFETY: as above; `data` is freed behind the kernel.
    unsafe { a.launch_on(iters, s) };
    pool.free_async_raw(data, s).unwrap();
    let q = pool.allocate_async_raw(SIZE, t).unwrap();
    assert_running(d, s, kernel_time);
    assert_ne!(
        q, data,
        "{reuse:?}: T got memory that S's running kernel still reads"
    );
    let s1 = check(pool);
    assert_eq!(s1.mappings_created, before.mappings_created + 1, "{s1:#?}");
    assert_eq!((s1.cross_stream_hits, s1.cross_stream_waits), (0, 0));
    assert_eq!(s1.event_wait_bytes, SIZE, "data waits on S's fence");

    assert_eq!(
        a.read_out_on(s),
        a.expected(iters),
        "the kernel on S read 3s"
    );
    if reuse == CrossStreamReuse::WhenComplete {
        // S's work up to the free is complete: T gets the memory now (`q` stays
        // live, so `data` is the only idle mapping of that size).
        let r = pool.allocate_async_raw(SIZE, t).unwrap();
        assert_eq!(r, data, "after completion, T reuses the memory freed on S");
        let s2 = check(pool);
        assert_eq!((s2.cross_stream_hits, s2.cross_stream_waits), (1, 0));
        assert_eq!(s2.mappings_created, s1.mappings_created);
        rig.fill(r, SIZE, 5, t);
        let b = rig.sum(r, SIZE, out_t, 5);
        // SAFETY: `r` and `out_t` are live allocations of this test.
        unsafe { b.launch_on(2, t) };
        assert_eq!(b.read_out_on(t), b.expected(2));
        pool.free_async_raw(r, t).unwrap();
    }
    for (p, on) in [(q, t), (out_a, s), (out_t, t)] {
        pool.free_async_raw(p, on).unwrap();
    }
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    rig.finish();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_other_stream_gets_the_memory_only_when_complete() {
    other_stream_does_not_get_memory_in_flight(CrossStreamReuse::WhenComplete);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_never_mode_keeps_memory_in_flight_from_other_streams() {
    other_stream_does_not_get_memory_in_flight(CrossStreamReuse::Never);
}

/// (b) With `Wait`, T gets memory freed on S at once, even while S's kernel still
/// reads it, and T's later work is ordered after that kernel (`cuStreamWaitEvent`):
/// T overwrites the buffer, and S's kernel still reads only what it had.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_wait_mode_hands_over_at_once_and_orders_the_new_stream() {
    let _serial = one_at_a_time();
    let mut rig = Rig::new(config(CrossStreamReuse::Wait, u64::MAX));
    let (s, t) = (rig.stream(), rig.stream());
    let (pool, d) = (&rig.pool, &rig.d);
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out_a = pool.allocate_async_raw(4, s).unwrap();
    let out_b = pool.allocate_async_raw(4, t).unwrap();
    rig.fill(data, SIZE, 3, s);
    let a = rig.sum(data, SIZE, out_a, 3);
    // SAFETY: `data` and `out_a` are live allocations of this test, kept mapped
    // until the kernels are done.
    let (one, iters) = unsafe { a.calibrate_on(s) };
    let kernel_time = one.mul_f64(iters as f64);
    let before = check(pool);

    let started = Instant::now();
    // SAFETY: as above; `data` is freed behind the kernel.
    unsafe { a.launch_on(iters, s) };
    pool.free_async_raw(data, s).unwrap();
    let r = pool.allocate_async_raw(SIZE, t).unwrap();
    let took = started.elapsed();
    assert_running(d, s, kernel_time);
    assert_eq!(r, data, "Wait: T gets the memory freed on S at once");
    assert!(
        took < kernel_time / 4,
        "launch + free + allocate took {took:?}: the host waited for the kernel \
         (~{kernel_time:?}); Wait orders T on the device"
    );
    let s1 = check(pool);
    assert_eq!((s1.cross_stream_hits, s1.cross_stream_waits), (1, 1));
    assert_eq!(s1.mappings_created, before.mappings_created);
    assert_eq!(s1.reuse_hits, before.reuse_hits + 1);

    // T overwrites the buffer with 5s and sums it; ordered after S's kernel.
    rig.fill(r, SIZE, 5, t);
    let b = rig.sum(r, SIZE, out_b, 5);
    // SAFETY: `r` and `out_b` are live allocations of this test.
    unsafe { b.launch_on(2, t) };
    if !d.stream_query(s).unwrap() {
        assert!(
            !d.stream_query(t).unwrap(),
            "T's work finished while S's kernel still runs: T did not wait for it"
        );
    }
    assert_eq!(
        a.read_out_on(s),
        a.expected(iters),
        "S's kernel saw T's 5s: T's work was not ordered after it"
    );
    assert_eq!(b.read_out_on(t), b.expected(2), "T read its own 5s");
    for (p, on) in [(r, t), (out_a, s), (out_b, t)] {
        pool.free_async_raw(p, on).unwrap();
    }
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    rig.finish();
}

/// (c) Release threshold 0, no scope: memory freed on S while S's kernel reads it
/// stays mapped through release points that come while the kernel runs (a free's
/// poll fences it: it was idle at the previous poll); a few release points after
/// the kernel is done release it (polls come at frees 1, 3, 7, ... over the
/// threshold). The kernel sums right (nothing unmapped under it) and the context is
/// healthy afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_release_waits_for_the_kernel_then_happens_at_a_later_call() {
    let _serial = one_at_a_time();
    let mut rig = Rig::new(config(CrossStreamReuse::WhenComplete, 0));
    let (s, t) = (rig.stream(), rig.stream());
    let (pool, d) = (&rig.pool, &rig.d);
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out = pool.allocate_async_raw(4, s).unwrap();
    // Allocated and freed on T (which has no work) as release points.
    let probe = pool.allocate_async_raw(2 * MIB, t).unwrap();
    let release_point = || {
        let p = pool.allocate_async_raw(2 * MIB, t).unwrap();
        pool.free_async_raw(p, t).unwrap();
    };
    rig.fill(data, SIZE, 3, s);
    let a = rig.sum(data, SIZE, out, 3);
    // SAFETY: `data` and `out` are live allocations of this test, kept mapped until
    // the kernel is done.
    let (one, iters) = unsafe { a.calibrate_on(s) };
    let kernel_time = one.mul_f64(iters as f64);
    let base = check(pool);
    assert_eq!(base.physical_bytes, SIZE + 2 * 2 * MIB);

    // SAFETY: as above; `data` is freed behind the kernel.
    unsafe { a.launch_on(iters, s) };
    pool.free_async_raw(data, s).unwrap(); // free 1 over the threshold: a poll
    let freed = check(pool);
    assert_eq!(
        freed.physical_bytes, base.physical_bytes,
        "released at the free"
    );
    assert_eq!(freed.event_wait_bytes, SIZE);
    // Frees 2, 3 (a poll: `data` was idle at the last one, so it is fenced) and 4,
    // while the kernel runs: `data` stays mapped.
    pool.free_async_raw(probe, t).unwrap();
    release_point();
    release_point();
    let polled = check(pool);
    assert_running(d, s, kernel_time);
    assert!(
        polled.physical_bytes >= SIZE + 2 * MIB,
        "data was released while the kernel read it\n{polled:#?}"
    );
    assert!(polled.event_wait_bytes >= SIZE, "{polled:#?}");
    assert!(
        polled.events_outstanding >= 1,
        "no fence recorded on S, yet data waits on S's work\n{polled:#?}"
    );

    // The kernel ends with the right sum (a range unmapped under it would fault:
    // the stream synchronize returns the fault).
    assert_eq!(a.read_out_on(s), a.expected(iters), "kernel result");
    // The next poll (free 7) sees S's fence complete and releases `data`.
    for _ in 5..=7 {
        release_point();
    }
    let released = check(pool);
    assert!(
        released.physical_bytes <= 2 * 2 * MIB,
        "data still held after its kernel completed and a release point polled\n\
         {released:#?}"
    );
    assert!(released.mappings_released > base.mappings_released);
    assert!(released.event_wait_bytes < SIZE, "{released:#?}");

    // The context is healthy: a fresh allocation, written and read back.
    d.mem_info().unwrap();
    let fresh = pool.allocate_async_raw(2 * MIB, s).unwrap();
    rig.fill(fresh, 2 * MIB, 7, s);
    d.stream_synchronize(s).unwrap();
    let mut back = vec![0u8; 64];
    d.copy_dtoh(fresh, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 7), "{back:?}");
    pool.free_async_raw(fresh, s).unwrap();
    pool.free_async_raw(out, s).unwrap();
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    rig.finish();
}

/// (d) When the pool must release now (trim), it waits on the fences of the memory
/// it releases, not on the device: trim returns once S's kernel (which reads memory
/// freed on S) is done, while a longer kernel on T still runs, and no
/// `cuCtxSynchronize` is made.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_trim_waits_on_the_fences_not_the_device() {
    let _serial = one_at_a_time();
    let mut rig = Rig::new(config(CrossStreamReuse::WhenComplete, 0));
    let (s, t) = (rig.stream(), rig.stream());
    let (pool, d) = (&rig.pool, &rig.d);
    let data = pool.allocate_async_raw(SIZE, s).unwrap();
    let out_a = pool.allocate_async_raw(4, s).unwrap();
    let busy = pool.allocate_async_raw(SIZE, t).unwrap();
    let out_t = pool.allocate_async_raw(4, t).unwrap();
    rig.fill(data, SIZE, 3, s);
    rig.fill(busy, SIZE, 1, t);
    let a = rig.sum(data, SIZE, out_a, 3);
    let long = rig.sum(busy, SIZE, out_t, 1);
    // SAFETY: `data`, `busy` and the outs are live allocations of this test, kept
    // mapped until the kernels are done.
    let (one, iters) = unsafe { a.calibrate_on(s) };
    d.stream_synchronize(t).unwrap();
    let kernel_time = one.mul_f64(iters as f64);
    let before = check(pool);

    // SAFETY: as above; `data` is freed behind its kernel; `busy` stays live.
    unsafe {
        long.launch_on(3 * iters, t);
        a.launch_on(iters, s);
    }
    pool.free_async_raw(data, s).unwrap();
    assert_running(d, s, kernel_time);
    let started = Instant::now();
    pool.trim().unwrap();
    let took = started.elapsed();
    assert!(
        d.stream_query(s).unwrap(),
        "trim returned after {took:?} with S's kernel still reading the memory it released"
    );
    assert!(
        !d.stream_query(t).unwrap(),
        "trim returned after {took:?}, with T's kernel (~{:?}) done too: it waited for \
         the whole device",
        kernel_time * 3
    );
    let trimmed = check(pool);
    assert_eq!(
        trimmed.physical_bytes,
        before.physical_bytes - SIZE,
        "{trimmed:#?}"
    );
    assert_eq!(
        (trimmed.event_wait_bytes, trimmed.events_outstanding),
        (0, 0),
        "{trimmed:#?}"
    );
    assert_eq!(rig.device_syncs(), 0, "trim made a cuCtxSynchronize");
    assert!(
        rig.counted.count(DriverCall::EventSynchronize) + rig.counted.count(DriverCall::EventQuery)
            >= 1,
        "trim released memory in flight without waiting on any fence"
    );
    assert_eq!(a.read_out_on(s), a.expected(iters), "S's kernel result");
    assert_eq!(
        long.read_out_on(t),
        long.expected(3 * iters),
        "T's kernel result"
    );
    for (p, on) in [(busy, t), (out_t, t), (out_a, s)] {
        pool.free_async_raw(p, on).unwrap();
    }
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    rig.finish();
}

/// (e) A capture in global mode on a non-blocking stream (what `torch.cuda.graph`
/// does), with no retention scope, while another stream has memory freed behind a
/// running kernel (so the pool has a fence to poll): allocations and frees inside
/// the capture leave it valid, memory freed in the capture is reused by a later
/// allocation in the same capture, the memory stays mapped after the capture
/// through a release point, and the graph replays with the right results.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_capture_without_a_scope_stays_valid_and_replays() {
    const CAP: u64 = 8 * MIB;
    let _serial = one_at_a_time();
    let mut rig = Rig::new(config(CrossStreamReuse::WhenComplete, 0));
    let (c, t) = (rig.stream(), rig.stream());
    let (pool, d) = (&rig.pool, &rig.d);
    let out1 = pool.allocate_async_raw(4, c).unwrap();
    let out2 = pool.allocate_async_raw(4, c).unwrap();
    let z = pool.allocate_async_raw(SIZE, t).unwrap();
    let out_z = pool.allocate_async_raw(4, t).unwrap();
    rig.fill(z, SIZE, 1, t);
    let zk = rig.sum(z, SIZE, out_z, 1);
    // SAFETY: `z` and `out_z` are live allocations of this test, kept mapped until
    // the kernel is done.
    let (one, iters) = unsafe { zk.calibrate_on(t) };
    d.stream_synchronize(c).unwrap();
    // SAFETY: as above; `z` is freed on T behind the kernel.
    unsafe { zk.launch_on(iters, t) };
    pool.free_async_raw(z, t).unwrap();
    assert_running(d, t, one.mul_f64(iters as f64));
    let before = check(pool);
    assert_eq!(before.captures_seen, 0);

    d.stream_begin_capture(c, CaptureMode::Global).unwrap();
    let x = pool.allocate_async_raw(CAP, c).unwrap();
    rig.fill(x, CAP, 4, c);
    let xk = rig.sum(x, CAP, out1, 4);
    // SAFETY: captured, not run: the graph reads `x` and writes `out1` when it is
    // replayed below, while both are mapped (what the pool must guarantee).
    unsafe { xk.launch_on(2, c) };
    pool.free_async_raw(x, c).unwrap();
    let y = pool.allocate_async_raw(CAP, c).unwrap();
    rig.fill(y, CAP, 6, c);
    let yk = rig.sum(y, CAP, out2, 6);
    // SAFETY: as for `xk`.
    unsafe { yk.launch_on(2, c) };
    pool.free_async_raw(y, c).unwrap();
    let graph = d
        .stream_end_capture(c)
        .unwrap_or_else(|e| panic!("the pool broke the capture: {e}"));
    assert_eq!(
        y, x,
        "memory freed in the capture serves the next allocation in it"
    );
    let captured = check(pool);
    assert_eq!(captured.captures_seen, 1, "{captured:#?}");
    assert_eq!(captured.capture_held_bytes, CAP, "{captured:#?}");
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize during the capture"
    );

    // A release point after the capture: the captured memory stays mapped.
    let tmp = pool.allocate_async_raw(2 * MIB, t).unwrap();
    pool.free_async_raw(tmp, t).unwrap();
    assert_eq!(check(pool).capture_held_bytes, CAP);

    let exec = d.graph_instantiate(&graph).unwrap();
    for replay in 0..2 {
        // SAFETY: the graph touches `x` (held by the pool for it), `out1` and `out2`
        // (live), all mapped until the replay is done.
        unsafe { d.graph_launch(&exec, c) }.unwrap();
        assert_eq!(
            xk.read_out_on(c),
            xk.expected(2),
            "replay {replay}: sum of 4s"
        );
        assert_eq!(yk.read_out(), yk.expected(2), "replay {replay}: sum of 6s");
    }
    d.graph_exec_destroy(exec).unwrap();
    d.graph_destroy(graph).unwrap();
    assert_eq!(zk.read_out_on(t), zk.expected(iters), "T's kernel result");

    for (p, on) in [(out1, c), (out2, c), (out_z, t)] {
        pool.free_async_raw(p, on).unwrap();
    }
    assert_eq!(
        rig.device_syncs(),
        0,
        "a cuCtxSynchronize on the stream path"
    );
    // With no scope open at capture time, trim releases what the capture held. A
    // graph's replays may run on any stream, so no fence covers them: that release
    // synchronizes the device, once (the documented contract of capture-held memory).
    pool.trim().unwrap();
    let trimmed = check(pool);
    assert_eq!(trimmed.capture_held_bytes, 0, "{trimmed:#?}");
    assert_eq!(trimmed.physical_bytes, 0, "{trimmed:#?}");
    assert_eq!(
        rig.device_syncs(),
        1,
        "one synchronize, for the captured memory"
    );
    rig.finish();
}
