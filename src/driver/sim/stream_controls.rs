//! The controls a test uses to stand in for the device on streams (launching work,
//! finishing it), to tell the driver that memory changes streams, and to count and
//! inject stream calls (the controls themselves are not counted).

use super::model::Inner;
use super::stream_calls::status;
use super::streams::{Clock, FIRST_STREAM};
use super::{SimDriver, SimFault, SimStreamCall, SimWork, CUDA_ERROR_INVALID_HANDLE};
use crate::driver::{CuResult, DevicePtr};
use crate::sync::lock;

impl Inner {
    /// [`SimDriver::launch`] under the lock, for the driver function `call` (the name
    /// a broken capture's fault gives): `Ok(true)` when queued, `Ok(false)` when
    /// recorded into the stream's capture (nothing runs now).
    pub(super) fn launch_locked(
        &mut self,
        call: &'static str,
        stream: u64,
        ptr: DevicePtr,
        bytes: u64,
    ) -> Result<bool, CuResult> {
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let device = self
            .streams
            .streams
            .get(&key)
            .map(|s| s.device)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !self.accessible(ptr, bytes, device) {
            return Err(CuResult::INVALID_VALUE);
        }
        if let Some(id) = self.captured(key)? {
            if let Some(c) = self.streams.captures.get_mut(&id) {
                c.launches += 1;
            }
            return Ok(false);
        }
        if let Some(code) = self.implicit_conflict(key, call) {
            return Err(code);
        }
        self.streams.queue(key, ptr, bytes);
        Ok(true)
    }
}

impl SimDriver {
    // ------------------------------------------------------------ controls

