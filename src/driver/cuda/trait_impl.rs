//! [`Driver`] for [`CudaDriver`]: one driver call per method.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::conversions::{
    capture_mode_of, code, cu_capture_mode, cu_event, cu_stream, resolved_by_current_context,
    to_usize,
};
use super::CudaDriver;
use crate::driver::{
    check, CaptureMode, CuResult, DevicePtr, Driver, DriverCall, DriverError, Event, HostBuffer,
    MemInfo, PhysicalHandle, Reservation, Stream,
};

impl Driver for CudaDriver {
    /// Allocation granularity, bytes: queried once in [`CudaDriver::new`]
    /// (`cuMemGetAllocationGranularity`, RECOMMENDED, with the property
    /// [`Driver::create`] uses) and cached, so this makes no driver call and cannot
    /// fail. 2 MiB (2097152) on an H200.
    fn granularity(&self) -> Result<u64, DriverError> {
        Ok(self.granularity)
    }

    /// `cuMemCreate(size, prop, 0)`: pinned device memory on this device, `size` bytes.
    /// About 8 µs at 2 MiB and 64 MiB, 54 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Create`]: `CUDA_ERROR_INVALID_VALUE` for 0 or a size that is not
    /// a multiple of the granularity, `CUDA_ERROR_OUT_OF_MEMORY` when the device is
    /// full; a failed context push is reported with its own code.
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::Create, c))?;
        let mut raw: sys::CUmemGenericAllocationHandle = 0;
        self.in_context(DriverCall::Create, || {
            // SAFETY: `raw` is a valid out-pointer, `prop` a fully initialised
            // property that outlives the call.
            code(unsafe { sys::cuMemCreate(&mut raw, bytes, &self.prop, 0) })
        })?;
        Ok(PhysicalHandle { raw, size })
    }

    /// `cuMemRelease(handle)`. A handle still mapped stays usable and is freed at its
    /// last unmap. About 9 µs at 2 MiB, 25 µs at 64 MiB, 412 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Release`]: `CUDA_ERROR_INVALID_VALUE` for a handle already
    /// released.
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        self.in_context(DriverCall::Release, || {
            // SAFETY: the driver validates the handle value.
            code(unsafe { sys::cuMemRelease(handle.raw) })
        })
    }

    /// `cuMemAddressReserve(size, alignment = granularity, addr = 0, flags = 0)`.
    /// About 0.4 µs at 2 MiB, 4.6 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Reserve`]: `CUDA_ERROR_INVALID_VALUE` for 0 or a size that is not
    /// a multiple of the granularity; `CUDA_ERROR_OUT_OF_MEMORY` when the address
    /// space is exhausted.
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        let err = |c| DriverError::new(DriverCall::Reserve, c);
        let bytes = to_usize(size).map_err(err)?;
        let alignment = to_usize(self.granularity).map_err(err)?;
        let mut ptr: sys::CUdeviceptr = 0;
        self.in_context(DriverCall::Reserve, || {
            // SAFETY: `ptr` is a valid out-pointer; no fixed address is requested.
            code(unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, alignment, 0, 0) })
        })?;
        Ok(Reservation { ptr, size })
    }

    /// `cuMemAddressFree(ptr, size)` of the whole reservation. About 0.4 µs at 2 MiB,
    /// 6.8 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::FreeReservation`]: `CUDA_ERROR_INVALID_VALUE` while a mapping
    /// inside it is live, for part of a reservation, or for one already freed.
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        let bytes = to_usize(reservation.size)
            .map_err(|c| DriverError::new(DriverCall::FreeReservation, c))?;
        self.in_context(DriverCall::FreeReservation, || {
            // SAFETY: the driver validates the range against its reservations.
            code(unsafe { sys::cuMemAddressFree(reservation.ptr, bytes) })
        })
    }

    /// `cuMemMap(ptr, handle.size, 0, handle.raw, 0)`: always the whole handle. About
    /// 0.6 µs at 2 MiB and 64 MiB, 2.1 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Map`]: `CUDA_ERROR_INVALID_VALUE` for an address that is not
    /// reserved, not granularity-aligned, or overlaps a live mapping.
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        let bytes = to_usize(handle.size).map_err(|c| DriverError::new(DriverCall::Map, c))?;
        self.in_context(DriverCall::Map, || {
            // SAFETY: the driver validates the range and the handle.
            code(unsafe { sys::cuMemMap(ptr, bytes, 0, handle.raw, 0) })
        })
    }

    /// `cuMemSetAccess(ptr, size, descs)` with one read/write descriptor per device
    /// ordinal in `devices` (location type DEVICE). The most expensive step of a fresh
    /// mapping: about 20 µs at 2 MiB, 33 µs at 64 MiB, 77 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::SetAccess`]: `CUDA_ERROR_INVALID_VALUE` for a range that is not
    /// exactly mapped, a device ordinal that does not exist, or an empty `devices`.
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::SetAccess, c))?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&id| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        self.in_context(DriverCall::SetAccess, || {
            // SAFETY: `descs` holds `descs.len()` initialised descriptors and outlives
            // the call; the driver validates the range.
            code(unsafe { sys::cuMemSetAccess(ptr, bytes, descs.as_ptr(), descs.len()) })
        })
    }

    /// `cuMemUnmap(ptr, size)`. Does not wait for work in flight (measured: it returns
    /// while a kernel still reads the range, and the kernel then faults): synchronize
    /// first. About 14 µs at 2 MiB, 37.5 µs at 1 GiB (H200).
    ///
    /// # Errors
    ///
    /// [`DriverCall::Unmap`]: `CUDA_ERROR_INVALID_VALUE` for part of a mapping or a
    /// size that is not a multiple of the granularity.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::Unmap, c))?;
        self.in_context(DriverCall::Unmap, || {
            // SAFETY: the driver validates the range.
            code(unsafe { sys::cuMemUnmap(ptr, bytes) })
        })
    }

    /// `cuMemHostAlloc(size, flags 0)`: pinned host memory, with the pool's context
    /// current (pinned memory is registered with the current context).
    ///
    /// # Errors
    ///
    /// [`DriverCall::HostAlloc`]: `CUDA_ERROR_OUT_OF_MEMORY` when the host cannot pin
    /// that much, `CUDA_ERROR_INVALID_VALUE` for 0 bytes.
    fn host_alloc(&self, size: u64) -> Result<HostBuffer, DriverError> {
        let bytes = to_usize(size).map_err(|c| DriverError::new(DriverCall::HostAlloc, c))?;
        let mut host: *mut c_void = ptr::null_mut();
        self.in_context(DriverCall::HostAlloc, || {
            // SAFETY: `host` is a valid out-pointer; the driver allocates `bytes`.
            code(unsafe { sys::cuMemHostAlloc(&mut host, bytes, 0) })
        })?;
        Ok(HostBuffer {
            raw: host as usize as u64,
            size,
        })
    }

    /// `cuMemFreeHost` of memory from [`CudaDriver::host_alloc`].
    ///
    /// # Errors
    ///
    /// [`DriverCall::HostFree`]: `CUDA_ERROR_INVALID_VALUE` for an address that is not
    /// live pinned memory.
    fn host_free(&self, buffer: HostBuffer) -> Result<(), DriverError> {
        let host = buffer.raw as usize as *mut c_void;
        self.in_context(DriverCall::HostFree, || {
            // SAFETY: the driver validates the address; the pool passes only buffers
            // it got from `host_alloc` and frees each once.
            code(unsafe { sys::cuMemFreeHost(host) })
        })
    }

    /// `cuMemcpyDtoH_v2` into pinned `dst` at `offset` (synchronous).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemcpyDtoH`]: `CUDA_ERROR_INVALID_VALUE` when the range is
    /// outside `dst` (no call is made) or the source is not mapped with access.
    fn copy_to_host(
        &self,
        dst: HostBuffer,
        offset: u64,
        src: DevicePtr,
        size: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::MemcpyDtoH, c);
        if offset.checked_add(size).is_none_or(|e| e > dst.size) {
            return Err(err(CuResult::INVALID_VALUE));
        }
        let n = to_usize(size).map_err(err)?;
        let off = to_usize(offset).map_err(err)?;
        let host = (dst.raw as usize).wrapping_add(off) as *mut c_void;
        self.in_context(DriverCall::MemcpyDtoH, || {
            // SAFETY: `[host, host + n)` lies inside the pinned buffer `dst` (checked
            // above), which the pool owns and nothing else touches; the copy is
            // synchronous, so the driver does not touch it after the call.
            code(unsafe { sys::cuMemcpyDtoH_v2(host, src, n) })
        })
    }

    /// `cuMemcpyHtoD_v2` from pinned `src` at `offset` (synchronous).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemcpyHtoD`]: as [`CudaDriver::copy_to_host`].
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: HostBuffer,
        offset: u64,
        size: u64,
    ) -> Result<(), DriverError> {
        let err = |c| DriverError::new(DriverCall::MemcpyHtoD, c);
        if offset.checked_add(size).is_none_or(|e| e > src.size) {
            return Err(err(CuResult::INVALID_VALUE));
        }
        let n = to_usize(size).map_err(err)?;
        let off = to_usize(offset).map_err(err)?;
        let host = (src.raw as usize).wrapping_add(off) as *const c_void;
        self.in_context(DriverCall::MemcpyHtoD, || {
            // SAFETY: `[host, host + n)` lies inside the pinned buffer `src` (checked
            // above), readable and untouched by anything else during the copy; the
            // destination is the pool's own mapping of a sleeping tag being woken,
            // which no caller can reach until the wake returns.
            code(unsafe { sys::cuMemcpyHtoD_v2(dst, host, n) })
        })
    }

    /// `cuMemsetD8Async(ptr, value, size, stream)` with the pool's context pushed (a
    /// special stream handle then names this device's stream; the memset is queued
    /// and the call returns before it runs).
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemsetD8Async`]: `CUDA_ERROR_INVALID_VALUE` for a range that is
    /// not mapped with access (`docs/vmm-semantics.md`, "Memset") or a size that does
    /// not fit a `size_t` (no call is made); `CUDA_ERROR_INVALID_HANDLE` for a stream
    /// of another context; a sticky fault of earlier work; a failed context push with
    /// its own code.
    fn memset_async(
        &self,
        ptr: DevicePtr,
        value: u8,
        size: u64,
        stream: Stream,
    ) -> Result<(), DriverError> {
        let n = to_usize(size).map_err(|c| DriverError::new(DriverCall::MemsetD8Async, c))?;
        let s = cu_stream(stream);
        self.in_context(DriverCall::MemsetD8Async, || {
            // SAFETY: no Rust memory is passed: the driver validates the device range
            // and the stream handle (a stream of this device or a special handle, by
            // the trait's contract); the context is current.
            code(unsafe { sys::cuMemsetD8Async(ptr, value, n, s) })
        })
    }

    /// `cuCtxSynchronize` with `device`'s primary context current (this driver's
    /// device, or a peer given to [`CudaDriver::with_peers`]): waits for all that
    /// device's work.
    ///
    /// # Errors
    ///
    /// [`DriverCall::Synchronize`]: `CUDA_ERROR_INVALID_DEVICE` for a device that is
    /// neither this driver's nor one of its peers (no call is made);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while any stream is being captured
    /// (and the capture is invalidated); a sticky fault of earlier work
    /// (`CUDA_ERROR_ILLEGAL_ADDRESS`, ...).
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        let context = if device == self.device {
            self.context
        } else {
            match self.peers.iter().find(|&&(p, _, _)| p == device) {
                Some(&(_, _, c)) => c,
                None => {
                    return Err(DriverError::new(
                        DriverCall::Synchronize,
                        CuResult::INVALID_DEVICE,
                    ))
                }
            }
        };
        self.with_context_of(context, || {
            // SAFETY: no arguments; the device's context is current.
            code(unsafe { sys::cuCtxSynchronize() })
        })
        .map_err(|(_, c)| DriverError::new(DriverCall::Synchronize, c))
    }

    /// `cuMemGetInfo_v2`: free and total bytes of this device.
    ///
    /// # Errors
    ///
    /// [`DriverCall::MemGetInfo`] with the driver's code (a lost context, say).
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        let mut free: usize = 0;
        let mut total: usize = 0;
        self.in_context(DriverCall::MemGetInfo, || {
            // SAFETY: `free` and `total` are valid out-pointers.
            code(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    // ---- stream order (issue 11). Each method is one driver call and allocates
    // nothing. The pool's context is pushed only where the call needs a current
    // context: creating an event or a stream (they belong to the current context),
    // recording an event, and a call given a special stream handle (`0`,
    // `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`, which name the current context's
    // stream). Event and created-stream handles carry their context, and the capture
    // mode is per thread, so the other calls make no push.

    /// `cuEventCreate(CU_EVENT_DISABLE_TIMING)` in this device's primary context (the
    /// context pushed around the call). No timing: recording and querying such an
    /// event is the cheapest fence the driver has.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventCreate`] with the driver's code (`CUDA_ERROR_OUT_OF_MEMORY`
    /// when the driver cannot allocate the event); a failed context push with its
    /// own code.
    fn event_create(&self) -> Result<Event, DriverError> {
        let mut event: sys::CUevent = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        self.in_context(DriverCall::EventCreate, || {
            // SAFETY: `event` is a valid out-pointer for the call; the context is
            // current (pushed by `in_context`).
            code(unsafe { sys::cuEventCreate(&mut event, flags) })
        })?;
        Ok(event as usize as u64)
    }

    /// `cuEventDestroy_v2(event)`; no context push (the handle names its context).
    /// An event whose recorded work has not completed yet is destroyed once it
    /// completes (documented by NVIDIA); the call does not wait.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventDestroy`]: `CUDA_ERROR_INVALID_HANDLE` or
    /// `CUDA_ERROR_INVALID_VALUE` for a value the driver does not know as an event.
    fn event_destroy(&self, event: Event) -> Result<(), DriverError> {
        // SAFETY: `event` is an event handle made by `event_create` on this driver and
        // not destroyed before (the pool passes no other value; the trait's
        // contract). The call takes no pointer to Rust memory.
        check(
            DriverCall::EventDestroy,
            code(unsafe { sys::cuEventDestroy_v2(cu_event(event)) }),
        )
    }

    /// `cuEventRecord(event, stream)` with the pool's context pushed: a special stream
    /// handle then names this device's stream, and the event (made in this context)
    /// and the stream must belong to the same context (`CUDA_ERROR_INVALID_HANDLE`
    /// otherwise, documented by NVIDIA). Legal during any capture (measured on the
    /// H200, `docs/vmm-semantics.md`); on a stream being captured it becomes a graph
    /// node instead, so the pool does not record a fence there. Not on a hot path:
    /// the pool records lazily, once per stream per release point.
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventRecord`]: `CUDA_ERROR_INVALID_HANDLE` for an event or stream
    /// of another context; a sticky fault of earlier work (`CUDA_ERROR_ILLEGAL_ADDRESS`,
    /// ...); a failed context push with its own code.
    fn event_record(&self, event: Event, stream: Stream) -> Result<(), DriverError> {
        let (e, s) = (cu_event(event), cu_stream(stream));
        self.in_context(DriverCall::EventRecord, || {
            // SAFETY: `event` came from `event_create` on this driver and `stream` is a
            // stream handle of this device or a special handle (the pool's and the
            // caller's contract); the context is current. No Rust memory is passed.
            code(unsafe { sys::cuEventRecord(e, s) })
        })
    }

    /// `cuEventQuery(event)`, no context push: `CUDA_SUCCESS` is `Ok(true)` (the work
    /// the event covers has completed, or it was never recorded),
    /// `CUDA_ERROR_NOT_READY` is `Ok(false)`. Called by the pool with the thread in
    /// relaxed capture mode: in global mode it would invalidate a capture open on any
    /// stream (measured on the H200, `docs/vmm-semantics.md`).
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventQuery`] with any other code: `CUDA_ERROR_INVALID_HANDLE`,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (queried in global mode during a
    /// capture), a sticky fault of the work it covers.
    fn event_query(&self, event: Event) -> Result<bool, DriverError> {
        // SAFETY: `event` came from `event_create` on this driver (the pool's
        // contract); no Rust memory is passed.
        match unsafe { sys::cuEventQuery(cu_event(event)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => Err(DriverError::new(DriverCall::EventQuery, code(other))),
        }
    }

    /// `cuEventSynchronize(event)`, no context push: blocks the calling thread until
    /// the work the event covers has completed (at once for an event never
    /// recorded). Called in relaxed capture mode, as [`Driver::event_query`].
    ///
    /// # Errors
    ///
    /// [`DriverCall::EventSynchronize`] with the driver's code:
    /// `CUDA_ERROR_INVALID_HANDLE`, `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` in global
    /// mode during a capture, a sticky fault of the work it covers.
    fn event_synchronize(&self, event: Event) -> Result<(), DriverError> {
        // SAFETY: `event` came from `event_create` on this driver (the pool's
        // contract); no Rust memory is passed.
        check(
            DriverCall::EventSynchronize,
            code(unsafe { sys::cuEventSynchronize(cu_event(event)) }),
        )
    }

    /// `cuStreamWaitEvent(stream, event, 0)`: later work on `stream` waits on the
    /// device for the work `event` covers; the host does not wait. The event may
    /// belong to another context (documented by NVIDIA). The pool's context is pushed
    /// only for a special stream handle. Legal during any capture (measured on the
    /// H200); on a stream being captured it adds a dependency to the graph.
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamWaitEvent`]: `CUDA_ERROR_INVALID_HANDLE` for an unknown
    /// stream or event; a failed context push with its own code.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), DriverError> {
        let (s, e) = (cu_stream(stream), cu_event(event));
        self.in_context_if(
            resolved_by_current_context(stream),
            DriverCall::StreamWaitEvent,
            || {
                // SAFETY: `stream` is a stream of this device or a special handle
                // (with the context current), `event` came from `event_create` (the
                // pool's and the caller's contract); flags 0 is the default wait. No
                // Rust memory is passed.
                code(unsafe { sys::cuStreamWaitEvent(s, e, 0) })
            },
        )
    }

    /// `cuStreamGetCaptureInfo_v3` (or `_v2` on a driver older than CUDA 12.3, see
    /// [`CAPTURE_INFO_SYMBOLS`]), asking for the status and the capture id only:
    /// `Some(id)` while `stream` is being captured (status active or invalidated),
    /// `None` when not. The id is unique over the process's lifetime (documented by
    /// NVIDIA); CUDA documents it as valid only while the capture is active, so for an
    /// invalidated capture it is whatever the driver wrote (0 if it wrote nothing).
    /// Legal during any capture, from any thread (measured on the H200). The pool's
    /// context is pushed only for a special stream handle.
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamGetCaptureInfo`]: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` for
    /// the legacy stream while a blocking stream of the context is being captured
    /// (documented by NVIDIA); `CUDA_ERROR_INVALID_HANDLE`; a failed context push
    /// with its own code.
    ///
    /// [`CAPTURE_INFO_SYMBOLS`]: crate::driver::cuda::CAPTURE_INFO_SYMBOLS
    fn stream_capture(&self, stream: Stream) -> Result<Option<u64>, DriverError> {
        let s = cu_stream(stream);
        // Read as plain integers: the driver writes a `CUstreamCaptureStatus` and a
        // `cuuint64_t`; a `u32` holds any status value, even one this crate's
        // bindings do not name.
        let mut status: u32 = 0;
        let mut id: u64 = 0;
        let status_out = ptr::from_mut(&mut status).cast::<sys::CUstreamCaptureStatus>();
        let id_out = ptr::from_mut(&mut id);
        let v3 = self.capture_info_v3;
        self.in_context_if(
            resolved_by_current_context(stream),
            DriverCall::StreamGetCaptureInfo,
            || {
                // SAFETY: `status_out` and `id_out` point to live, writable locals of
                // the sizes the driver writes (`CUstreamCaptureStatus` is a 32-bit
                // enum); every other out-pointer is NULL, which the driver documents
                // as "not requested". `new` checked that the symbol called is
                // exported. `stream` is a stream of this device or a special handle
                // (with the context current).
                code(unsafe {
                    if v3 {
                        sys::cuStreamGetCaptureInfo_v3(
                            s,
                            status_out,
                            id_out,
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                        )
                    } else {
                        sys::cuStreamGetCaptureInfo_v2(
                            s,
                            status_out,
                            id_out,
                            ptr::null_mut(),
                            ptr::null_mut(),
                            ptr::null_mut(),
                        )
                    }
                })
            },
        )?;
        let none = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32;
        Ok((status != none).then_some(id))
    }

    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture mode to
    /// `mode` and returns the one it had (per thread; no context push). Cheap: it
    /// touches only thread-local driver state.
    ///
    /// # Errors
    ///
    /// [`DriverCall::ThreadExchangeCaptureMode`] with the driver's code; with
    /// `CUDA_ERROR_UNKNOWN` if the driver reports a previous mode CUDA does not
    /// define, after putting that mode back (the thread is left as it was).
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        let call = DriverCall::ThreadExchangeCaptureMode;
        let mut raw: u32 = cu_capture_mode(mode) as u32;
        let exchange = |raw: &mut u32| {
            // SAFETY: `raw` is a live, writable 32-bit value holding a valid
            // `CUstreamCaptureMode` on the way in (the driver reads it and writes
            // the previous mode back); `CUstreamCaptureMode` is a 32-bit enum.
            code(unsafe {
                sys::cuThreadExchangeStreamCaptureMode(
                    ptr::from_mut(raw).cast::<sys::CUstreamCaptureMode>(),
                )
            })
        };
        check(call, exchange(&mut raw))?;
        match capture_mode_of(raw) {
            Some(previous) => Ok(previous),
            None => {
                let _ = exchange(&mut raw);
                Err(DriverError::new(call, CuResult::UNKNOWN))
            }
        }
    }

    /// `cuStreamCreate(CU_STREAM_DEFAULT)` in this device's primary context (pushed
    /// around the call): a blocking stream, whose work is ordered after earlier work
    /// on the legacy stream (documented by NVIDIA).
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamCreate`] with the driver's code
    /// (`CUDA_ERROR_OUT_OF_MEMORY`); a failed context push with its own code.
    fn stream_create_blocking(&self) -> Result<Stream, DriverError> {
        let mut stream: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_DEFAULT as u32;
        self.in_context(DriverCall::StreamCreate, || {
            // SAFETY: `stream` is a valid out-pointer for the call; the context is
            // current (pushed by `in_context`).
            code(unsafe { sys::cuStreamCreate(&mut stream, flags) })
        })?;
        Ok(Stream(stream as usize as u64))
    }

    /// `cuStreamDestroy_v2(stream)`, no context push (the handle names its context).
    /// Work still queued on it completes first; the call does not wait (documented
    /// by NVIDIA).
    ///
    /// # Errors
    ///
    /// [`DriverCall::StreamDestroy`]: `CUDA_ERROR_INVALID_HANDLE` for a handle the
    /// driver does not know as a stream.
    fn stream_destroy(&self, stream: Stream) -> Result<(), DriverError> {
        // SAFETY: `stream` was made by `stream_create_blocking` on this driver and not
        // destroyed before (the pool's contract); no Rust memory is passed.
        check(
            DriverCall::StreamDestroy,
            code(unsafe { sys::cuStreamDestroy_v2(cu_stream(stream)) }),
        )
    }
}
