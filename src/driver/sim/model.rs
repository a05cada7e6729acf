//! The simulated device's state behind its one lock: handles, reservations,
//! mappings with their access grants, call counts, pending injections, work in
//! flight, faults, the stream-less capture, streams, events and stream captures
//! (`streams.rs`); and the process-wide address windows.

use std::collections::BTreeMap;

use super::streams::Streams;
use super::{SimConfig, SimFault, SIM_MAX_DEVICES, SIM_VA_BASE, SIM_VA_WINDOW};
use crate::driver::{CuResult, DevicePtr, DriverCall};

/// The address windows the simulated drivers of the process hold now, `start ->
/// end`: a driver takes windows when it is created and when its window is used up,
/// and gives them back when it is dropped, as a process's reservations are freed
/// when the driver frees them. A plain std mutex, also under loom: it only hands out
/// disjoint ranges and orders nothing else.
static WINDOWS: std::sync::Mutex<BTreeMap<DevicePtr, DevicePtr>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Takes the lowest free run of whole windows: `[start, end)` with `start` a
/// multiple of `align` (at least [`SIM_VA_WINDOW`]), at or above [`SIM_VA_BASE`], and
/// at least `size` bytes (at least one window), disjoint from every window another
/// driver holds. `None` when no such run is left below 2^64.
pub(super) fn claim_va_window(size: u64, align: u64) -> Option<(DevicePtr, DevicePtr)> {
    let align = align.max(SIM_VA_WINDOW);
    let mut held = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    let mut start = align_up(SIM_VA_BASE, align)?;
    let mut end = align_up(start.checked_add(size.max(1))?, SIM_VA_WINDOW)?;
    for (&s, &e) in held.iter() {
        if e <= start {
            continue;
        }
        if end <= s {
            break;
        }
        start = align_up(e, align)?;
        end = align_up(start.checked_add(size.max(1))?, SIM_VA_WINDOW)?;
    }
    held.insert(start, end);
    Some((start, end))
}

/// Gives back windows taken with [`claim_va_window`].
pub(super) fn release_va_windows(windows: &[(DevicePtr, DevicePtr)]) {
    let mut held = WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    for (start, _) in windows {
        held.remove(start);
    }
}

/// A set of device ordinals below [`SIM_MAX_DEVICES`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct DeviceSet(u128);

impl DeviceSet {
    pub(super) fn insert(&mut self, device: i32) {
        self.0 |= 1u128 << (device as u32 % SIM_MAX_DEVICES);
    }
    pub(super) fn contains(&self, device: i32) -> bool {
        (0..SIM_MAX_DEVICES as i32).contains(&device) && self.0 & (1u128 << device) != 0
    }
    pub(super) fn len(&self) -> u64 {
        u64::from(self.0.count_ones())
    }
    pub(super) fn iter(self) -> impl Iterator<Item = i32> {
        (0..SIM_MAX_DEVICES as i32).filter(move |&d| self.0 & (1u128 << d) != 0)
    }
}

/// A physical allocation the simulated driver holds.
#[derive(Clone, Copy, Debug)]
pub(super) struct HandleRec {
    /// Size, bytes.
    pub(super) size: u64,
    /// References: 1 at create, +1 per retain, −1 per release. 0 means released
    /// (the handle lives on only while mapped).
    pub(super) refs: u64,
    /// Live mappings of this handle.
    pub(super) maps: u64,
}

/// A live mapping.
#[derive(Clone, Debug)]
pub(super) struct MappingRec {
    /// Size, bytes (always the whole handle).
    pub(super) size: u64,
    /// Raw handle mapped there.
    pub(super) handle: u64,
    /// Device ordinals granted read/write access.
    pub(super) access: DeviceSet,
}

/// The open stream-less capture ([`SimDriver::begin_capture`](super::SimDriver::begin_capture)).
#[derive(Clone, Copy, Debug)]
pub(super) struct Capture {
    /// Whether a synchronize invalidated it.
    pub(super) invalidated: bool,
}

