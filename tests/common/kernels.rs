//! The hand-written PTX kernel the GPU tests launch (no nvcc on the build machine).

/// `sum_repeat(data, n, iters, out)`: one block; each thread walks `data[0..n)` (u32)
/// with a block-stride loop, `iters` times, summing (wrapping) into a register, then
/// adds its sum to `*out`. Every parameter is 64-bit. Written by hand (no nvcc here):
/// PTX ISA 7.0 for sm_52, which the driver JIT-compiles for the device. The loads are
/// volatile so that the JIT cannot hoist them out of the outer loop: the kernel
/// really reads the range for its whole run.
pub const PTX: &str = r#".version 7.0
.target sm_52
.address_size 64

.visible .entry sum_repeat(
    .param .u64 data,
    .param .u64 n,
    .param .u64 iters,
    .param .u64 out
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [data];
    ld.param.u64 %rd2, [n];
    ld.param.u64 %rd3, [iters];
    ld.param.u64 %rd4, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd4, %rd4;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ntid.x;
    cvt.u64.u32 %rd5, %r1;
    cvt.u64.u32 %rd6, %r2;
    mov.u32 %r3, 0;
    mov.u64 %rd7, 0;
$L_outer:
    setp.ge.u64 %p1, %rd7, %rd3;
    @%p1 bra $L_done;
    mov.u64 %rd8, %rd5;
$L_inner:
    setp.ge.u64 %p2, %rd8, %rd2;
    @%p2 bra $L_next;
    shl.b64 %rd9, %rd8, 2;
    add.u64 %rd10, %rd1, %rd9;
    ld.volatile.global.u32 %r4, [%rd10];
    add.u32 %r3, %r3, %r4;
    add.u64 %rd8, %rd8, %rd6;
    bra $L_inner;
$L_next:
    add.u64 %rd7, %rd7, 1;
    bra $L_outer;
$L_done:
    atom.global.add.u32 %r5, [%rd4], %r3;
    ret;
}
"#;

/// Threads per block the tests launch `sum_repeat` with.
pub const THREADS: u32 = 1024;

use flare_package::driver::cuda::{CudaDriver, TestKernel};
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
}
