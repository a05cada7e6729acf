//! Segment mode's allocation front: a request's block size, a block for the
//! synchronous and the stream-ordered API, and a heap's miss.

use super::{heap_key, home_of, round_up};
use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{State, SYNC_FREED};
use crate::pool::config::SEGMENT_BLOCK_ROUND_BYTES;
use crate::pool::Pool;
use crate::sync::lock;

impl Pool {
    /// The block size of a request of `bytes` in segment mode (rounded up to
    /// [`SEGMENT_BLOCK_ROUND_BYTES`]), or `None` when it takes a whole mapping (not
    /// segment mode, or above the whole-mapping threshold).
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes.
    pub(in crate::pool) fn block_size(&self, bytes: u64) -> Result<Option<u64>> {
        if !self.segments || bytes > self.whole_threshold {
            return Ok(None);
        }
        if bytes == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        // Cannot overflow: `bytes` is at most the threshold, and a threshold near
        // `u64::MAX` rounds within range or is refused below.
        match round_up(bytes, SEGMENT_BLOCK_ROUND_BYTES) {
            Some(size) if round_up(size, self.granularity).is_some() => Ok(Some(size)),
            _ => Err(Error::InvalidArgument(format!(
                "allocation of {bytes} bytes overflows when rounded to the granularity"
            ))),
        }
    }

    /// A block of `size` bytes for the synchronous `allocate` (`bytes` asked).
    pub(in crate::pool) fn allocate_block_sync(&self, size: u64, bytes: u64) -> Result<DevicePtr> {
        let key = heap_key(SYNC_FREED, size);
        // While thread caches hold blocks, the heap's free end is carved only after
        // this thread's cache went back to the heap (its blocks may coalesce into a
        // fit below the end).
        let spare_tail = self.caches.may_hold();
        {
            let mut st = lock(&self.state);
            match st.carve_unless_tail(key, size, bytes, true, spare_tail) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {
                    // Blocks of stream heaps freed with the synchronous `free`.
                    if let Some(p) = self.take_for(&mut st, None, size, bytes, self.max_fit(size)) {
                        return Ok(p);
                    }
                }
                Err(()) => {}
            }
        }
        let retake = |st: &mut State| {
            st.carve(key, size, bytes, true)
                .or_else(|| self.take_for(st, None, size, bytes, self.max_fit(size)))
        };
        if let Some(p) = self.refill_from_caches(&self.want(bytes, Some(size))?, retake) {
            return Ok(p);
        }
        if spare_tail {
            if let Some(p) = retake(&mut lock(&self.state)) {
                return Ok(p);
            }
        }
        self.block_miss(key, size, bytes, None)
    }

    /// A block of `size` bytes on `stream` (`bytes` asked): its heap, then (after a
    /// capture query) blocks freed in its capture or on it, then a growth.
    pub(in crate::pool) fn allocate_block_async(
        &self,
        stream: Stream,
        size: u64,
        bytes: u64,
    ) -> Result<DevicePtr> {
        let key = {
            let mut st = lock(&self.state);
            let own = st.stream_bucket(stream);
            let key = heap_key(own, size);
            if let Some(p) = st.carve(key, size, bytes, true) {
                return Ok(p);
            }
            key
        };
        let capture = self
            .driver
            .stream_capture(stream)
            .map_err(|source| Error::Driver { source, bytes: 0 })?;
        {
            let mut st = lock(&self.state);
            if let Some(p) =
                self.take_for_stream(&mut st, stream, capture, size, bytes, self.max_fit(size))
            {
                return Ok(p);
            }
        }
        self.block_miss(key, size, bytes, Some((stream, capture)))
    }

    /// A block that no free block of heap `key` fits: grow the heap; on
    /// out-of-memory, a forced reuse of an idle block, then (outside a scope) a
    /// release of what is free and one retry.
    #[cold]
    fn block_miss(
        &self,
        key: u32,
        size: u64,
        bytes: u64,
        on: Option<(Stream, Option<u64>)>,
    ) -> Result<DevicePtr> {
        let rounded = round_up(size, self.granularity).unwrap_or(u64::MAX);
        self.release_other_homes(home_of(key), rounded);
        self.miss(
            rounded,
            size,
            bytes,
            on,
            || match self.grow_and_carve(key, size, bytes) {
                // Blocks idle in thread caches go back to their heaps, where they
                // coalesce with their free neighbours and may serve the request:
                // the forced reuse that follows takes no block from a heap, so
                // inside a scope the request would fail with the memory free.
                Err(e) if e.is_out_of_memory() && self.caches.enabled => {
                    self.caches.settle(&self.state);
                    lock(&self.state).carve(key, size, bytes, true).ok_or(e)
                }
                r => r,
            },
            |st| st.carve(key, size, bytes, true),
        )
    }
}