/// Everything behind the lock.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) config: SimConfig,
    pub(super) next_handle: u64,
    /// The address windows this driver holds (`[start, end)`), given back when it
    /// is dropped.
    pub(super) windows: Vec<(DevicePtr, DevicePtr)>,
    /// The next address to reserve from, in the current window `..va_end`.
    pub(super) next_va: u64,
    /// End of this driver's current address window (exclusive).
    pub(super) va_end: u64,
    pub(super) handles: BTreeMap<u64, HandleRec>,
    pub(super) reservations: BTreeMap<DevicePtr, u64>,
    pub(super) mappings: BTreeMap<DevicePtr, MappingRec>,
    pub(super) physical_bytes: u64,
    pub(super) calls: [u64; DriverCall::ALL.len()],
    /// Pending injections: (call, absolute call number that fails, code).
    pub(super) injections: Vec<(DriverCall, u64, CuResult)>,
    /// Work in flight: (device, ptr, size).
    pub(super) busy: Vec<(i32, DevicePtr, u64)>,
    /// Every contract fault, oldest first ([`SimDriver::contract_faults`](super::SimDriver::contract_faults) counts them).
    pub(super) faults: Vec<SimFault>,
    /// The stream-less capture.
    pub(super) capture: Option<Capture>,
    /// Streams, queued work, events, stream captures, per-thread modes.
    pub(super) streams: Streams,
    /// Device bytes and pinned host buffers (`content.rs`).
    pub(super) content: super::content::Content,
}

pub(super) fn align_up(v: u64, align: u64) -> Option<u64> {
    if align == 0 {
        return Some(v);
    }
    let rem = v % align;
    if rem == 0 {
        Some(v)
    } else {
        v.checked_add(align - rem)
    }
}

pub(super) fn overlaps(a: DevicePtr, a_size: u64, b: DevicePtr, b_size: u64) -> bool {
    a < b.saturating_add(b_size) && b < a.saturating_add(a_size)
}

impl Inner {
    pub(super) fn gran(&self) -> u64 {
        self.config.granularity_bytes
    }

    /// Counts one call of `call` and returns the injected failure, if this call is
    /// the one an injection targets.
    pub(super) fn begin(&mut self, call: DriverCall) -> Option<CuResult> {
        let idx = call as usize;
        let n = match self.calls.get_mut(idx) {
            Some(c) => {
                *c += 1;
                *c
            }
            None => return None,
        };
        let pos = self
            .injections
            .iter()
            .position(|&(c, at, _)| c == call && at == n)?;
        let (_, _, code) = self.injections.remove(pos);
        Some(code)
    }

    pub(super) fn is_aligned(&self, v: u64) -> bool {
        v.is_multiple_of(self.gran())
    }

    /// The mapping containing address `p`, if any.
    pub(super) fn mapping_at(&self, p: DevicePtr) -> Option<(DevicePtr, &MappingRec)> {
        let (&start, m) = self.mappings.range(..=p).next_back()?;
        if p < start.saturating_add(m.size) {
            Some((start, m))
        } else {
            None
        }
    }

    /// Whether the whole mappings exactly tile `[ptr, ptr + size)`: no byte unmapped,
    /// no mapping sticking out at either end.
    pub(super) fn exactly_tiled(&self, ptr: DevicePtr, size: u64) -> bool {
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        let mut cursor = ptr;
        while cursor < end {
            match self
                .mappings
                .get(&cursor)
                .and_then(|m| cursor.checked_add(m.size))
            {
                Some(next) => cursor = next,
                None => return false,
            }
        }
        cursor == end
    }

    /// Drops a mapping, and its handle when that was released and this was its last
    /// mapping (the physical bytes are freed then).
    pub(super) fn remove_mapping(&mut self, start: DevicePtr) {
        let Some(m) = self.mappings.remove(&start) else {
            return;
        };
        let mut free = None;
        if let Some(h) = self.handles.get_mut(&m.handle) {
            h.maps = h.maps.saturating_sub(1);
            if h.maps == 0 && h.refs == 0 {
                free = Some(h.size);
            }
        }
        if let Some(bytes) = free {
            self.handles.remove(&m.handle);
            self.drop_content(m.handle);
            self.physical_bytes = self.physical_bytes.saturating_sub(bytes);
        }
    }
}
