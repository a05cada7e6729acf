//! Test and benchmark support for the CUDA backend, compiled only with the `testing`
//! feature (the project's own tests, the GPU comparison benchmark in `tools/`):
//! memsets and copies, raw mappings, hand-written PTX kernels to keep work in
//! flight, non-blocking streams, and stream capture into graphs that are replayed.
//! None of it is used by the pool, and none of it is part of the library's API for
//! engines.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use cudarc::driver::sys;

use super::context::Stage;
use super::conversions::{code, cu_capture_mode, cu_stream, to_usize};
use super::CudaDriver;
use crate::driver::{CaptureMode, CuResult, DevicePtr, DriverCall, DriverError, Stream};

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

/// A failed memset or copy ([`CudaDriver::memset_d8`], [`CudaDriver::copy_dtoh`],
/// [`CudaDriver::copy_htod`]): these are not pool operations, so they have no
/// [`DriverCall`]; the error names the driver function instead, with its raw
/// `CUresult`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{function} failed with {code}")]
pub struct TransferError {
    /// The driver function that failed (`"cuMemsetD8_v2"`); `"cuCtxPushCurrent_v2"`
    /// when the pool's context could not be made current.
    pub function: &'static str,
    /// The raw `CUresult` it returned.
    pub code: CuResult,
}

/// A kernel loaded from PTX by [`CudaDriver::load_test_kernel`]: test support only.
/// Unload it with [`CudaDriver::unload_test_kernel`] (dropping it leaks the module
/// until the context goes).
#[doc(hidden)]
#[derive(Debug)]
pub struct TestKernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
}

/// A graph captured from a stream by [`CudaDriver::stream_end_capture`]: test
/// support only. Destroy it with [`CudaDriver::graph_destroy`] (dropping it leaks it
/// until the context goes).
#[doc(hidden)]
#[derive(Debug)]
pub struct TestGraph {
    graph: sys::CUgraph,
}

/// A graph instantiated by [`CudaDriver::graph_instantiate`], ready to launch:
/// test support only. Destroy it with [`CudaDriver::graph_exec_destroy`].
#[doc(hidden)]
#[derive(Debug)]
pub struct TestGraphExec {
    exec: sys::CUgraphExec,
}

impl CudaDriver {
    /// The device's primary context, retained by this driver until it is dropped:
    /// for the baselines of `cuda_baseline`, which make it current themselves.
    pub fn raw_context(&self) -> sys::CUcontext {
        self.context
    }

    /// Runs `f` (one driver call, returning its raw `CUresult`) with this driver's
    /// context pushed, as every driver call does, for a memset or copy: the error
    /// names `function`, or the context push or pop when that is what failed.
    pub fn transfer(
        &self,
        function: &'static str,
        f: impl FnOnce() -> CuResult,
    ) -> Result<(), TransferError> {
        self.with_context(f).map_err(|(stage, code)| {
            let function = match stage {
                Stage::Push => "cuCtxPushCurrent_v2",
                Stage::Call => function,
                Stage::Pop => "cuCtxPopCurrent_v2",
            };
            TransferError { function, code }
        })
    }

    /// `cuMemAlloc_v2(bytes)`: plain device memory outside any pool, for tests that
    /// take the memory a sleeping tag gave back (issue 15). Free it with
    /// [`CudaDriver::plain_free`].
    ///
    /// # Errors
    ///
    /// `cuMemAlloc_v2` with its code (`CUDA_ERROR_OUT_OF_MEMORY` when the device is
    /// full).
    pub fn plain_alloc(&self, bytes: u64) -> Result<DevicePtr, TransferError> {
        let n = to_usize(bytes).map_err(|code| TransferError {
            function: "cuMemAlloc_v2",
            code,
        })?;
        let mut dptr: sys::CUdeviceptr = 0;
        self.transfer("cuMemAlloc_v2", || {
            // SAFETY: `dptr` is a valid out-pointer for the duration of the call.
            code(unsafe { sys::cuMemAlloc_v2(&mut dptr, n) })
        })?;
        Ok(dptr)
    }

