//! The hand-written PTX kernel the GPU tests launch (no nvcc on the build machine).

/// `sum_repeat(data, n, iters, out)`, hand-written PTX: see
/// [`SUM_REPEAT_PTX`](flare_package::driver::cuda::SUM_REPEAT_PTX) (in the library's
/// test support, so that the GPU benchmark launches the same kernel).
pub const PTX: &str = flare_package::driver::cuda::SUM_REPEAT_PTX;

/// Threads per block the tests launch `sum_repeat` with.
pub const THREADS: u32 = 1024;

use flare_package::driver::cuda::{CudaDriver, TestKernel};
use flare_package::driver::Stream;
use flare_package::{DevicePtr, Driver};
use std::time::{Duration, Instant};

/// `sum_repeat` on `driver`'s device over `n` u32 of `data`, every byte of which is
/// `fill`, summing into the u32 at `out` (a device-`device` allocation).
pub struct SumRun<'a> {
    pub driver: &'a CudaDriver,
    pub device: i32,
    pub kernel: &'a TestKernel,
    pub data: DevicePtr,
    pub n: u64,
    pub out: DevicePtr,
    pub fill: u8,
}

impl SumRun<'_> {
    /// The sum after `iters` passes: every u32 is `fill` in each of its four bytes.
    pub fn expected(&self, iters: u64) -> u32 {
        (u32::from(self.fill) * 0x0101_0101)
            .wrapping_mul(self.n as u32)
            .wrapping_mul(iters as u32)
    }

    /// The u32 at `out`.
    pub fn read_out(&self) -> u32 {
        let mut word = [0u8; 4];
        self.driver.copy_dtoh(self.out, &mut word).unwrap();
        u32::from_le_bytes(word)
    }

    /// Zeroes `out` and queues `iters` passes; returns when the launch is queued, not
    /// when the kernel is done.
    ///
    /// # Safety
    ///
    /// `data` holds `n` u32 readable from this device and `out` is a live 4-byte
    /// allocation of the caller; both stay mapped until the kernel is done (which is
    /// what the GPU tests check the pool guarantees).
    pub unsafe fn launch(&self, iters: u64) {
        // SAFETY: `out` is a live 4-byte allocation (the caller's promise).
        unsafe { self.driver.memset_d8(self.out, 0, 4) }.unwrap();
        self.driver.synchronize(self.device).unwrap();
        let params = [self.data, self.n, iters, self.out];
        // SAFETY: `sum_repeat` takes four 64-bit parameters (data, count, passes,
        // out); the caller keeps both ranges mapped until it is done.
        unsafe {
            self.driver
                .launch_test_kernel(self.kernel, 1, THREADS, &params)
        }
        .unwrap();
    }

    /// One pass, timed and checked, then the number of passes that take about 0.7 s;
    /// returns (one pass, passes).
    ///
    /// # Safety
    ///
    /// As [`SumRun::launch`].
    pub unsafe fn calibrate(&self) -> (Duration, u64) {
        let t = Instant::now();
        // SAFETY: the caller's promise.
        unsafe { self.launch(1) };
        self.driver.synchronize(self.device).unwrap();
        let one = t.elapsed().max(Duration::from_micros(50));
        assert_eq!(self.read_out(), self.expected(1), "one pass sums right");
        let iters = (Duration::from_millis(700).as_secs_f64() / one.as_secs_f64()).ceil() as u64;
        (one, iters.clamp(1, 1 << 20))
    }

    /// The u32 at `out` once `stream`'s work so far has completed: a stream
    /// synchronize (not a device-wide one), then a copy on the legacy stream.
    pub fn read_out_on(&self, stream: Stream) -> u32 {
        self.driver.stream_synchronize(stream).unwrap();
        self.read_out()
    }

    /// [`SumRun::launch`] on `stream`, with no synchronize at all: zeroes `out` and
    /// queues `iters` passes, both on `stream` (on a stream being captured, both
    /// become graph nodes).
    ///
    /// # Safety
    ///
    /// As [`SumRun::launch`], with "until the kernel is done" meaning until
    /// `stream`'s work up to it has completed; `stream` is a live stream of this
    /// device.
    pub unsafe fn launch_on(&self, iters: u64, stream: Stream) {
        // SAFETY: `out` is a live 4-byte allocation (the caller's promise).
        unsafe { self.driver.memset_d8_async(self.out, 0, 4, stream) }.unwrap();
        let params = [self.data, self.n, iters, self.out];
        // SAFETY: `sum_repeat` takes four 64-bit parameters (data, count, passes,
        // out); the caller keeps both ranges mapped until it is done.
        unsafe {
            self.driver
                .launch_test_kernel_on(self.kernel, 1, THREADS, &params, stream)
        }
        .unwrap();
    }

    /// [`SumRun::calibrate`] on `stream`, with stream synchronizes only: one pass,
    /// timed and checked, then the number of passes that take about 0.7 s.
    ///
    /// # Safety
    ///
    /// As [`SumRun::launch_on`].
    pub unsafe fn calibrate_on(&self, stream: Stream) -> (Duration, u64) {
        // Once untimed: the first launch of a module pays for its loading.
        // SAFETY: the caller's promise.
        unsafe { self.launch_on(1, stream) };
        assert_eq!(
            self.read_out_on(stream),
            self.expected(1),
            "one pass sums right"
        );
        let t = Instant::now();
        // SAFETY: the caller's promise.
        unsafe { self.launch_on(1, stream) };
        self.driver.stream_synchronize(stream).unwrap();
        let one = t.elapsed().max(Duration::from_micros(50));
        let iters = (Duration::from_millis(700).as_secs_f64() / one.as_secs_f64()).ceil() as u64;
        (one, iters.clamp(1, 1 << 20))
    }
}
