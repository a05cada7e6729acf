//! The stream-capture calls of the simulated driver (`cuStreamBeginCapture`, end,
//! is-capturing, capture info), each a row of docs/vmm-semantics.md.

use super::model::Inner;
use super::stream_calls::status;
use super::streams::{caller, CaptureRec};
use super::{
    CaptureMode, CaptureStatus, SimCaptureInfo, SimDriver, SimStreamCall, CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
};
use crate::driver::CuResult;
use crate::sync::lock;

impl Inner {
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
}

impl SimDriver {
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
}
