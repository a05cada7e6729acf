//! A stream's end for PyTorch (issue 34, item 6): [`TorchAllocator::forget_stream`],
//! what `flare_package.forget_stream` calls before a user destroys a stream that
//! PyTorch only wrapped (`torch.cuda.ExternalStream`).
//!
//! PyTorch offers no hook for it: `CUDAPluggableAllocator` takes an allocation, a
//! free, `record_stream`, init, reset (`empty_cache`), memory fraction, base
//! allocation and the graph-pool functions, and nothing about streams' ends (as of
//! PyTorch 2.11). None is needed for PyTorch's own streams: `torch.cuda.Stream()` and
//! the current and side streams come from c10's per-device stream pools
//! (`getStreamFromPool`), created once per process and never destroyed, so a handle
//! PyTorch hands out always names the same CUDA stream, whose stream order the pools
//! may keep relying on. A stream made outside PyTorch (`cudaStreamCreate` in an
//! extension, `torch.cuda.ExternalStream(ptr)`) is the caller's to destroy, and the
//! driver may hand its handle value to the next stream created: the caller tells the
//! pools first.

use super::TorchAllocator;
use crate::driver::Stream;
use crate::error::Result;

impl TorchAllocator {
    /// [`Pool::forget_stream`](crate::Pool::forget_stream) on every pool of every
    /// device created so far (tensor, mempool and graph pools; a pool that never saw
    /// `stream` does nothing): call it before destroying a stream that was not
    /// PyTorch's own (see the module's documentation). PyTorch's allocator calls do
    /// not name a device for a stream, so every device is asked, as for
    /// `record_stream`.
    ///
    /// Errors: [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a default
    /// stream (0, 1, 2: never destroyed); [`Error::StreamState`](crate::Error::StreamState)
    /// while `stream` is being captured, returned by the first pool that knows it,
    /// before it changed anything (the pools before it did not know the stream).
    pub fn forget_stream(&self, stream: Stream) -> Result<()> {
        crate::pool::check_forgettable(stream)?;
        for d in self.created() {
            d.tensor.forget_stream(stream)?;
            d.mempool.forget_stream(stream)?;
            let g = d.graphs();
            for gp in g.pools.values() {
                gp.pool.forget_stream(stream)?;
            }
        }
        Ok(())
    }
}
