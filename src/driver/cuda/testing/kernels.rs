//! Hand-written PTX kernels that keep work in flight: loading, launching, unloading.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::TransferError;
use crate::driver::cuda::conversions::{code, cu_stream};
use crate::driver::cuda::CudaDriver;
use crate::driver::{CuResult, Stream};

/// `sum_repeat(data, n, iters, out)`: one block; each thread walks `data[0..n)` (u32)
/// with a block-stride loop, `iters` times, summing (wrapping) into a register, then
/// adds its sum to `*out`. Every parameter is 64-bit. Written by hand (no nvcc here):
/// PTX ISA 7.0 for sm_52, which the driver JIT-compiles for the device. The loads are
/// volatile so that the JIT cannot hoist them out of the outer loop: the kernel
/// really reads the range for its whole run. Load it with
/// [`CudaDriver::load_test_kernel`]`(SUM_REPEAT_PTX, "sum_repeat")`. Test and
/// benchmark support: the GPU tests and `flare-bench-gpu` keep memory in flight with it.
pub const SUM_REPEAT_PTX: &str = r#".version 7.0
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
/// A kernel loaded from PTX by [`CudaDriver::load_test_kernel`]: test support only.
/// Unload it with [`CudaDriver::unload_test_kernel`] (dropping it leaks the module
/// until the context goes).
#[doc(hidden)]
#[derive(Debug)]
pub struct TestKernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
}
impl CudaDriver {
    /// Loads a PTX module (`cuModuleLoadData`; the driver JIT-compiles it for this
    /// device) and looks up its kernel `kernel` (`cuModuleGetFunction`). Test
    /// support: the GPU test that keeps a kernel reading an allocation while the
    /// caller frees it. Unload it with [`CudaDriver::unload_test_kernel`].
    ///
    /// # Errors
    ///
    /// The failed function with its code (`CUDA_ERROR_INVALID_PTX` (218) for PTX the
    /// JIT refuses, `CUDA_ERROR_NOT_FOUND` for a kernel the module lacks); on a failed
    /// lookup the module is unloaded again.
    #[doc(hidden)]
    pub fn load_test_kernel(&self, ptx: &str, kernel: &str) -> Result<TestKernel, TransferError> {
        let image = std::ffi::CString::new(ptx).map_err(|_| TransferError {
            function: "cuModuleLoadData",
            code: CuResult::INVALID_VALUE,
        })?;
        let name = std::ffi::CString::new(kernel).map_err(|_| TransferError {
            function: "cuModuleGetFunction",
            code: CuResult::INVALID_VALUE,
        })?;
        let mut module: sys::CUmodule = ptr::null_mut();
        self.transfer("cuModuleLoadData", || {
            // SAFETY: `module` is a valid out-pointer; `image` is a NUL-terminated PTX
            // text that outlives the call (the driver copies what it keeps).
            code(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) })
        })?;
        let mut function: sys::CUfunction = ptr::null_mut();
        let found = self.transfer("cuModuleGetFunction", || {
            // SAFETY: `function` is a valid out-pointer, `module` was loaded above and
            // `name` is NUL-terminated.
            code(unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) })
        });
        let loaded = TestKernel { module, function };
        if let Err(e) = found {
            let _ = self.unload_test_kernel(loaded);
            return Err(e);
        }
        Ok(loaded)
    }

    /// Launches `kernel` with `grid` x `block` threads (one dimension each, no shared
    /// memory) on the legacy default stream (`cuLaunchKernel`), every parameter a
    /// 64-bit value (device pointers, counts). Asynchronous: returns once queued; a
    /// [`Driver::synchronize`](crate::driver::Driver::synchronize) waits for it and returns its fault, if any. Test support.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` with its code.
    ///
    /// # Safety
    ///
    /// As [`CudaDriver::launch_test_kernel_on`].
    #[doc(hidden)]
    pub unsafe fn launch_test_kernel(
        &self,
        kernel: &TestKernel,
        grid: u32,
        block: u32,
        params: &[u64],
    ) -> Result<(), TransferError> {
        // SAFETY: the caller's promise, as documented.
        unsafe { self.launch_test_kernel_on(kernel, grid, block, params, Stream::LEGACY) }
    }

    /// Launches `kernel` as [`CudaDriver::launch_test_kernel`] does, on `stream` (a
    /// stream of this device, or a special handle: 0 is the legacy default stream).
    /// On a stream being captured, the launch becomes a kernel node of the graph
    /// instead of running. Test support.
    ///
    /// # Errors
    ///
    /// `cuLaunchKernel` with its code (`CUDA_ERROR_INVALID_HANDLE` for a stream of
    /// another context).
    ///
    /// # Safety
    ///
    /// `params` matches `kernel`'s parameter list exactly: one entry per parameter,
    /// each parameter 64 bits wide. The driver cannot check this: it reads as many
    /// parameter pointers as the kernel has parameters, so a short list makes it read
    /// past the end of the array. Every address the kernel reads or writes through its
    /// parameters is device memory the caller owns for that use (not host memory that
    /// Rust code references, under unified addressing), and stays mapped and
    /// untouched by anything else until the kernel has completed (a later
    /// synchronize of `stream` or of the device). `stream` is a live stream of this
    /// device or a special handle (a destroyed stream's handle may name freed driver
    /// memory).
    #[doc(hidden)]
    pub unsafe fn launch_test_kernel_on(
        &self,
        kernel: &TestKernel,
        grid: u32,
        block: u32,
        params: &[u64],
        stream: Stream,
    ) -> Result<(), TransferError> {
        let mut values: Vec<u64> = params.to_vec();
        let mut args: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| ptr::from_mut(v).cast::<c_void>())
            .collect();
        let function = kernel.function;
        let stream = cu_stream(stream);
        self.transfer("cuLaunchKernel", || {
            // SAFETY: `function` came from `load_test_kernel` on this context and its
            // module is still loaded (`TestKernel` is consumed by the unload); `args`
            // holds one pointer per kernel parameter (the caller guarantees the count
            // and widths match the kernel's), each to a live `u64` in `values`, and
            // both outlive the call (the driver copies the parameter values at
            // launch); the caller guarantees the memory the kernel touches and that
            // `stream` is live.
            code(unsafe {
                sys::cuLaunchKernel(
                    function,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    args.as_mut_ptr(),
                    ptr::null_mut(),
                )
            })
        })
    }

    /// Unloads a module loaded by [`CudaDriver::load_test_kernel`] (`cuModuleUnload`).
    /// Test support.
    ///
    /// # Errors
    ///
    /// `cuModuleUnload` with its code.
    #[doc(hidden)]
    pub fn unload_test_kernel(&self, kernel: TestKernel) -> Result<(), TransferError> {
        self.transfer("cuModuleUnload", || {
            // SAFETY: `kernel.module` was loaded by `load_test_kernel` on this
            // context and is unloaded once (`TestKernel` is consumed here).
            code(unsafe { sys::cuModuleUnload(kernel.module) })
        })
    }
}