    /// Models a kernel launched on `stream` (`cuLaunchKernel`) that reads and writes
    /// `[ptr, ptr + bytes)` until it completes: [`SimDriver::stream_complete`] (the
    /// device finishing the stream's work so far), or a synchronize that covers it
    /// ([`SimDriver::ctx_synchronize`] of the stream's device,
    /// [`SimDriver::stream_synchronize`], [`SimDriver::event_synchronize`] of an event
    /// recorded after it), or the completion of later work ordered after it. It runs
    /// on the stream's device, after every earlier operation of the stream (and, on
    /// the legacy stream, of every blocking stream of the device; on a blocking stream,
    /// of the legacy stream). While it is queued, unmapping any of its bytes is a
    /// [`SimFault::UnmapWhileQueued`] (section "In-flight work: unmap does not wait"),
    /// and handing them to another stream not ordered after it a
    /// [`SimFault::HandoffWhileQueued`]. On a stream being captured the launch is a
    /// graph node: nothing is queued. A `bytes` of 0 touches nothing but is still work
    /// in the stream's order. A test control, not counted.
    ///
    /// Errors (nothing queued): [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not
    /// a live stream; `CUDA_ERROR_INVALID_VALUE` when a byte of the range is not mapped
    /// with access granted to the stream's device (the real launch would succeed and
    /// the kernel fault: row "any access before cuMemSetAccess on a new mapping");
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` on a stream whose capture is
    /// invalidated; [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`] on the legacy stream while a
    /// blocking stream of its device is captured (that capture is invalidated and a
    /// [`SimFault::CaptureBroken`] recorded).
    ///
    /// [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`]: super::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    pub fn launch(&self, stream: u64, ptr: DevicePtr, bytes: u64) -> CuResult {
        status(
            lock(&self.inner)
                .launch_locked("cuLaunchKernel", stream, ptr, bytes)
                .map(|_| ()),
        )
    }

    /// The device finishes all the work queued on `stream` so far, and with it all that
    /// work was ordered after (events it waited on; on the legacy stream, earlier work
    /// of blocking streams). The test's stand-in for time passing on the GPU: no
    /// capture rule applies, nothing is counted. A handle that names no live stream
    /// but did (destroyed) completes the work of every destroyed stream that had it
    /// (its work still runs); while a live stream has the handle (reused), only that
    /// stream's work: complete a destroyed one's with [`SimDriver::ctx_synchronize`]
    /// or an event recorded on it before its destroy.
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that was never a stream.
    pub fn stream_complete(&self, stream: u64) -> CuResult {
        let mut st = lock(&self.inner);
        let keys = match st.streams.resolve(stream) {
            Some(k) => vec![k],
            None if (FIRST_STREAM..st.streams.next_stream).contains(&stream) => {
                // Destroyed: its records, if their work is not finished yet.
                st.streams.destroyed_with_handle(stream)
            }
            None => return CUDA_ERROR_INVALID_HANDLE,
        };
        let clocks: Vec<Clock> = keys
            .iter()
            .filter_map(|k| st.streams.streams.get(k).map(|s| s.clock.clone()))
            .collect();
        for f in &clocks {
            st.streams.complete(f);
        }
        CuResult::SUCCESS
    }

    /// Tells the driver that `[ptr, ptr + bytes)` is handed to `stream`: work queued
    /// on `stream` from now on may touch it (a pool's stream-ordered allocation). If
    /// work queued on another stream still touches it and is not ordered before
    /// `stream`'s next operation (not completed; not covered by an event `stream`
    /// waited on; not implied by the legacy-stream ordering), the two could run at once
    /// on the same bytes: a [`SimFault::HandoffWhileQueued`] is recorded (one per
    /// call). Work of `stream` itself is always ordered. Busy marks
    /// ([`SimDriver::mark_busy_on`]) have no stream and are not checked. Not counted.
    ///
    /// Returns `CUDA_SUCCESS` (fault or not), or [`CUDA_ERROR_INVALID_HANDLE`] for a
    /// handle that is not a live stream.
    pub fn note_handoff(&self, stream: u64, ptr: DevicePtr, bytes: u64) -> CuResult {
        let mut st = lock(&self.inner);
        let Some(key) = st.streams.resolve(stream) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        if let Some(other) = st.streams.unordered_over(key, ptr, bytes) {
            let stream = st.streams.handle_of(key);
            st.faults.push(SimFault::HandoffWhileQueued {
                stream,
                ptr,
                size: bytes,
                other,
            });
        }
        CuResult::SUCCESS
    }

    /// Contract faults recorded so far: unmapping memory that queued work or a busy
    /// mark still touches ([`SimFault::UnmapWhileQueued`],
    /// [`SimFault::UnmapWhileBusy`]); handing memory to a stream while another
    /// stream's unordered queued work still touches it
    /// ([`SimFault::HandoffWhileQueued`]); a call that broke an open stream capture
    /// ([`SimFault::CaptureBroken`]). Always `faults().len()`. A correct pool keeps it
    /// at 0.
    pub fn contract_faults(&self) -> u64 {
        lock(&self.inner).faults.len() as u64
    }

    /// Every launch still queued (not completed), in stream creation (legacy streams
    /// last) then launch order; a destroyed stream's work under its old handle.
    pub fn queued_work(&self) -> Vec<SimWork> {
        lock(&self.inner).streams.work()
    }

    /// How many calls of kind `call` were made so far, failed ones included.
    pub fn stream_call_count(&self, call: SimStreamCall) -> u64 {
        lock(&self.inner)
            .streams
            .calls
            .get(call as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Makes the `nth` future call of kind `call` fail with `code` (`nth` = 1: the
    /// next one; 0 is taken as 1), changing nothing else; the same queueing as
    /// [`SimDriver::inject_failure`]. [`SimStreamCall::ThreadExchangeCaptureMode`]
    /// never fails: an injection for it is ignored.
    pub fn inject_stream_failure(&self, call: SimStreamCall, nth: u32, code: CuResult) {
        if call == SimStreamCall::ThreadExchangeCaptureMode {
            return;
        }
        let mut st = lock(&self.inner);
        let done = st.streams.calls.get(call as usize).copied().unwrap_or(0);
        let mut at = done + u64::from(nth.max(1));
        while st
            .streams
            .injections
            .iter()
            .any(|&(c, a, _)| c == call && a == at)
        {
            at += 1;
        }
        st.streams.injections.push((call, at, code));
    }
}
