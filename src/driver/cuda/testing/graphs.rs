//! Stream capture into graphs, and their instantiation, launch and destruction.

use std::ptr;

use cudarc::driver::sys;

use super::TransferError;
use crate::driver::cuda::conversions::{code, cu_capture_mode, cu_stream};
use crate::driver::cuda::CudaDriver;
use crate::driver::{CaptureMode, CuResult, Stream};

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
}