    /// `cuMemFree_v2(ptr)` of memory from [`CudaDriver::plain_alloc`].
    ///
    /// # Errors
    ///
    /// `cuMemFree_v2` with its code (`CUDA_ERROR_INVALID_VALUE` for a pointer
    /// `cuMemAlloc_v2` did not return).
    pub fn plain_free(&self, ptr: DevicePtr) -> Result<(), TransferError> {
        self.transfer("cuMemFree_v2", || {
            // SAFETY: the driver validates the pointer; no host memory is involved.
            code(unsafe { sys::cuMemFree_v2(ptr) })
        })
    }

    /// Sets `bytes` bytes from device address `ptr` to `value` (`cuMemsetD8_v2` on the
    /// legacy default stream; asynchronous with respect to the host, ordered before a
    /// later [`CudaDriver::copy_dtoh`] or [`Driver::synchronize`](crate::driver::Driver::synchronize)). For tests and
    /// benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemsetD8_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the range
    /// is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + bytes)` is device memory the caller may overwrite (a mapping it
    /// owns, with access granted to this device), and nothing else reads or writes it
    /// until the memset has completed (a later synchronize or synchronous copy; the
    /// memset is asynchronous). The driver checks only that the range is accessible
    /// to the device, and under unified addressing a device address can name host
    /// memory (pinned or managed memory, or any pageable page where the system has
    /// HMM): the driver would then write memory that Rust code may hold references to.
    pub unsafe fn memset_d8(
        &self,
        ptr: DevicePtr,
        value: u8,
        bytes: u64,
    ) -> Result<(), TransferError> {
        let n = to_usize(bytes).map_err(|c| TransferError {
            function: "cuMemsetD8_v2",
            code: c,
        })?;
        self.transfer("cuMemsetD8_v2", || {
            // SAFETY: the caller guarantees `[ptr, ptr + n)` is device memory it may
            // overwrite, untouched by anything else until the memset completes.
            code(unsafe { sys::cuMemsetD8_v2(ptr, value, n) })
        })
    }

    /// Copies `dst.len()` bytes from device address `ptr` into `dst`
    /// (`cuMemcpyDtoH_v2`; synchronous: waits for earlier work on the legacy default
    /// stream). For tests and benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemcpyDtoH_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// source range is not mapped with access granted.
    pub fn copy_dtoh(&self, ptr: DevicePtr, dst: &mut [u8]) -> Result<(), TransferError> {
        let n = dst.len();
        let host = dst.as_mut_ptr().cast::<c_void>();
        self.transfer("cuMemcpyDtoH_v2", || {
            // SAFETY: `host` points to `n` writable bytes borrowed mutably for the
            // duration of this call; the copy is synchronous, so the driver does not
            // touch them after it returns.
            code(unsafe { sys::cuMemcpyDtoH_v2(host, ptr, n) })
        })
    }

    /// Copies `src` to device address `ptr` (`cuMemcpyHtoD_v2`; returns once `src` may
    /// be reused). For tests and benchmarks, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemcpyHtoD_v2` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// destination range is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + src.len())` is device memory the caller may overwrite (a mapping
    /// it owns, with access granted to this device), not read or written by other
    /// work during the copy. As for [`CudaDriver::memset_d8`], the driver cannot tell
    /// a device address that names host memory (unified addressing) from device
    /// memory, and would write it.
    pub unsafe fn copy_htod(&self, ptr: DevicePtr, src: &[u8]) -> Result<(), TransferError> {
        let n = src.len();
        let host = src.as_ptr().cast::<c_void>();
        self.transfer("cuMemcpyHtoD_v2", || {
            // SAFETY: `host` points to `n` readable bytes borrowed for the duration
            // of this call; a pageable host-to-device copy has consumed them when it
            // returns. The caller guarantees the destination is device memory it may
            // overwrite.
            code(unsafe { sys::cuMemcpyHtoD_v2(ptr, host, n) })
        })
    }

