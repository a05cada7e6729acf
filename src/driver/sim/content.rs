//! The simulated device's bytes and pinned host memory (issue 15): enough of a
//! content model to check that a tag put to sleep in offload mode wakes with the
//! same bytes, and that a discarded tag does not.
//!
//! - Device bytes belong to a physical handle (as on the real device: two mappings of
//!   one handle alias the same bytes), kept sparsely in pages of [`PAGE`] bytes; a
//!   page never written reads as zeros (the real device's contents are unspecified:
//!   tests must not count on zeros). A handle's bytes are dropped with the handle.
//! - Host buffers ([`SimDriver::mem_host_alloc`]) are kept the same way, so that
//!   offloading a 10 GiB tag costs nothing where nothing was written.
//! - [`SimDriver::write`] and [`SimDriver::read`] stand for a kernel (or a test's
//!   `cuMemcpyHtoD` / `cuMemcpyDtoH`): not driver calls, never counted or injected;
//!   [`SimDriver::memcpy_dtoh`] and [`SimDriver::memcpy_htod`] are the driver calls
//!   the pool makes.

use std::collections::HashMap;

use super::model::Inner;
use super::SimDriver;
use crate::driver::{CuResult, DevicePtr, DriverCall};
use crate::sync::lock;

/// Bytes per page of the sparse content model.
pub(super) const PAGE: u64 = 4096;

/// Sparse bytes: page number -> the page's bytes (absent: zeros).
pub(super) type Pages = HashMap<u64, Box<[u8]>>;

/// One pinned host buffer.
#[derive(Debug, Default)]
pub(super) struct HostRec {
    pub(super) size: u64,
    pub(super) pages: Pages,
}

/// The content model's state, inside the driver's lock.
#[derive(Debug, Default)]
pub(super) struct Content {
    /// Device bytes by raw handle.
    pub(super) device: HashMap<u64, Pages>,
    /// Host buffers by their (simulated) address.
    pub(super) host: HashMap<u64, HostRec>,
    /// The next host address handed out (never reused, never 0).
    pub(super) next_host: u64,
    /// Bytes of live host buffers.
    pub(super) host_bytes: u64,
}

/// Copies `len` bytes of `src` from byte `from` into `dst` at byte `to` (sparse:
/// zeros for pages never written; a page of `dst` that would only get zeros over
/// zeros is not made).
fn copy_pages(src: Option<&Pages>, from: u64, dst: &mut Pages, to: u64, len: u64) {
    let mut done = 0;
    while done < len {
        let (sp, so) = ((from + done) / PAGE, (from + done) % PAGE);
        let (dp, doff) = ((to + done) / PAGE, (to + done) % PAGE);
        let n = (PAGE - so).min(PAGE - doff).min(len - done);
        let (s, d) = (so as usize, doff as usize);
        match src.and_then(|p| p.get(&sp)) {
            Some(page) => {
                let chunk = page[s..s + n as usize].to_vec();
                let target = dst
                    .entry(dp)
                    .or_insert_with(|| vec![0u8; PAGE as usize].into_boxed_slice());
                target[d..d + n as usize].copy_from_slice(&chunk);
            }
            None => {
                if let Some(target) = dst.get_mut(&dp) {
                    target[d..d + n as usize].fill(0);
                }
            }
        }
        done += n;
    }
}

impl Inner {
    /// The checks of a copy between device address `dev` and host buffer `host` at
    /// byte `offset` (`call` counted, its injected failure returned): the device
    /// pieces `(handle, offset, length)` of `size` bytes, or
    /// `CUDA_ERROR_INVALID_VALUE` when a byte is not mapped with access or the host
    /// range is not inside a live buffer.
    fn host_copy(
        &mut self,
        call: DriverCall,
        dev: DevicePtr,
        host: u64,
        offset: u64,
        size: u64,
    ) -> Result<Vec<(u64, u64, u64)>, CuResult> {
        if let Some(code) = self.begin(call) {
            return Err(code);
        }
        let pieces = self.pieces(dev, size).ok_or(CuResult::INVALID_VALUE)?;
        let fits = self
            .content
            .host
            .get(&host)
            .is_some_and(|h| offset.checked_add(size).is_some_and(|e| e <= h.size));
        if fits {
            Ok(pieces)
        } else {
            Err(CuResult::INVALID_VALUE)
        }
    }

    /// The pieces of `[ptr, ptr + size)`: (handle, offset in it, length), when every
    /// byte is mapped with access granted to some device; `None` otherwise.
    fn pieces(&self, ptr: DevicePtr, size: u64) -> Option<Vec<(u64, u64, u64)>> {
        let end = ptr.checked_add(size)?;
        let mut out = Vec::new();
        let mut cursor = ptr;
        while cursor < end {
            let (start, m) = self.mapping_at(cursor)?;
            if m.access.len() == 0 {
                return None;
            }
            let stop = (start + m.size).min(end);
            out.push((m.handle, cursor - start, stop - cursor));
            cursor = stop;
        }
        Some(out)
    }

    /// Drops the bytes of handle `raw` (freed).
    pub(super) fn drop_content(&mut self, raw: u64) {
        self.content.device.remove(&raw);
    }
}

