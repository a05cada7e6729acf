//! What the simulated driver offers beyond the driver calls: creating it, fault
//! injection, work in flight, captures, and queries of what it holds (not driver
//! calls: never counted, never injected).

use std::collections::BTreeMap;

use super::model::{claim_va_window, Capture, Inner};
use super::streams::Streams;
use super::{
    SimConfig, SimDriver, SimFault, SimState, CUDA_ERROR_ILLEGAL_STATE, DEFAULT_GRANULARITY,
    SIM_MAX_DEVICES, SIM_VA_WINDOW,
};
use crate::driver::{CuResult, DevicePtr, DriverCall};
use crate::sync::{lock, Mutex};

impl SimDriver {
    /// A fresh simulated device with `config`: nothing created, reserved or mapped,
    /// every call count 0, no injection pending, no capture open. A granularity of 0
    /// is taken as 2 MiB.
    pub fn new(config: SimConfig) -> SimDriver {
        let mut config = config;
        if config.granularity_bytes == 0 {
            config.granularity_bytes = DEFAULT_GRANULARITY;
        }
        config.device_count = config.device_count.min(SIM_MAX_DEVICES);
        // The first window is taken now, so that a driver's addresses depend only on
        // the order drivers are created in. With the address space exhausted (16
        // million drivers), the window is empty and every reservation fails.
        let first = claim_va_window(SIM_VA_WINDOW, config.granularity_bytes);
        let (next_va, va_end) = first.unwrap_or((0, 0));
        SimDriver {
            inner: Mutex::new(Inner {
                config,
                next_handle: 1,
                windows: first.into_iter().collect(),
                next_va,
                va_end,
                handles: BTreeMap::new(),
                reservations: BTreeMap::new(),
                mappings: BTreeMap::new(),
                physical_bytes: 0,
                calls: [0; DriverCall::ALL.len()],
                injections: Vec::new(),
                busy: Vec::new(),
                faults: Vec::new(),
                capture: None,
                streams: Streams::new(),
                content: Default::default(),
            }),
        }
    }

    /// The configuration this device runs with (granularity normalised).
    pub fn config(&self) -> SimConfig {
        lock(&self.inner).config
    }

    /// Makes the `nth` future call of kind `call` fail with `code` (`nth` = 1: the
    /// next one; 0 is taken as 1). The failing call is counted in
    /// [`SimDriver::call_count`] but changes nothing else. Several injections may be
    /// pending for the same or different kinds; each targets one call, counted from
    /// the calls made when it is injected. An injection aimed at a call another one
    /// already targets moves to the next untargeted call of that kind, so two
    /// injections with `nth` = 1 fail the next two calls, in injection order. A
    /// stream or event kind (see [`of_driver_call`](super::SimStreamCall::of_driver_call))
    /// is injected as [`SimDriver::inject_stream_failure`] injects it.
    pub fn inject_failure(&self, call: DriverCall, nth: u32, code: CuResult) {
        if let Some(stream_call) = super::SimStreamCall::of_driver_call(call) {
            return self.inject_stream_failure(stream_call, nth, code);
        }
        let mut st = lock(&self.inner);
        let done = st.calls.get(call as usize).copied().unwrap_or(0);
        let mut at = done + u64::from(nth.max(1));
        while st.injections.iter().any(|&(c, a, _)| c == call && a == at) {
            at += 1;
        }
        st.injections.push((call, at, code));
    }

    /// Drops every pending injection of [`SimDriver::inject_failure`] (the memory
    /// calls); those of [`SimDriver::inject_stream_failure`] stay.
    pub fn clear_failures(&self) {
        lock(&self.inner).injections.clear();
    }

    /// Number of injections still pending, all kinds together.
    pub fn pending_failures(&self) -> usize {
        lock(&self.inner).injections.len()
    }

    /// Marks `[ptr, ptr + size)` busy on device 0: [`SimDriver::mark_busy_on`] with
    /// device 0.
    pub fn mark_busy(&self, ptr: DevicePtr, size: u64) {
        self.mark_busy_on(0, ptr, size);
    }

    /// Marks `[ptr, ptr + size)` busy on `device`: work queued on that device (a
    /// kernel of a peer reading this memory, say) touches it until the next
    /// successful [`SimDriver::ctx_synchronize`] of that same device; a synchronize of
    /// another device does not clear it, as `cuCtxSynchronize` waits only for its own
    /// context's work. An unmap overlapping a busy range still succeeds, as the real
    /// driver's does, but is recorded as [`SimFault::UnmapWhileBusy`]. A `size` of 0
    /// marks nothing.
    pub fn mark_busy_on(&self, device: i32, ptr: DevicePtr, size: u64) {
        if size == 0 {
            return;
        }
        lock(&self.inner).busy.push((device, ptr, size));
    }

    /// The ranges currently marked busy, `(ptr, size)` in bytes, in marking order,
    /// every device together.
    pub fn busy_ranges(&self) -> Vec<(DevicePtr, u64)> {
        lock(&self.inner)
            .busy
            .iter()
            .map(|&(_, p, s)| (p, s))
            .collect()
    }