    /// Raw `cuMemMap(ptr, size, offset, handle_raw, 0)`, with any size and offset.
    /// Only for the test that checks the driver refuses to map part of a handle
    /// (`CUDA_ERROR_NOT_SUPPORTED`); the pool always maps whole handles
    /// ([`Driver::map`]).
    #[doc(hidden)]
    pub fn map_range_raw(
        &self,
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        handle_raw: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::Map, c);
        let size = to_usize(size).map_err(err)?;
        let offset = to_usize(offset).map_err(err)?;
        self.in_context(DriverCall::Map, || {
            // SAFETY: the driver validates the range, offset and handle.
            code(unsafe { sys::cuMemMap(ptr, size, offset, handle_raw, 0) })
        })
    }

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

    /// Sets `bytes` bytes from device address `ptr` to `value` on `stream`
    /// (`cuMemsetD8Async`): ordered with the stream's other work and asynchronous with
    /// respect to the host; on a stream being captured it becomes a memset node of
    /// the graph. For tests, not used by the pool.
    ///
    /// # Errors
    ///
    /// `cuMemsetD8Async` with the driver's code: `CUDA_ERROR_INVALID_VALUE` when the
    /// range is not mapped with access granted.
    ///
    /// # Safety
    ///
    /// As [`CudaDriver::memset_d8`], with "until the memset has completed" meaning
    /// until `stream`'s work up to it has completed; `stream` is a live stream of
    /// this device or a special handle.
    pub unsafe fn memset_d8_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        bytes: u64,
        stream: Stream,
    ) -> Result<(), TransferError> {
        let n = to_usize(bytes).map_err(|c| TransferError {
            function: "cuMemsetD8Async",
            code: c,
        })?;
        let s = cu_stream(stream);
        self.transfer("cuMemsetD8Async", || {
            // SAFETY: the caller guarantees `[ptr, ptr + n)` is device memory it may
            // overwrite, untouched by anything else until the memset completes, and
            // that `s` is a live stream of this device.
            code(unsafe { sys::cuMemsetD8Async(ptr, value, n, s) })
        })
    }

    /// Creates a non-blocking stream (`cuStreamCreate`, `CU_STREAM_NON_BLOCKING`) in
    /// this device's primary context: its work is not ordered with the legacy
    /// stream's (what PyTorch's side streams and capture streams are). Destroy it with
    /// [`Driver::stream_destroy`](crate::driver::Driver::stream_destroy). Test
    /// support.
    ///
    /// # Errors
    ///
    /// `cuStreamCreate` with its code.
    #[doc(hidden)]
    pub fn stream_create_non_blocking(&self) -> Result<Stream, TransferError> {
        let mut stream: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        self.transfer("cuStreamCreate", || {
            // SAFETY: `stream` is a valid out-pointer; the context is current.
            code(unsafe { sys::cuStreamCreate(&mut stream, flags) })
        })?;
        Ok(Stream(stream as usize as u64))
    }

    /// Waits for the work queued on `stream` (`cuStreamSynchronize`), and returns its
    /// fault, if any. Not a device-wide synchronize: work on other streams goes on.
    /// Test support.
    ///
    /// # Errors
    ///
    /// `cuStreamSynchronize` with its code (a sticky fault of the stream's work;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` in global mode while a capture is
    /// open, which invalidates it).
    #[doc(hidden)]
    pub fn stream_synchronize(&self, stream: Stream) -> Result<(), TransferError> {
        let s = cu_stream(stream);
        self.transfer("cuStreamSynchronize", || {
            // SAFETY: `s` is a stream of this device or a special handle (the caller
            // passes only those); the context is current for the special ones.
            code(unsafe { sys::cuStreamSynchronize(s) })
        })
    }

    /// Whether every piece of work queued on `stream` has completed (`cuStreamQuery`:
    /// `CUDA_SUCCESS` is `true`, `CUDA_ERROR_NOT_READY` is `false`). Test support.
    ///
    /// # Errors
    ///
    /// `cuStreamQuery` with any other code (a sticky fault;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` in global mode during a capture).
    #[doc(hidden)]
    pub fn stream_query(&self, stream: Stream) -> Result<bool, TransferError> {
        let s = cu_stream(stream);
        let mut answer = CuResult::SUCCESS;
        self.transfer("cuStreamQuery", || {
            // SAFETY: `s` is a stream of this device or a special handle (the caller
            // passes only those).
            answer = code(unsafe { sys::cuStreamQuery(s) });
            if answer == CuResult(sys::CUresult::CUDA_ERROR_NOT_READY as u32) {
                CuResult::SUCCESS
            } else {
                answer
            }
        })?;
        Ok(answer.is_success())
    }

    /// Begins capturing `stream` into a graph in `mode` (`cuStreamBeginCapture_v2`):
    /// work queued on it from now on is recorded, not run, until
    /// [`CudaDriver::stream_end_capture`]. PyTorch captures in global mode on a
    /// non-blocking stream. Test support.
    ///
    /// # Errors
    ///
    /// `cuStreamBeginCapture_v2` with its code (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
    /// for the legacy stream, `CUDA_ERROR_ILLEGAL_STATE` for a stream already being
    /// captured).
    #[doc(hidden)]
    pub fn stream_begin_capture(
        &self,
        stream: Stream,
        mode: CaptureMode,
    ) -> Result<(), TransferError> {
        let s = cu_stream(stream);
        let mode = cu_capture_mode(mode);
        self.transfer("cuStreamBeginCapture_v2", || {
            // SAFETY: `s` is a live stream of this device (the caller's use); `mode`
            // is a defined `CUstreamCaptureMode`.
            code(unsafe { sys::cuStreamBeginCapture_v2(s, mode) })
        })
    }

    /// Ends the capture of `stream` (`cuStreamEndCapture`) and returns the captured
    /// graph. Test support.
    ///
    /// # Errors
    ///
    /// `cuStreamEndCapture` with its code: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`
    /// when something broke the capture (a synchronize, an event query in global
    /// mode, ...: `docs/vmm-semantics.md`), in which case the driver returns no graph;
    /// `CUDA_ERROR_ILLEGAL_STATE` when `stream` is not being captured.
    #[doc(hidden)]
    pub fn stream_end_capture(&self, stream: Stream) -> Result<TestGraph, TransferError> {
        let s = cu_stream(stream);
        let mut graph: sys::CUgraph = ptr::null_mut();
        self.transfer("cuStreamEndCapture", || {
            // SAFETY: `graph` is a valid out-pointer; `s` is a live stream of this
            // device.
            code(unsafe { sys::cuStreamEndCapture(s, &mut graph) })
        })?;
        if graph.is_null() {
            return Err(TransferError {
                function: "cuStreamEndCapture",
                code: CuResult::STREAM_CAPTURE_INVALIDATED,
            });
        }
        Ok(TestGraph { graph })
    }

    /// Instantiates `graph` for launching (`cuGraphInstantiateWithFlags`, flags 0).
    /// The graph itself stays valid and is destroyed separately. Test support.
    ///
    /// # Errors
    ///
    /// `cuGraphInstantiateWithFlags` with its code.
    #[doc(hidden)]
    pub fn graph_instantiate(&self, graph: &TestGraph) -> Result<TestGraphExec, TransferError> {
        let g = graph.graph;
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        self.transfer("cuGraphInstantiateWithFlags", || {
            // SAFETY: `exec` is a valid out-pointer; `g` came from
            // `stream_end_capture` and is not destroyed (`TestGraph` is consumed by
            // `graph_destroy`).
            code(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) })
        })?;
        Ok(TestGraphExec { exec })
    }

    /// Launches (replays) an instantiated graph on `stream` (`cuGraphLaunch`):
    /// asynchronous, ordered with the stream's other work. Test support.
    ///
    /// # Errors
    ///
    /// `cuGraphLaunch` with its code.
    ///
    /// # Safety
    ///
    /// Every address the graph's nodes read or write (the kernels' parameters and
    /// memsets as captured) is still device memory the caller owns for that use, and
    /// stays mapped and untouched by anything else until the replay has completed,
    /// as for [`CudaDriver::launch_test_kernel_on`]; `stream` is a live stream of this
    /// device or a special handle.
    #[doc(hidden)]
    pub unsafe fn graph_launch(
        &self,
        exec: &TestGraphExec,
        stream: Stream,
    ) -> Result<(), TransferError> {
        let (e, s) = (exec.exec, cu_stream(stream));
        self.transfer("cuGraphLaunch", || {
            // SAFETY: `e` came from `graph_instantiate` and is not destroyed
            // (`TestGraphExec` is consumed by `graph_exec_destroy`); the caller
            // guarantees the memory the graph touches and the stream.
            code(unsafe { sys::cuGraphLaunch(e, s) })
        })
    }

    /// Destroys an instantiated graph (`cuGraphExecDestroy`). Test support.
    ///
    /// # Errors
    ///
    /// `cuGraphExecDestroy` with its code.
    #[doc(hidden)]
    pub fn graph_exec_destroy(&self, exec: TestGraphExec) -> Result<(), TransferError> {
        self.transfer("cuGraphExecDestroy", || {
            // SAFETY: `exec.exec` came from `graph_instantiate` and is destroyed once
            // (`TestGraphExec` is consumed here).
            code(unsafe { sys::cuGraphExecDestroy(exec.exec) })
        })
    }

    /// Destroys a captured graph (`cuGraphDestroy`). Test support.
    ///
    /// # Errors
    ///
    /// `cuGraphDestroy` with its code.
    #[doc(hidden)]
    pub fn graph_destroy(&self, graph: TestGraph) -> Result<(), TransferError> {
        self.transfer("cuGraphDestroy", || {
            // SAFETY: `graph.graph` came from `stream_end_capture` and is destroyed
            // once (`TestGraph` is consumed here).
            code(unsafe { sys::cuGraphDestroy(graph.graph) })
        })
    }

    /// Whether the calling thread has no current CUDA context (`cuCtxGetCurrent`
    /// returns null, or fails). `true` when libcuda is absent. For the test that
    /// checks a call leaves the thread's context as it found it.
    #[doc(hidden)]
    pub fn current_context_is_null() -> bool {
        if !Self::is_available() {
            return true;
        }
        let mut current: sys::CUcontext = ptr::null_mut();
        // A panic (a symbol missing) is caught and read as "no context".
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: libcuda is present; `current` is a valid out-pointer.
            code(unsafe { sys::cuCtxGetCurrent(&mut current) })
        }));
        match r {
            Ok(c) if c.is_success() => current.is_null(),
            _ => true,
        }
    }
}

