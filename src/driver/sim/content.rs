//! The simulated device's bytes and pinned host memory (issue 15): enough of a
//! content model to check that a tag put to sleep in offload mode wakes with the
//! same bytes, that a discarded tag does not, and that a zeroing wake (issue 34)
//! zeroes exactly what the discard dropped.
//!
//! - Device bytes belong to a physical handle (as on the real device: two mappings of
//!   one handle alias the same bytes), kept sparsely in pages of [`PAGE`] bytes. A
//!   byte never written holds [`SIM_STALE_BYTE`](super::SIM_STALE_BYTE), not zero:
//!   new physical memory comes with what an earlier owner left there (NVIDIA
//!   documents no initial contents for `cuMemCreate`), so a test that counts on
//!   zeros it did not write fails here as it could on the GPU. A handle's bytes are
//!   dropped with the handle.
//! - Host buffers ([`SimDriver::mem_host_alloc`]) are kept the same way (a byte never
//!   written reads as 0), so that offloading a 10 GiB tag costs nothing where
//!   nothing was written.
//! - A page is its bytes, or one byte repeated ([`Page::Fill`]: what a memset or a
//!   copy of such a page leaves), so a memset of gigabytes keeps no gigabytes.
//! - [`SimDriver::write`] and [`SimDriver::read`] stand for a kernel (or a test's
//!   `cuMemcpyHtoD` / `cuMemcpyDtoH`): not driver calls, never counted or injected;
//!   [`SimDriver::memcpy_dtoh`], [`SimDriver::memcpy_htod`] and
//!   [`SimDriver::memset_d8_async`] are the driver calls the pool makes.

use std::collections::HashMap;

use super::model::Inner;
use super::{SimDriver, SIM_STALE_BYTE};
use crate::driver::{CuResult, DevicePtr, DriverCall};
use crate::sync::lock;

/// Bytes per page of the sparse content model.
pub(super) const PAGE: u64 = 4096;

/// What a host byte never written reads as.
const HOST_BACKGROUND: u8 = 0;

/// One page of the content model.
#[derive(Clone, Debug)]
pub(super) enum Page {
    /// Its [`PAGE`] bytes.
    Bytes(Box<[u8]>),
    /// [`PAGE`] copies of one byte.
    Fill(u8),
}

/// Sparse bytes: page number -> the page (absent: the store's background byte,
/// [`SIM_STALE_BYTE`] on the device, 0 on the host).
pub(super) type Pages = HashMap<u64, Page>;

/// A run of bytes to write: a slice, or one byte repeated.
#[derive(Clone, Copy)]
enum Src<'a> {
    Bytes(&'a [u8]),
    Fill(u8),
}

/// The `n` bytes at byte `off` of page `page` of `pages` (background `bg`).
fn get(pages: Option<&Pages>, bg: u8, page: u64, off: usize, n: usize) -> Src<'_> {
    match pages.and_then(|p| p.get(&page)) {
        Some(Page::Bytes(b)) => Src::Bytes(&b[off..off + n]),
        Some(Page::Fill(v)) => Src::Fill(*v),
        None => Src::Fill(bg),
    }
}

/// Writes `src` (`n` bytes) at byte `off` of page `page` of `dst` (background
/// `bg`). A whole page of one byte is kept as [`Page::Fill`] (or dropped when it is
/// the background); a partial write makes the page's bytes.
fn put(dst: &mut Pages, bg: u8, page: u64, off: usize, n: usize, src: Src<'_>) {
    if off == 0 && n == PAGE as usize {
        match src {
            Src::Fill(v) if v == bg => {
                dst.remove(&page);
            }
            Src::Fill(v) => {
                dst.insert(page, Page::Fill(v));
            }
            Src::Bytes(b) => {
                dst.insert(page, Page::Bytes(b.into()));
            }
        }
        return;
    }
    let entry = dst.entry(page).or_insert(Page::Fill(bg));
    if let Page::Fill(v) = *entry {
        *entry = Page::Bytes(vec![v; PAGE as usize].into_boxed_slice());
    }
    if let Page::Bytes(b) = entry {
        match src {
            Src::Bytes(s) => b[off..off + n].copy_from_slice(s),
            Src::Fill(v) => b[off..off + n].fill(v),
        }
    }
}

/// Copies `len` bytes of `src` (background `src_bg`) from byte `from` into `dst`
/// (background `dst_bg`) at byte `to`.
fn copy_pages(
    src: Option<&Pages>,
    src_bg: u8,
    from: u64,
    dst: &mut Pages,
    dst_bg: u8,
    to: u64,
    len: u64,
) {
    let mut done = 0;
    while done < len {
        let (sp, so) = ((from + done) / PAGE, (from + done) % PAGE);
        let (dp, doff) = ((to + done) / PAGE, (to + done) % PAGE);
        let n = (PAGE - so).min(PAGE - doff).min(len - done);
        let chunk = get(src, src_bg, sp, so as usize, n as usize);
        put(dst, dst_bg, dp, doff as usize, n as usize, chunk);
        done += n;
    }
}

