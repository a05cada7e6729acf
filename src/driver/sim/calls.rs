//! The CUDA-shaped calls of the simulated driver: the same arguments as the driver
//! functions (a map has an offset and a size), raw `CUresult` answers, one row of
//! `docs/vmm-semantics.md` behind each error.

use super::model::{align_up, claim_va_window, overlaps, DeviceSet, HandleRec, Inner, MappingRec};
use super::{SimDriver, SimFault};
use crate::driver::{CuResult, DevicePtr, DriverCall, MemInfo};
use crate::sync::lock;

fn status(r: Result<(), CuResult>) -> CuResult {
    match r {
        Ok(()) => CuResult::SUCCESS,
        Err(code) => code,
    }
}

impl SimDriver {
    /// `cuMemGetAllocationGranularity` with `CU_MEM_ALLOC_GRANULARITY_MINIMUM`, bytes
    /// (row "granularity MINIMUM and RECOMMENDED: both 2 MiB"). Counts as
    /// [`DriverCall::Granularity`]; fails only when injected.
    pub fn granularity_minimum(&self) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Granularity) {
            return Err(code);
        }
        Ok(st.gran())
    }

    /// `cuMemGetAllocationGranularity` with `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`,
    /// bytes; the same value as the minimum, as measured. Counts as
    /// [`DriverCall::Granularity`]; fails only when injected.
    pub fn granularity_recommended(&self) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Granularity) {
            return Err(code);
        }
        Ok(st.gran())
    }

    /// `cuMemCreate`: a physical handle of `size` bytes; returns its raw value (never
    /// 0, never reused). Counts as [`DriverCall::Create`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0 or a size that is not a multiple
    /// of the granularity (rows "cuMemCreate size 0", "size not a multiple");
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the physical bytes held plus `size` exceed the
    /// capacity (row "cuMemCreate of 1 TiB").
    pub fn mem_create(&self, size: u64) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Create) {
            return Err(code);
        }
        if size == 0 || !st.is_aligned(size) {
            return Err(CuResult::INVALID_VALUE);
        }
        match st.physical_bytes.checked_add(size) {
            Some(total) if total <= st.config.capacity_bytes => {
                let raw = st.next_handle;
                st.next_handle += 1;
                st.handles.insert(
                    raw,
                    HandleRec {
                        size,
                        refs: 1,
                        maps: 0,
                    },
                );
                st.physical_bytes = total;
                Ok(raw)
            }
            _ => Err(CuResult::OUT_OF_MEMORY),
        }
    }

    /// `cuMemRelease`: drops one reference to handle `raw`. When the last reference
    /// goes and the handle is not mapped, its physical bytes are freed; a handle still
    /// mapped stays usable and is freed at its last unmap (row "cuMemRelease while the
    /// handle is still mapped: success"). Counts as [`DriverCall::Release`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for a handle that was never created or whose
    /// references are all released already (row "cuMemRelease of an already released
    /// handle").
    pub fn mem_release(&self, raw: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Release) {
            return code;
        }
        let Some(h) = st.handles.get_mut(&raw) else {
            return CuResult::INVALID_VALUE;
        };
        if h.refs == 0 {
            return CuResult::INVALID_VALUE;
        }
        h.refs -= 1;
        if h.refs == 0 && h.maps == 0 {
            let size = h.size;
            st.handles.remove(&raw);
            st.drop_content(raw);
            st.physical_bytes = st.physical_bytes.saturating_sub(size);
        }
        CuResult::SUCCESS
    }

    /// `cuMemRetainAllocationHandle`: the handle mapped at `ptr` (any address inside
    /// a mapping, not only its start), with one more reference that a
    /// [`SimDriver::mem_release`] must drop (row "cuMemRetainAllocationHandle from an
    /// interior address: same handle value"). Not a [`DriverCall`] kind: not counted,
    /// never injected.
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` when `ptr` is not mapped.
    pub fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        let raw = match st.mapping_at(ptr) {
            Some((_, m)) => m.handle,
            None => return Err(CuResult::INVALID_VALUE),
        };
        match st.handles.get_mut(&raw) {
            Some(h) => {
                h.refs += 1;
                Ok(raw)
            }
            None => Err(CuResult::INVALID_VALUE),
        }
    }

    /// `cuMemAddressReserve`: `size` bytes of virtual addresses aligned to
    /// max(`alignment`, granularity) (`alignment` 0: the granularity). Addresses come
    /// from a bump allocator in this driver's own windows (from [`SIM_VA_BASE`](super::SIM_VA_BASE) up,
    /// [`SIM_VA_WINDOW`](super::SIM_VA_WINDOW) bytes each, never another driver's) and are never reused.
    /// Counts as [`DriverCall::Reserve`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, a size that is not a multiple of
    /// the granularity (row "cuMemAddressReserve size 0, or not a multiple of G") or
    /// an alignment that is not a power of two; `CUDA_ERROR_OUT_OF_MEMORY` when the
    /// 64-bit address space is exhausted.
    pub fn mem_address_reserve(&self, size: u64, alignment: u64) -> Result<DevicePtr, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Reserve) {
            return Err(code);
        }
        if size == 0 || !st.is_aligned(size) {
            return Err(CuResult::INVALID_VALUE);
        }
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(CuResult::INVALID_VALUE);
        }
        let align = alignment.max(st.gran());
        let in_window = align_up(st.next_va, align)
            .and_then(|ptr| Some((ptr, ptr.checked_add(size)?)))
            .filter(|&(_, end)| end <= st.va_end);
        let (ptr, next) = match in_window {
            Some(range) => range,
            None => {
                // This window is used up: take fresh ones, never another driver's.
                let Some((start, end)) = claim_va_window(size, align) else {
                    return Err(CuResult::OUT_OF_MEMORY);
                };
                st.va_end = end;
                st.windows.push((start, end));
                (start, start + size)
            }
        };
        st.next_va = next;
        st.reservations.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemAddressFree`: frees the whole reservation `[ptr, ptr + size)`. Counts as
    /// [`DriverCall::FreeReservation`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` when `(ptr, size)` is not exactly a live
    /// reservation (rows "of part of a reservation", "of an already freed
    /// reservation") or while any mapping inside it is live (row "while any mapping
    /// inside it is live").
    pub fn mem_address_free(&self, ptr: DevicePtr, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::FreeReservation) {
            return code;
        }
        if st.reservations.get(&ptr) != Some(&size) {
            return CuResult::INVALID_VALUE;
        }
        let end = ptr.saturating_add(size);
        if st.mappings.range(ptr..end).next().is_some() {
            return CuResult::INVALID_VALUE;
        }
        st.reservations.remove(&ptr);
        CuResult::SUCCESS
    }

    /// `cuMemMap`: maps `size` bytes of handle `raw`, from byte `offset` of the
    /// handle, at `ptr`. Only the whole handle can be mapped. The new mapping has no
    /// access until [`SimDriver::mem_set_access`]. Mapping a handle that is already
    /// mapped elsewhere (an alias) succeeds and holds no more physical bytes (row
    /// "map the same handle a second time at another VA"). Counts as
    /// [`DriverCall::Map`].
    ///
    /// Errors, in this order:
    /// - `CUDA_ERROR_INVALID_VALUE`: size 0, `ptr` or `size` not a multiple of the
    ///   granularity (row "map at a VA that is not a multiple of G"), a handle never
    ///   created or already released, or `offset + size` past the handle's end;
    /// - `CUDA_ERROR_NOT_SUPPORTED`: `offset` ≠ 0 or `size` ≠ the handle's size (rows
    ///   "map a 2G prefix of a 4G handle", "map 2G of a 4G handle at offset G");
    /// - `CUDA_ERROR_INVALID_VALUE`: the range is not inside one live reservation (row
    ///   "map at a VA that is not reserved") or overlaps a live mapping (row "map over
    ///   a VA that is already mapped").
    pub fn mem_map(&self, ptr: DevicePtr, size: u64, offset: u64, raw: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Map) {
            return code;
        }
        status(Self::map_locked(&mut st, ptr, size, offset, raw))
    }

    fn map_locked(
        st: &mut Inner,
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        raw: u64,
    ) -> Result<(), CuResult> {
        let invalid = Err(CuResult::INVALID_VALUE);
        if size == 0 || !st.is_aligned(ptr) || !st.is_aligned(size) {
            return invalid;
        }
        let Some(end) = ptr.checked_add(size) else {
            return invalid;
        };
        let hsize = match st.handles.get(&raw) {
            Some(h) if h.refs > 0 => h.size,
            _ => return invalid,
        };
        match offset.checked_add(size) {
            Some(e) if e <= hsize => {}
            _ => return invalid,
        }
        if offset != 0 || size != hsize {
            return Err(CuResult::NOT_SUPPORTED);
        }
        match st.reservations.range(..=ptr).next_back() {
            Some((&r, &rsize)) if end <= r.saturating_add(rsize) => {}
            _ => return invalid,
        }
        if let Some((&m, rec)) = st.mappings.range(..end).next_back() {
            if overlaps(m, rec.size, ptr, size) {
                return invalid;
            }
        }
        st.mappings.insert(
            ptr,
            MappingRec {
                size,
                handle: raw,
                access: DeviceSet::default(),
            },
        );
        if let Some(h) = st.handles.get_mut(&raw) {
            h.maps += 1;
        }
        Ok(())
    }

    /// `cuMemSetAccess`: grants read/write access to `[ptr, ptr + size)` for each
    /// device ordinal in `devices` (one descriptor each). The range must be exactly
    /// tiled by whole live mappings (one mapping, or several adjacent ones covered
    /// fully; row "cuMemSetAccess on exactly the mapped range: success"). Granting a
    /// device twice is harmless. Counts as [`DriverCall::SetAccess`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, no device, a device ordinal
    /// `< 0` or `>= device_count` (row "naming a device ordinal that does not exist"),
    /// or a range that is unmapped, partly unmapped or cuts a mapping (row "on an
    /// unmapped range, or on a range that is partly unmapped").
    pub fn mem_set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::SetAccess) {
            return code;
        }
        if size == 0 || devices.is_empty() {
            return CuResult::INVALID_VALUE;
        }
        let count = i64::from(st.config.device_count);
        if devices.iter().any(|&d| d < 0 || i64::from(d) >= count) {
            return CuResult::INVALID_VALUE;
        }
        if !st.exactly_tiled(ptr, size) {
            return CuResult::INVALID_VALUE;
        }
        for (_, m) in st.mappings.range_mut(ptr..ptr + size) {
            for &d in devices {
                m.access.insert(d);
            }
        }
        CuResult::SUCCESS
    }

    /// `cuMemUnmap`: unmaps every whole mapping inside `[ptr, ptr + size)`; their
    /// access grants go with them, and a released handle's physical bytes are freed at
    /// its last unmap. Bytes of the range that are not mapped are ignored (row "unmap
    /// a range that is already unmapped, or whose tail is unmapped: success"); one
    /// call may cover several adjacent mappings (row "one range covering two adjacent
    /// whole mappings: success"). Does not wait for work in flight: overlapping a
    /// range marked busy still succeeds but records [`SimFault::UnmapWhileBusy`], and
    /// one that work queued on a stream still touches ([`SimDriver::launch`])
    /// [`SimFault::UnmapWhileQueued`] (one fault per call). Counts as
    /// [`DriverCall::Unmap`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for size 0, `ptr` or `size` not a multiple
    /// of the granularity (row "unmap with a size that is not a multiple of G"), or a
    /// range that cuts a live mapping (row "unmap part of one mapping").
    pub fn mem_unmap(&self, ptr: DevicePtr, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Unmap) {
            return code;
        }
        if size == 0 || !st.is_aligned(ptr) || !st.is_aligned(size) {
            return CuResult::INVALID_VALUE;
        }
        let Some(end) = ptr.checked_add(size) else {
            return CuResult::INVALID_VALUE;
        };
        // A mapping starting before `ptr` that reaches into the range is cut.
        if let Some((s, _)) = st.mapping_at(ptr) {
            if s != ptr {
                return CuResult::INVALID_VALUE;
            }
        }
        if st
            .mappings
            .range(ptr..end)
            .any(|(&s, m)| s.saturating_add(m.size) > end)
        {
            return CuResult::INVALID_VALUE;
        }
        if st.busy.iter().any(|&(_, b, bs)| overlaps(b, bs, ptr, size)) {
            st.faults.push(SimFault::UnmapWhileBusy { ptr, size });
        } else if let Some(stream) = st.streams.queued_over(ptr, size) {
            st.faults
                .push(SimFault::UnmapWhileQueued { ptr, size, stream });
        }
        while let Some((&s, _)) = st.mappings.range(ptr..end).next() {
            st.remove_mapping(s);
        }
        CuResult::SUCCESS
    }

    /// `cuCtxSynchronize` with `device`'s primary context current: waits for all the
    /// work of that device, which clears its busy marks and completes the work queued
    /// on its streams (and what that work waited on), and no other device's.
    /// Counts as [`DriverCall::Synchronize`].
    ///
    /// Errors: `CUDA_ERROR_INVALID_DEVICE` for an ordinal that is not one of the
    /// simulated devices; `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while any capture is
    /// open (the stream-less one or a stream capture in any mode, begun on any thread,
    /// even with the caller in relaxed mode): every open capture is then invalidated,
    /// busy marks and queued work stay, and a stream capture broken is a
    /// [`SimFault::CaptureBroken`] (rows "cuCtxSynchronize during a global-mode stream
    /// capture" and the paragraph after it, section "Stream capture"). Whether a
    /// capture on another device's stream would break too was not measured; the
    /// simulator says it does.
    pub fn ctx_synchronize(&self, device: i32) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::Synchronize) {
            return code;
        }
        if device < 0 || i64::from(device) >= i64::from(st.config.device_count) {
            return CuResult::INVALID_DEVICE;
        }
        let captures = st.all_captures();
        if !captures.is_empty() {
            let code = CuResult::STREAM_CAPTURE_UNSUPPORTED;
            return st.break_captures("cuCtxSynchronize", &captures, code);
        }
        st.busy.retain(|&(d, _, _)| d != device);
        st.streams.complete_device(device);
        CuResult::SUCCESS
    }

    /// `cuMemGetInfo`: free = capacity − physical bytes held, total = capacity, bytes.
    /// Counts as [`DriverCall::MemGetInfo`]; fails only when injected.
    pub fn mem_get_info(&self) -> Result<MemInfo, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::MemGetInfo) {
            return Err(code);
        }
        let total = st.config.capacity_bytes;
        Ok(MemInfo {
            free: total.saturating_sub(st.physical_bytes),
            total,
        })
    }
}