/// Every CUDA driver function a Rust source file calls: the names after `sys::` that
/// start with `cu` and an upper-case letter (`sys::culib` is cudarc's loader, not a
/// driver function), sorted, each once. For the tests that check each symbol list
/// ([`REQUIRED_SYMBOLS`](super::REQUIRED_SYMBOLS), the benchmark baseline's) covers
/// every call, so that no call can hit cudarc's panic on a missing symbol.
pub fn driver_functions_called(source: &str) -> Vec<&str> {
    let mut names: Vec<&str> = source
        .match_indices("sys::cu")
        .filter_map(|(at, _)| {
            let rest = &source[at + "sys::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            name.chars()
                .nth(2)
                .is_some_and(|c| c.is_ascii_uppercase())
                .then_some(name)
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::driver_functions_called;
    use crate::driver::cuda::{CAPTURE_INFO_SYMBOLS, REQUIRED_SYMBOLS};

    fn backend_calls() -> Vec<&'static str> {
        let mut backend = Vec::new();
        for source in [
            include_str!("mod.rs"),
            include_str!("context.rs"),
            include_str!("conversions.rs"),
            include_str!("open.rs"),
            include_str!("trait_impl.rs"),
            include_str!("testing.rs"),
        ] {
            backend.extend(driver_functions_called(source));
        }
        backend
    }

    #[test]
    fn every_driver_function_called_is_checked_at_load() {
        let backend = backend_calls();
        // The scan itself works: these calls are in these files.
        for known in [
            "cuMemCreate",
            "cuCtxSynchronize",
            "cuLaunchKernel",
            "cuEventQuery",
            "cuStreamGetCaptureInfo_v3",
        ] {
            assert!(backend.contains(&known), "scan missed {known}: {backend:?}");
        }
        for name in &backend {
            assert!(
                REQUIRED_SYMBOLS.contains(name) || CAPTURE_INFO_SYMBOLS.contains(name),
                "the CUDA backend calls {name}, which neither REQUIRED_SYMBOLS nor \
                 CAPTURE_INFO_SYMBOLS checks"
            );
        }
    }

    /// The load check demands nothing the backend does not call: a listed symbol
    /// that nothing calls would only make `CudaDriver::new` fail on a driver without
    /// it, for no use.
    #[test]
    fn every_symbol_checked_at_load_is_called() {
        let backend = backend_calls();
        for name in REQUIRED_SYMBOLS.iter().chain(&CAPTURE_INFO_SYMBOLS) {
            assert!(
                backend.contains(name),
                "{name} is checked at load, but the CUDA backend never calls it"
            );
        }
    }
}
