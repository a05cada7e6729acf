//! One concern in one file: the stream, event and capture calls of the simulated
//! driver, each a row of docs/vmm-semantics.md.
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
use super::streams::{caller, merge, Breaks, CaptureRec, Clock, EventRec, Recorded, FIRST_STREAM};
use super::{
    CaptureMode, CaptureStatus, SimCaptureInfo, SimDriver, SimFault, SimStreamCall, SimWork,
    CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_READY,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_MERGE,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
    CU_STREAM_NON_BLOCKING,
};
use crate::driver::{CuResult, DevicePtr};
use crate::sync::lock;

/// `Ok` as `CUDA_SUCCESS`, `Err(code)` as `code`.
fn status(r: Result<(), CuResult>) -> CuResult {
    match r {
        Ok(()) => CuResult::SUCCESS,
        Err(code) => code,
    }
}

impl Inner {
    /// Counts `call`; its injected failure, if this call is the one targeted.
    fn begin_stream_call(&mut self, call: SimStreamCall) -> Result<(), CuResult> {
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
    fn event_gate(&mut self, event: u64, call: SimStreamCall) -> Result<Option<Clock>, CuResult> {
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
    fn stream_gate(&mut self, stream: u64, call: SimStreamCall) -> Result<Clock, CuResult> {
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
    fn captured(&self, key: u64) -> Result<Option<u64>, CuResult> {
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

    fn stream_begin_capture_locked(
        &mut self,
        stream: u64,
        mode: CaptureMode,
    ) -> Result<(), CuResult> {
        self.begin_stream_call(SimStreamCall::StreamBeginCapture)?;
        let key = self
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        match self.streams.streams.get(&key) {
            Some(s) if s.legacy => return Err(CuResult::STREAM_CAPTURE_UNSUPPORTED),
            Some(s) if s.capture.is_some() => return Err(CUDA_ERROR_ILLEGAL_STATE),
            Some(_) => {}
            None => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        let id = self.streams.next_capture;
        self.streams.next_capture += 1;
        self.streams.captures.insert(
            id,
            CaptureRec {
                origin: key,
                thread: caller(),
                mode,
                invalidated: false,
                launches: 0,
                members: vec![key],
            },
        );
        if let Some(s) = self.streams.streams.get_mut(&key) {
            s.capture = Some(id);
        }
        Ok(())
    }

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

    // ------------------------------------------------------------ captures

    /// `cuStreamBeginCapture(stream, mode)` on the calling thread: from now on
    /// launches, event records and waits on `stream` are graph nodes, not work. `mode`
    /// decides which other calls the capture forbids (see [`CaptureMode`]). Every VMM
    /// call stays legal during it (row "cuMemCreate, ... all succeed; the capture ends
    /// fine"); [`SimDriver::ctx_synchronize`] of any device breaks it, in every mode
    /// (row "cuCtxSynchronize: STREAM_CAPTURE_UNSUPPORTED, and the capture is
    /// invalidated"). Independent of the stream-less capture of
    /// [`SimDriver::begin_capture`]. Counts as [`SimStreamCall::StreamBeginCapture`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live stream;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for the legacy stream (it cannot be
    /// captured, as NVIDIA documents); [`CUDA_ERROR_ILLEGAL_STATE`] when the stream is
    /// already being captured.
    pub fn stream_begin_capture(&self, stream: u64, mode: CaptureMode) -> CuResult {
        status(lock(&self.inner).stream_begin_capture_locked(stream, mode))
    }

    /// `cuStreamEndCapture`: ends the capture `stream` began; every stream in it leaves
    /// it. Counts as [`SimStreamCall::StreamEndCapture`].
    ///
    /// Returns `CUDA_SUCCESS` when nothing broke the capture, and
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when something did (a call the table
    /// "Events and stream queries while another stream is captured" marks "breaks",
    /// `cuCtxSynchronize`, a legacy-stream event wait): the capture ends either way.
    ///
    /// Errors (the capture stays open): [`CUDA_ERROR_INVALID_HANDLE`] for a handle that
    /// is not a live stream; [`CUDA_ERROR_ILLEGAL_STATE`] when `stream` is not being
    /// captured; [`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`] when it joined a capture
    /// another stream began; [`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`] when the
    /// capture was not begun in relaxed mode and the caller is not the thread that
    /// began it (NVIDIA's documentation; not measured).
    pub fn stream_end_capture(&self, stream: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Err(code) = st.begin_stream_call(SimStreamCall::StreamEndCapture) {
            return code;
        }
        let Some(key) = st.streams.resolve(stream) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let Some(id) = st.streams.streams.get(&key).and_then(|s| s.capture) else {
            return CUDA_ERROR_ILLEGAL_STATE;
        };
        match st.streams.captures.get(&id) {
            Some(c) if c.origin != key => return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            Some(c) if c.mode != CaptureMode::Relaxed && c.thread != caller() => {
                return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
            }
            Some(_) => {}
            None => return CUDA_ERROR_ILLEGAL_STATE,
        }
        match st.streams.close_capture(id) {
            Some(c) if c.invalidated => CuResult::STREAM_CAPTURE_INVALIDATED,
            _ => CuResult::SUCCESS,
        }
    }

    /// `cuStreamIsCapturing`: [`SimDriver::stream_get_capture_info`]'s status. Counts
    /// as [`SimStreamCall::StreamGetCaptureInfo`].
    ///
    /// Errors: as [`SimDriver::stream_get_capture_info`].
    pub fn stream_is_capturing(&self, stream: u64) -> Result<CaptureStatus, CuResult> {
        self.stream_get_capture_info(stream).map(|i| i.status)
    }

    /// `cuStreamGetCaptureInfo`: whether `stream` is being captured, the capture's id,
    /// mode and launches so far. Legal during any capture, from any thread (row
    /// "GetCaptureInfo of A: legal"); breaks nothing. The legacy stream reports
    /// [`CaptureStatus::None`] while only non-blocking streams are captured (row
    /// "`cuStreamIsCapturing(CU_STREAM_LEGACY)` reports not capturing when the
    /// capturing stream is non-blocking"), and the stream-less capture of
    /// [`SimDriver::begin_capture`] is on no stream. Counts as
    /// [`SimStreamCall::StreamGetCaptureInfo`].
    ///
    /// Errors: [`CUDA_ERROR_INVALID_HANDLE`] for a handle that is not a live stream;
    /// [`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`] for the legacy stream while a blocking
    /// stream of its device is captured (same row: "only for a blocking one"; the
    /// capture stays valid).
    pub fn stream_get_capture_info(&self, stream: u64) -> Result<SimCaptureInfo, CuResult> {
        let mut st = lock(&self.inner);
        st.begin_stream_call(SimStreamCall::StreamGetCaptureInfo)?;
        let key = st
            .streams
            .resolve(stream)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let s = st
            .streams
            .streams
            .get(&key)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if s.legacy && !st.streams.blocking_captures_on(s.device).is_empty() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        }
        let (status, id, mode, launches) = st.streams.status_of(s.capture);
        Ok(SimCaptureInfo {
            status,
            id,
            mode,
            launches,
        })
    }

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
