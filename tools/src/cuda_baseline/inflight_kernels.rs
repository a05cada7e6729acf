//! The `sum_repeat` test kernel that keeps a stream busy while frees of memory in
//! flight are timed.

use flare_package::driver::cuda::{CudaDriver, TestKernel, TransferError, SUM_REPEAT_PTX};
use flare_package::driver::{CuResult, DevicePtr, Driver, Stream};

use super::{plain_alloc, plain_free};

/// Bytes of the buffer the long kernel of [`InflightKernels`] reads: 64 MiB.
const HEAD_BYTES: u64 = 64 << 20;

/// Bytes each short kernel of [`InflightKernels::queue`] reads at the start of a
/// buffer: 4 KiB (1024 u32, one per thread).
pub const TOUCH_BYTES: u64 = 4096;

/// Threads of the one block every `sum_repeat` launch uses.
const THREADS: u32 = 1024;

/// The `sum_repeat` kernel (`SUM_REPEAT_PTX`, loaded on a driver's context) with a
/// 64 MiB buffer of its own for the long kernel to read and a 4-byte result: what
/// keeps a stream busy while frees of memory in flight are timed. The buffers are
/// `cuMemAlloc_v2` memory, freed with the module unloaded when this is dropped: let
/// the work queued with it end first.
#[derive(Debug)]
pub struct InflightKernels<'a> {
    driver: &'a CudaDriver,
    kernel: Option<TestKernel>,
    head: DevicePtr,
    out: DevicePtr,
}

impl<'a> InflightKernels<'a> {
    /// Loads the kernel on `driver`'s context and allocates and zeroes its buffers
    /// (then waits for the device, once, so that work on any stream sees them
    /// zeroed).
    ///
    /// # Errors
    ///
    /// The failed driver function with its code (`cuModuleLoadData`, `cuMemAlloc_v2`,
    /// `cuMemsetD8_v2`, `cuCtxSynchronize`); a missing driver function
    /// (`CUDA_ERROR_NOT_FOUND`, naming it).
    pub fn new(driver: &'a CudaDriver) -> Result<InflightKernels<'a>, TransferError> {
        let mut this = InflightKernels {
            driver,
            kernel: Some(driver.load_test_kernel(SUM_REPEAT_PTX, "sum_repeat")?),
            head: 0,
            out: 0,
        };
        this.head = plain_alloc(driver, HEAD_BYTES)?;
        this.out = plain_alloc(driver, 4)?;
        for (ptr, bytes) in [(this.head, HEAD_BYTES), (this.out, 4)] {
            // SAFETY: `ptr` is a `cuMemAlloc_v2` allocation of `bytes` bytes owned by
            // `this`, and no work uses it yet.
            unsafe { driver.memset_d8(ptr, 0, bytes) }?;
        }
        driver
            .synchronize(driver.device())
            .map_err(|e| TransferError {
                function: e.call.cuda_name(),
                code: e.code,
            })?;
        Ok(this)
    }

    fn kernel(&self) -> Result<&TestKernel, TransferError> {
        self.kernel.as_ref().ok_or(TransferError {
            function: "cuModuleGetFunction",
            code: CuResult::NOT_FOUND,
        })
    }

    /// The number of passes over the 64 MiB buffer that take about `target` on
    /// `stream`: one pass queued there, timed with a stream synchronize (the module's
    /// first launch made before, untimed). At least 1.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` or `cuStreamSynchronize` with its code.
    pub fn passes_for(
        &self,
        stream: Stream,
        target: std::time::Duration,
    ) -> Result<u64, TransferError> {
        let mut one = std::time::Duration::ZERO;
        for _ in 0..2 {
            let t = std::time::Instant::now();
            self.launch(stream, self.head, HEAD_BYTES / 4, 1)?;
            self.driver.stream_synchronize(stream)?;
            one = t.elapsed().max(std::time::Duration::from_micros(10));
        }
        Ok(((target.as_secs_f64() / one.as_secs_f64()).ceil() as u64).max(1))
    }

    fn launch(
        &self,
        stream: Stream,
        data: DevicePtr,
        n: u64,
        passes: u64,
    ) -> Result<(), TransferError> {
        let kernel = self.kernel()?;
        // SAFETY: `sum_repeat` takes four 64-bit parameters (data, count, passes,
        // out). Every caller passes `data` = the 64 MiB head buffer with `n` covering
        // it, or a buffer that `queue`'s caller promises; `out` is this struct's
        // 4-byte allocation; `stream` is the caller's live stream of this context.
        unsafe {
            self.driver.launch_test_kernel_on(
                kernel,
                1,
                THREADS,
                &[data, n, passes, self.out],
                stream,
            )
        }
    }

    /// Queues on `stream` a kernel reading the 64 MiB buffer `passes` times (about
    /// the `target` given to [`InflightKernels::passes_for`]), then a one-pass kernel
    /// reading the first [`TOUCH_BYTES`] of every `every`-th buffer of `buffers`
    /// (the first included), behind it. Returns once queued. A launch per buffer of a
    /// thousand could fill the driver's launch queue, whose depth is not documented,
    /// and block the host until the long kernel ends.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` with its code.
    ///
    /// # Safety
    ///
    /// Each buffer is device memory of at least [`TOUCH_BYTES`] bytes in this
    /// driver's context (not host memory, under unified addressing), and stays mapped
    /// until `stream`'s work up to the kernel reading it has completed: it is freed
    /// only stream-ordered on `stream` (`cuMemFreeAsync`, flare-package's
    /// `free_async`) or by a free that waits for the device first; `stream` is a live
    /// stream of this context.
    pub unsafe fn queue(
        &self,
        stream: Stream,
        passes: u64,
        buffers: &[DevicePtr],
        every: usize,
    ) -> Result<(), TransferError> {
        self.launch(stream, self.head, HEAD_BYTES / 4, passes)?;
        for &b in buffers.iter().step_by(every.max(1)) {
            self.launch(stream, b, TOUCH_BYTES / 4, 1)?;
        }
        Ok(())
    }
}

impl Drop for InflightKernels<'_> {
    fn drop(&mut self) {
        // Failures are ignored, as in `StreamOrderedPool`'s drop. The owner lets the
        // work queued with these buffers end first (a stream synchronize).
        for ptr in [self.head, self.out] {
            if ptr != 0 {
                let _ = plain_free(self.driver, ptr);
            }
        }
        if let Some(k) = self.kernel.take() {
            let _ = self.driver.unload_test_kernel(k);
        }
    }
}