    /// Every fault recorded so far, oldest first (as many as
    /// [`SimDriver::contract_faults`]). Tests of a correct pool assert this stays
    /// empty.
    pub fn faults(&self) -> Vec<SimFault> {
        lock(&self.inner).faults.clone()
    }

    /// What the driver holds right now: handles, physical bytes, reservations,
    /// mappings and access grants.
    pub fn state(&self) -> SimState {
        let st = lock(&self.inner);
        SimState {
            handles: st.handles.len() as u64,
            physical_bytes: st.physical_bytes,
            reservations: st.reservations.len() as u64,
            reserved_bytes: st.reservations.values().sum(),
            mappings: st.mappings.len() as u64,
            mapped_bytes: st.mappings.values().map(|m| m.size).sum(),
            access_grants: st.mappings.values().map(|m| m.access.len()).sum(),
        }
    }

    /// How many calls of kind `call` were made so far, failed ones (injected or not)
    /// included. [`DriverCall::Init`] is never called on the simulator and stays 0.
    /// A stream or event kind (see [`of_driver_call`](super::SimStreamCall::of_driver_call))
    /// reads [`SimDriver::stream_call_count`].
    pub fn call_count(&self, call: DriverCall) -> u64 {
        if let Some(stream_call) = super::SimStreamCall::of_driver_call(call) {
            return self.stream_call_count(stream_call);
        }
        lock(&self.inner)
            .calls
            .get(call as usize)
            .copied()
            .unwrap_or(0)
    }

    /// Models a kernel or memset on device `device` reading and writing
    /// `[ptr, ptr + size)`. Not a driver call: not counted, never injected.
    ///
    /// Returns `CUDA_SUCCESS` when every byte is mapped with access granted to
    /// `device` (a size of 0 touches nothing), else `CUDA_ERROR_INVALID_VALUE` (row
    /// "any access before cuMemSetAccess on a new mapping").
    pub fn touch(&self, ptr: DevicePtr, size: u64, device: i32) -> CuResult {
        if lock(&self.inner).accessible(ptr, size, device) {
            CuResult::SUCCESS
        } else {
            CuResult::INVALID_VALUE
        }
    }

    /// Opens the stream-less global-mode capture (`cuStreamBeginCapture` on a stream
    /// the test does not name, by a thread it does not name). While it is open every
    /// VMM call behaves as outside one; [`SimDriver::ctx_synchronize`] fails and
    /// invalidates it; for the capture rules of event and stream queries it counts as
    /// another thread's global-mode capture. It models the phase-1 contract (a
    /// synchronize refused during a capture is expected, and retried by the pool
    /// later), so what breaks it is not a contract fault; a capture on a stream, with
    /// a mode and a thread, is [`SimDriver::stream_begin_capture`]. Not counted.
    ///
    /// Returns `CUDA_SUCCESS`, or [`CUDA_ERROR_ILLEGAL_STATE`] when a capture is
    /// already open.
    pub fn begin_capture(&self) -> CuResult {
        let mut st = lock(&self.inner);
        if st.capture.is_some() {
            return CUDA_ERROR_ILLEGAL_STATE;
        }
        st.capture = Some(Capture { invalidated: false });
        CuResult::SUCCESS
    }

    /// Closes the capture (`cuStreamEndCapture`). Not counted.
    ///
    /// Returns `CUDA_SUCCESS` when no synchronize happened during it (row "all
    /// succeed; the capture ends fine"), `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when
    /// one did, [`CUDA_ERROR_ILLEGAL_STATE`] when no capture is open.
    pub fn end_capture(&self) -> CuResult {
        match lock(&self.inner).capture.take() {
            None => CUDA_ERROR_ILLEGAL_STATE,
            Some(c) if c.invalidated => CuResult::STREAM_CAPTURE_INVALIDATED,
            Some(_) => CuResult::SUCCESS,
        }
    }

    /// Whether the stream-less capture ([`SimDriver::begin_capture`]) is open. Stream
    /// captures ([`SimDriver::stream_begin_capture`]) are not counted here:
    /// [`SimDriver::stream_captures_open`].
    pub fn is_capturing(&self) -> bool {
        lock(&self.inner).capture.is_some()
    }

    /// How many stream captures ([`SimDriver::stream_begin_capture`]) are open now,
    /// valid or invalidated (not the stream-less one of [`SimDriver::begin_capture`]).
    pub fn stream_captures_open(&self) -> u64 {
        lock(&self.inner).streams.captures.len() as u64
    }

    /// Device ordinals granted access on the mapping containing `ptr`, ascending;
    /// empty when `ptr` is not mapped. A query of the model, not a driver call.
    pub fn access_of(&self, ptr: DevicePtr) -> Vec<i32> {
        let st = lock(&self.inner);
        match st.mapping_at(ptr) {
            Some((_, m)) => m.access.iter().collect(),
            None => Vec::new(),
        }
    }
}
