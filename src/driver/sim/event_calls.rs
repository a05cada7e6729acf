//! The event calls of the simulated driver (`cuEventCreate`, record, query,
//! synchronize, destroy), each a row of docs/vmm-semantics.md.

use super::model::Inner;
use super::stream_calls::status;
use super::streams::{EventRec, Recorded};
use super::{SimDriver, SimStreamCall, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_READY};
use crate::driver::CuResult;
use crate::sync::lock;

impl Inner {
    fn event_destroy_locked(&mut self, event: u64) -> Result<(), CuResult> {
        self.begin_stream_call(SimStreamCall::EventDestroy)?;
        match self.streams.events.remove(&event) {
            Some(_) => Ok(()),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    fn event_record_locked(&mut self, event: u64, stream: u64) -> Result<(), CuResult> {
        self.begin_stream_call(SimStreamCall::EventRecord)?;
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if !self.streams.events.contains_key(&event) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let recorded = match self.captured(key)? {
            Some(capture) => Recorded::Captured { capture },
            None => {
                if let Some(code) = self.implicit_conflict(key, "cuEventRecord") {
                    return Err(code);
                }
                let legacy = self.streams.streams.get(&key).is_some_and(|s| s.legacy);
                Recorded::Work {
                    frontier: self.streams.commit_frontier(key),
                    legacy,
                }
            }
        };
        if let Some(e) = self.streams.events.get_mut(&event) {
            e.recorded = recorded;
        }
        Ok(())
    }
}

impl SimDriver {
    // ------------------------------------------------------------ events

    /// `cuEventCreate`: an event, never recorded (a query or synchronize of it returns
    /// `CUDA_SUCCESS` at once, as NVIDIA documents). Returns its handle (never 0, never
    /// reused, never a stream's). Counts as [`SimStreamCall::EventCreate`]; fails only
    /// when injected.
    pub fn event_create(&self) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        st.begin_stream_call(SimStreamCall::EventCreate)?;
        let e = st.streams.next_event;
        st.streams.next_event += 1;
        st.streams.events.insert(
            e,
            EventRec {
                recorded: Recorded::Never,
            },
        );
        Ok(e)
    }

    /// `cuEventDestroy`: the handle is refused from now on; the work it covered runs
    /// on. Counts as [`SimStreamCall::EventDestroy`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live event.
    pub fn event_destroy(&self, event: u64) -> CuResult {
        status(lock(&self.inner).event_destroy_locked(event))
    }

    /// `cuEventRecord`: `event` now covers the work queued on `stream` so far, and all
    /// that work was ordered after (on the legacy stream, the earlier work of every
    /// blocking stream of its device; on a blocking stream, the legacy stream's). Row
    /// "event record": legal in every mode, on any thread, and breaks no capture. On a
    /// stream being captured the record is a graph node: querying or synchronizing the
    /// event while that capture is open breaks it. Counts as
    /// [`SimStreamCall::EventRecord`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live event or
    /// stream; `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` on a stream whose capture is
    /// invalidated; [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`] on the legacy stream while a
    /// blocking stream of its device is captured (the record would depend on it; that
    /// capture is invalidated and a [`SimFault::CaptureBroken`] recorded).
    ///
    /// [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`]: super::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    /// [`SimFault::CaptureBroken`]: super::SimFault::CaptureBroken
    pub fn event_record(&self, event: u64, stream: u64) -> CuResult {
        status(lock(&self.inner).event_record_locked(event, stream))
    }

    /// `cuEventQuery`: `CUDA_SUCCESS` when the work `event` covers has completed (or it
    /// was never recorded), [`CUDA_ERROR_NOT_READY`] when not. Row "event query
    /// (recorded before or during the capture)": during a capture in global mode it
    /// breaks from any thread; in thread-local mode from the capturing thread only
    /// (another thread gets NOT_READY); in relaxed mode, or with the caller switched to
    /// relaxed first ([`SimDriver::thread_exchange_capture_mode`]), it is legal and the
    /// capture stays valid. Counts as [`SimStreamCall::EventQuery`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live event;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, invalidating the captures in the way
    /// (a [`SimFault::CaptureBroken`] for a stream capture), where the row says
    /// "breaks"; also, whatever the modes, for an event recorded on the legacy stream
    /// while any capture is open (section "Stream capture") and for an event recorded
    /// inside a capture still open (NVIDIA: a call that necessarily conflicts with the
    /// capture).
    ///
    /// [`SimFault::CaptureBroken`]: super::SimFault::CaptureBroken
    pub fn event_query(&self, event: u64) -> CuResult {
        let mut st = lock(&self.inner);
        match st.event_gate(event, SimStreamCall::EventQuery) {
            Err(code) => code,
            Ok(Some(f)) if !st.streams.is_complete(&f) => CUDA_ERROR_NOT_READY,
            Ok(_) => CuResult::SUCCESS,
        }
    }

    /// `cuEventSynchronize`: waits for the work `event` covers, which completes it
    /// (and all it was ordered after) and nothing queued later; an event never recorded
    /// returns at once. Row "event synchronize": the columns of
    /// [`SimDriver::event_query`] (global mode: breaks from any thread; thread-local:
    /// from the capturing thread; relaxed or caller switched to relaxed: legal). Counts
    /// as [`SimStreamCall::EventSynchronize`].
    ///
    /// Errors: as [`SimDriver::event_query`]; a refused synchronize completes nothing.
    pub fn event_synchronize(&self, event: u64) -> CuResult {
        let mut st = lock(&self.inner);
        match st.event_gate(event, SimStreamCall::EventSynchronize) {
            Err(code) => code,
            Ok(f) => {
                if let Some(f) = f {
                    st.streams.complete(&f);
                }
                CuResult::SUCCESS
            }
        }
    }
}
