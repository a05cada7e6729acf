//! The stream calls of the simulated driver, each a row of docs/vmm-semantics.md, and
//! the checks every wait makes; the event calls are in `event_calls.rs`, the capture
//! calls in `capture_calls.rs`, the controls in `stream_controls.rs`.
//!
//! The stream, event and capture calls of the simulated driver, CUDA-shaped (raw
//! `CUresult` answers), and the controls a test uses to stand in for the device
//! (launching work, finishing it) and to tell the driver that memory changes streams.
//!
//! Each call names the row of `docs/vmm-semantics.md` it reproduces: the sections
//! "Stream capture" and "Events and stream queries while another stream is captured".
//! What those rows do not settle follows NVIDIA's documentation of the call, and is
//! said so.
//!
//! Stream handles: [`SIM_LEGACY_STREAM`] (0; CUDA's `CU_STREAM_LEGACY`, 1, too) is the
//! legacy default stream of the calling thread's current device
//! ([`SimDriver::ctx_set_current`], default device 0); created streams have handles
//! from 2^32 up, event handles from 2^33 up. An event handle is never reused; a
//! destroyed stream's handle is handed to the next created stream (the most recently
//! destroyed first), as the CUDA driver may (a `CUstream` is the address of the
//! driver's record: RAPIDS RMM issue 2251 saw a new stream get a destroyed one's
//! value at once). The new stream shares nothing with the old one: the old one's
//! queued work runs on, ordered before nothing of the new one's, and a call naming
//! the handle reaches the new stream.

use super::model::Inner;
use super::streams::{caller, merge, Breaks, Clock, Recorded};
use super::{
    CaptureMode, SimDriver, SimStreamCall, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_NOT_READY, CUDA_ERROR_STREAM_CAPTURE_MERGE, CU_STREAM_NON_BLOCKING,
};
use crate::driver::CuResult;
use crate::sync::lock;

