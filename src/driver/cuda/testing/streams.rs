//! Non-blocking streams: creating, synchronizing and querying one.

use std::ptr;

use cudarc::driver::sys;

use super::TransferError;
use crate::driver::cuda::conversions::{code, cu_stream};
use crate::driver::cuda::CudaDriver;
use crate::driver::{CuResult, Stream};

impl CudaDriver {
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
}