/// Sets `len` bytes of `dst` (background `bg`) from byte `to` to `value`.
fn fill_pages(dst: &mut Pages, bg: u8, to: u64, len: u64, value: u8) {
    let mut done = 0;
    while done < len {
        let (dp, doff) = ((to + done) / PAGE, (to + done) % PAGE);
        let n = (PAGE - doff).min(len - done);
        put(dst, bg, dp, doff as usize, n as usize, Src::Fill(value));
        done += n;
    }
}

/// Appends `len` bytes of `pages` (background `bg`) from byte `from` to `out`.
fn read_pages(pages: Option<&Pages>, bg: u8, from: u64, len: u64, out: &mut Vec<u8>) {
    let mut done = 0;
    while done < len {
        let (sp, so) = ((from + done) / PAGE, (from + done) % PAGE);
        let n = (PAGE - so).min(len - done);
        match get(pages, bg, sp, so as usize, n as usize) {
            Src::Bytes(b) => out.extend_from_slice(b),
            Src::Fill(v) => out.resize(out.len() + n as usize, v),
        }
        done += n;
    }
}

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
            let dst = st.content.device.entry(handle).or_default();
            let mut done = 0u64;
            while done < len {
                let (dp, doff) = ((offset + done) / PAGE, (offset + done) % PAGE);
                let n = (PAGE - doff).min(len - done) as usize;
                let chunk = &bytes[at..at + n];
                put(dst, SIM_STALE_BYTE, dp, doff as usize, n, Src::Bytes(chunk));
                at += n;
                done += n as u64;
            }
        }
        CuResult::SUCCESS
    }

    /// Reads `len` bytes at device address `ptr`, as a kernel would (a byte never
    /// written reads as [`SIM_STALE_BYTE`]). Not a driver call. Errors: `CUDA_ERROR_INVALID_VALUE` when a byte of the range is not mapped
    /// with access granted.
    pub fn read(&self, ptr: DevicePtr, len: u64) -> Result<Vec<u8>, CuResult> {
        let st = lock(&self.inner);
        let pieces = st.pieces(ptr, len).ok_or(CuResult::INVALID_VALUE)?;
        let mut out = Vec::with_capacity(len as usize);
        for (handle, offset, n) in pieces {
            let pages = st.content.device.get(&handle);
            read_pages(pages, SIM_STALE_BYTE, offset, n, &mut out);
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
            let src = device.get(&handle);
            copy_pages(
                src,
                SIM_STALE_BYTE,
                off,
                &mut h.pages,
                HOST_BACKGROUND,
                at,
                len,
            );
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
            let dst = device.entry(handle).or_default();
            copy_pages(
                Some(&h.pages),
                HOST_BACKGROUND,
                at,
                dst,
                SIM_STALE_BYTE,
                off,
                len,
            );
            at += len;
        }
        CuResult::SUCCESS
    }

    /// `cuMemsetD8Async`: sets `size` bytes from device address `ptr` to `value`,
    /// queued on `stream` as work touching the range (until that work completes, an
    /// unmap of the range is a [`SimFault::UnmapWhileQueued`](super::SimFault), as for
    /// [`SimDriver::launch`]); the model has no timing, so the bytes are set at once.
    /// On a stream being captured it becomes a graph node (counted in the capture):
    /// nothing is queued or written. `stream` 0 (or 1) is the legacy stream of the
    /// calling thread's current device ([`SimDriver::ctx_set_current`]), which stands
    /// for the context the CUDA backend pushes. Counts as
    /// [`DriverCall::MemsetD8Async`].
    ///
    /// Errors (nothing queued or written): `CUDA_ERROR_INVALID_HANDLE` for a stream
    /// that is not live; `CUDA_ERROR_INVALID_VALUE` when a byte of the range is not
    /// mapped with access granted to the stream's device (`docs/vmm-semantics.md`,
    /// "Memset"); `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` on a stream whose capture
    /// is invalidated; `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` on the legacy stream while
    /// a blocking stream of its device is captured (as [`SimDriver::launch`]).
    pub fn memset_d8_async(&self, ptr: DevicePtr, value: u8, size: u64, stream: u64) -> CuResult {
        let mut st = lock(&self.inner);
        if let Some(code) = st.begin(DriverCall::MemsetD8Async) {
            return code;
        }
        match st.launch_locked("cuMemsetD8Async", stream, ptr, size) {
            Err(code) => return code,
            Ok(false) => return CuResult::SUCCESS, // a graph node: nothing runs now
            Ok(true) => {}
        }
        let Some(pieces) = st.pieces(ptr, size) else {
            return CuResult::INVALID_VALUE; // not reached: the launch checked access
        };
        for (handle, off, len) in pieces {
            let dst = st.content.device.entry(handle).or_default();
            fill_pages(dst, SIM_STALE_BYTE, off, len, value);
        }
        CuResult::SUCCESS
    }

    /// Bytes of pinned host memory allocated and not yet freed (a leak check). Not a
    /// driver call.
    pub fn host_bytes(&self) -> u64 {
        lock(&self.inner).content.host_bytes
    }
}