/// `Ok` as `CUDA_SUCCESS`, `Err(code)` as `code`.
pub(super) fn status(r: Result<(), CuResult>) -> CuResult {
    match r {
        Ok(()) => CuResult::SUCCESS,
        Err(code) => code,
    }
}
impl Inner {
    /// Counts `call`; its injected failure, if this call is the one targeted.
    pub(super) fn begin_stream_call(&mut self, call: SimStreamCall) -> Result<(), CuResult> {
        match self.streams.begin(call) {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// The checks of `cuEventQuery` / `cuEventSynchronize` before they look at the
    /// work: the event must exist; an event recorded inside a capture still open
    /// conflicts with it (any mode: NVIDIA's documentation of
    /// `cuThreadExchangeStreamCaptureMode`); an event recorded on the legacy stream
    /// breaks every open capture (section "Stream capture", even with the caller in
    /// relaxed mode); else the thread-mode rule of [`CaptureMode`] (the table of
    /// section "Events and stream queries while another stream is captured").
    /// `Ok(None)`: nothing to wait for (never recorded, or recorded in a capture that
    /// has ended); `Ok(Some(clock))`: the work it covers.
    pub(super) fn event_gate(
        &mut self,
        event: u64,
        call: SimStreamCall,
    ) -> Result<Option<Clock>, CuResult> {
        self.begin_stream_call(call)?;
        let Some(e) = self.streams.events.get(&event) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        let name = call.cuda_name();
        let unsupported = CuResult::STREAM_CAPTURE_UNSUPPORTED;
        match e.recorded.clone() {
            Recorded::Never => Ok(None),
            Recorded::Captured { capture } => {
                if self.streams.captures.contains_key(&capture) {
                    let breaks = Breaks {
                        captures: vec![capture],
                        stream_less: false,
                    };
                    Err(self.break_captures(name, &breaks, unsupported))
                } else {
                    Ok(None)
                }
            }
            Recorded::Work { frontier, legacy } => {
                let breaks = if legacy {
                    self.all_captures()
                } else {
                    self.forbidding()
                };
                if !breaks.is_empty() {
                    return Err(self.break_captures(name, &breaks, unsupported));
                }
                Ok(Some(frontier))
            }
        }
    }

    /// The checks of `cuStreamQuery` / `cuStreamSynchronize` before they look at the
    /// work: the stream must exist; a stream being captured cannot be waited on (its
    /// capture breaks, any mode); the legacy stream breaks every open capture (section
    /// "Stream capture": it synchronizes with other streams, like a device-wide
    /// synchronize); else the thread-mode rule of [`CaptureMode`]. Returns the work
    /// queued on the stream so far.
    pub(super) fn stream_gate(
        &mut self,
        stream: u64,
        call: SimStreamCall,
    ) -> Result<Clock, CuResult> {
        self.begin_stream_call(call)?;
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let (legacy, capture) = match self.streams.streams.get(&key) {
            Some(s) => (s.legacy, s.capture),
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        let breaks = match capture {
            Some(id) => Breaks {
                captures: vec![id],
                stream_less: false,
            },
            None if legacy => self.all_captures(),
            None => self.forbidding(),
        };
        if !breaks.is_empty() {
            let code = CuResult::STREAM_CAPTURE_UNSUPPORTED;
            return Err(self.break_captures(call.cuda_name(), &breaks, code));
        }
        Ok(if legacy {
            self.streams.next_frontier(key)
        } else {
            self.streams
                .streams
                .get(&key)
                .map(|s| s.clock.clone())
                .unwrap_or_default()
        })
    }

    /// For an operation queued on stream `key` during a capture of it: `Ok(Some(id))`
    /// while the capture is valid (the operation becomes a graph node),
    /// `Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)` once it is invalidated, `Ok(None)`
    /// when the stream is not being captured.
    pub(super) fn captured(&self, key: u64) -> Result<Option<u64>, CuResult> {
        let Some(id) = self.streams.streams.get(&key).and_then(|s| s.capture) else {
            return Ok(None);
        };
        match self.streams.captures.get(&id) {
            Some(c) if c.invalidated => Err(CuResult::STREAM_CAPTURE_INVALIDATED),
            Some(_) => Ok(Some(id)),
            None => Ok(None),
        }
    }

    fn stream_destroy_locked(&mut self, stream: u64) -> Result<(), CuResult> {
        self.begin_stream_call(SimStreamCall::StreamDestroy)?;
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let s = self
            .streams
            .streams
            .get_mut(&key)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if s.legacy {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if s.capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        self.streams.destroy_stream(key);
        Ok(())
    }

    fn stream_wait_event_locked(&mut self, stream: u64, event: u64) -> Result<(), CuResult> {
        self.begin_stream_call(SimStreamCall::StreamWaitEvent)?;
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let recorded = match self.streams.events.get(&event) {
            Some(e) => e.recorded.clone(),
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        let in_capture = self.captured(key)?;
        match recorded {
            Recorded::Never => Ok(()),
            Recorded::Captured { capture } => {
                if !self.streams.captures.contains_key(&capture) {
                    return Ok(()); // that capture has ended: nothing to wait for
                }
                match in_capture {
                    Some(id) if id == capture => Ok(()),
                    Some(_) => Err(CUDA_ERROR_STREAM_CAPTURE_MERGE),
                    None => {
                        let legacy = self.streams.streams.get(&key).is_some_and(|s| s.legacy);
                        if legacy {
                            return Err(CuResult::STREAM_CAPTURE_UNSUPPORTED);
                        }
                        if let Some(c) = self.streams.captures.get_mut(&capture) {
                            c.members.push(key);
                        }
                        if let Some(s) = self.streams.streams.get_mut(&key) {
                            s.capture = Some(capture);
                        }
                        Ok(())
                    }
                }
            }
            Recorded::Work { frontier, .. } => {
                if in_capture.is_some() {
                    return Ok(()); // a graph dependency: no live work is ordered
                }
                if let Some(code) = self.implicit_conflict(key, "cuStreamWaitEvent") {
                    return Err(code);
                }
                let mut f = self.streams.commit_frontier(key);
                merge(&mut f, &frontier);
                if let Some(s) = self.streams.streams.get_mut(&key) {
                    s.clock = f;
                }
                Ok(())
            }
        }
    }
}

impl SimDriver {
    // ------------------------------------------------------------ threads

    /// `cuCtxSetCurrent` with `device`'s primary context: the calling thread's current
    /// device, whose legacy stream [`SIM_LEGACY_STREAM`](super::SIM_LEGACY_STREAM)
    /// names and on which [`SimDriver::stream_create`] creates streams. Every thread
    /// starts on device 0. Not counted.
    ///
    /// Errors: `CUDA_ERROR_INVALID_DEVICE` for an ordinal that is not one of the
    /// simulated devices (nothing changes).
    pub fn ctx_set_current(&self, device: i32) -> CuResult {
        let mut st = lock(&self.inner);
        if device < 0 || i64::from(device) >= i64::from(st.config.device_count) {
            return CuResult::INVALID_DEVICE;
        }
        st.streams.set_device(caller(), device);
        CuResult::SUCCESS
    }

    /// The calling thread's current device (`cuCtxGetDevice`; 0 unless
    /// [`SimDriver::ctx_set_current`] said otherwise). Not counted.
    pub fn ctx_get_device(&self) -> i32 {
        lock(&self.inner).streams.device_of(caller())
    }

    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to
    /// `mode` and returns its previous one. Per thread: another thread's mode does not
    /// change. Every thread starts in [`CaptureMode::Global`]. With the caller in
    /// [`CaptureMode::Relaxed`], event and stream queries and synchronizes are legal
    /// during any capture, and the capture stays valid (last column of the table
    /// "Events and stream queries while another stream is captured"); not
    /// `cuCtxSynchronize` nor legacy-stream events (section "Stream capture"). Counts as
    /// [`SimStreamCall::ThreadExchangeCaptureMode`]; never fails.
    pub fn thread_exchange_capture_mode(&self, mode: CaptureMode) -> CaptureMode {
        let mut st = lock(&self.inner);
        let _ = st.streams.begin(SimStreamCall::ThreadExchangeCaptureMode);
        st.streams.exchange_mode(caller(), mode)
    }

    // ------------------------------------------------------------ streams

    /// `cuStreamCreate` with `CU_STREAM_NON_BLOCKING`: a non-blocking stream (the kind
    /// PyTorch uses and the measured rows were taken with) on the calling thread's
    /// current device; returns its handle (never 0; the most recently destroyed
    /// stream's handle when one is free, as the CUDA driver may hand it out).
    /// [`SimDriver::stream_create_with_flags`] makes a blocking one. Counts as
    /// [`SimStreamCall::StreamCreate`]; fails only when injected.
    pub fn stream_create(&self) -> Result<u64, CuResult> {
        self.stream_create_with_flags(CU_STREAM_NON_BLOCKING)
    }

    /// `cuStreamCreate(flags)` on the calling thread's current device:
    /// [`CU_STREAM_DEFAULT`](super::CU_STREAM_DEFAULT) (0) makes a blocking stream,
    /// which synchronizes with that device's legacy stream (an operation on either
    /// waits for the other's earlier work); [`CU_STREAM_NON_BLOCKING`] (1) one that
    /// does not. Returns its handle: never 0; a destroyed stream's handle when one is
    /// free (the most recently destroyed first), else one never handed out. A stream
    /// with a reused handle is a new stream: it is ordered after none of the
    /// destroyed stream's work (still queued until the device completes it), and a
    /// hand-off to it of memory that work touches is a
    /// [`SimFault::HandoffWhileQueued`]. Counts as [`SimStreamCall::StreamCreate`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for any other flag bit.
    ///
    /// [`SimFault::HandoffWhileQueued`]: super::SimFault::HandoffWhileQueued
    pub fn stream_create_with_flags(&self, flags: u32) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        st.begin_stream_call(SimStreamCall::StreamCreate)?;
        if flags & !CU_STREAM_NON_BLOCKING != 0 {
            return Err(CuResult::INVALID_VALUE);
        }
        let device = st.streams.device_of(caller());
        Ok(st
            .streams
            .create_stream(device, flags & CU_STREAM_NON_BLOCKING == 0))
    }

    /// `cuStreamDestroy`: the handle is refused from now on (every stream call
    /// naming it, a launch or an event record on it included, is
    /// [`CUDA_ERROR_INVALID_HANDLE`], changing nothing) until the next create hands it
    /// out again to a new stream; work already queued on the stream still runs
    /// ([`SimDriver::ctx_synchronize`] of its device, an event recorded on it before,
    /// or [`SimDriver::stream_complete`] of the old handle while no live stream has it
    /// completes it), as NVIDIA documents. Counts as [`SimStreamCall::StreamDestroy`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for the
    /// legacy stream or a handle that is not a live stream;
    /// [`CUDA_ERROR_ILLEGAL_STATE`] while the stream is in an open capture (not
    /// measured; the stream stays).
    pub fn stream_destroy(&self, stream: u64) -> CuResult {
        status(lock(&self.inner).stream_destroy_locked(stream))
    }

    /// `cuStreamQuery`: `CUDA_SUCCESS` when every operation queued on `stream` so far
    /// (launches, and the work of events it waits on) has completed,
    /// [`CUDA_ERROR_NOT_READY`] when not (row "stream query": legal, and NOT_READY
    /// with a kernel still running, where the capture rules allow it). Counts as
    /// [`SimStreamCall::StreamQuery`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live stream;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, invalidating the captures in the way
    /// (each a [`SimFault::CaptureBroken`] for a stream capture), when the table of
    /// "Events and stream queries while another stream is captured" says the call
    /// breaks: row "stream query" (global-mode capture: any thread; thread-local: the
    /// capturing thread; relaxed, or a caller switched to relaxed: legal). Also, any
    /// mode: on a stream that is itself being captured; on the legacy stream during any
    /// capture (it synchronizes with other streams, like `cuCtxSynchronize`, row
    /// "Stream capture"; not measured for the query itself).
    ///
    /// [`SimFault::CaptureBroken`]: super::SimFault::CaptureBroken
    pub fn stream_query(&self, stream: u64) -> CuResult {
        let mut st = lock(&self.inner);
        match st.stream_gate(stream, SimStreamCall::StreamQuery) {
            Err(code) => code,
            Ok(f) if st.streams.is_complete(&f) => CuResult::SUCCESS,
            Ok(_) => CUDA_ERROR_NOT_READY,
        }
    }

    /// `cuStreamSynchronize`: waits for every operation queued on `stream` so far,
    /// which completes that work and all it was ordered after (row "stream
    /// synchronize": legal where the capture rules allow it). Counts as
    /// [`SimStreamCall::StreamSynchronize`].
    ///
    /// Errors: as [`SimDriver::stream_query`], row "stream synchronize" (same columns);
    /// a refused synchronize completes nothing.
    pub fn stream_synchronize(&self, stream: u64) -> CuResult {
        let mut st = lock(&self.inner);
        match st.stream_gate(stream, SimStreamCall::StreamSynchronize) {
            Err(code) => code,
            Ok(f) => {
                st.streams.complete(&f);
                CuResult::SUCCESS
            }
        }
    }

    /// `cuStreamWaitEvent`: later work on `stream` is ordered after the work `event`
    /// covers (row "stream wait on an event": legal in every mode, on any thread, and
    /// breaks no capture). Memory that work touches may then be handed to `stream`
    /// ([`SimDriver::note_handoff`]) with no fault. An event never recorded is no
    /// dependency. On a stream being captured the wait is a graph dependency and
    /// orders no live work. A stream not being captured that waits on an event recorded
    /// in an open capture joins that capture (NVIDIA's cross-stream capture). Counts as
    /// [`SimStreamCall::StreamWaitEvent`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live stream or
    /// event; `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` on a stream whose capture is
    /// invalidated; [`CUDA_ERROR_STREAM_CAPTURE_MERGE`] when a stream in one capture
    /// waits on an event of another; `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` when the
    /// legacy stream would join a capture (the legacy stream cannot be captured).
    pub fn stream_wait_event(&self, stream: u64, event: u64) -> CuResult {
        status(lock(&self.inner).stream_wait_event_locked(stream, event))
    }
}