impl SimDriver {
    /// Writes `bytes` at device address `ptr`, as a kernel would. Not a driver call:
    /// not counted, never injected.
    ///
    /// Returns `CUDA_SUCCESS`, or `CUDA_ERROR_INVALID_VALUE` (nothing written) when a
    /// byte of the range is not mapped with access granted.
    pub fn write(&self, ptr: DevicePtr, bytes: &[u8]) -> CuResult {
        let mut st = lock(&self.inner);
        let Some(pieces) = st.pieces(ptr, bytes.len() as u64) else {
            return CuResult::INVALID_VALUE;
        };
        let mut at = 0usize;
        for (handle, offset, len) in pieces {
            let mut src = Pages::new();
            // Stage the slice as pages at offset 0 of a scratch buffer, then copy.
            let chunk = &bytes[at..at + len as usize];
            for (i, c) in chunk.chunks(PAGE as usize).enumerate() {
                let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
                page[..c.len()].copy_from_slice(c);
                src.insert(i as u64, page);
            }
            let dst = st.content.device.entry(handle).or_default();
            copy_pages(Some(&src), 0, dst, offset, len);
            at += len as usize;
        }
        CuResult::SUCCESS
    }

    /// Reads `len` bytes at device address `ptr`, as a kernel would. Not a driver
    /// call. Errors: `CUDA_ERROR_INVALID_VALUE` when a byte of the range is not mapped
    /// with access granted.
    pub fn read(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, CuResult> {
        let st = lock(&self.inner);
        let pieces = st.pieces(ptr, len).ok_or(CuResult::INVALID_VALUE)?;
        let mut out = Vec::with_capacity(len as usize);
        for (handle, offset, n) in pieces {
            let mut staged = Pages::new();
            copy_pages(st.content.device.get(&handle), offset, &mut staged, 0, n);
            for i in 0..n.div_ceil(PAGE) {
                let take = (n - i * PAGE).min(PAGE) as usize;
                match staged.get(&i) {
                    Some(p) => out.extend_from_slice(&p[..take]),
                    None => out.resize(out.len() + take, 0),
                }
            }
        }
        Ok(out)
    }

    /// `cuMemHostAlloc`: `size` bytes of pinned host memory; returns its address (never
    /// 0, never reused). Counts as [`DriverCall::HostAlloc`]. Host memory is not the
    /// device's: it does not count against the capacity.
    ///
    /// Errors: `CUDA_ERROR_INVALID_VALUE` for 0 bytes.
    pub fn mem_host_alloc(&self, size: u64) -> Result<u64, CuResult> {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::HostAlloc) {
            return Err(code);
        }
        if size == 0 {
            return Err(CuResult::INVALID_VALUE);
        }
        st.content.next_host += 1;
        let raw = st.content.next_host << 12;
        st.content.host.insert(
            raw,
            HostRec {
                size,
                pages: Pages::new(),
            },
        );
        st.content.host_bytes += size;
        Ok(raw)
    }

    /// `cuMemFreeHost`. Counts as [`DriverCall::HostFree`]. Errors:
    /// `CUDA_ERROR_INVALID_VALUE` for an address that is not a live host buffer.
    pub fn mem_free_host(&self, raw: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::HostFree) {
            return code;
        }
        match st.content.host.remove(&raw) {
            Some(h) => {
                st.content.host_bytes -= h.size;
                CuResult::SUCCESS
            }
            None => CuResult::INVALID_VALUE,
        }
    }

    /// `cuMemcpyDtoH`: `size` bytes from device address `src` into host buffer `host`
    /// at byte `offset`. Counts as [`DriverCall::MemcpyDtoH`]. Errors:
    /// `CUDA_ERROR_INVALID_VALUE` (nothing copied) when a source byte is not mapped
    /// with access granted, or the host range is not inside a live buffer.
    pub fn memcpy_dtoh(&self, host: u64, offset: u64, src: DevicePtr, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        let pieces = match st.host_copy(DriverCall::MemcpyDtoH, src, host, offset, size) {
            Ok(p) => p,
            Err(code) => return code,
        };
        let Content {
            device,
            host: hosts,
            ..
        } = &mut st.content;
        let Some(h) = hosts.get_mut(&host) else {
            return CuResult::INVALID_VALUE;
        };
        let mut at = offset;
        for (handle, off, len) in pieces {
            copy_pages(device.get(&handle), off, &mut h.pages, at, len);
            at += len;
        }
        CuResult::SUCCESS
    }

    /// `cuMemcpyHtoD`: `size` bytes from host buffer `host` at byte `offset` to device
    /// address `dst`. Counts as [`DriverCall::MemcpyHtoD`]. Errors as
    /// [`SimDriver::memcpy_dtoh`].
    pub fn memcpy_htod(&self, dst: DevicePtr, host: u64, offset: u64, size: u64) -> CuResult {
        let mut st = lock(&self.inner);
        let pieces = match st.host_copy(DriverCall::MemcpyHtoD, dst, host, offset, size) {
            Ok(p) => p,
            Err(code) => return code,
        };
        let Content {
            device,
            host: hosts,
            ..
        } = &mut st.content;
        let Some(h) = hosts.get(&host) else {
            return CuResult::INVALID_VALUE;
        };
        let mut at = offset;
        for (handle, off, len) in pieces {
            copy_pages(
                Some(&h.pages),
                at,
                device.entry(handle).or_default(),
                off,
                len,
            );
            at += len;
        }
        CuResult::SUCCESS
    }

    /// Bytes of pinned host memory allocated and not yet freed (a leak check). Not a
    /// driver call.
    pub fn host_bytes(&self) -> u64 {
        lock(&self.inner).content.host_bytes
    }
}
