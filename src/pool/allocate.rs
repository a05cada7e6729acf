//! The synchronous allocation front: a request rounded (to the granularity, or to
//! 512 bytes for a block), then the calling thread's cache, the books, the other
//! caches, memory freed on streams, and a miss; the guards it hands out.

use crate::driver::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::pool::books::{State, ANY, SYNC_FREED};
use crate::pool::{cache, Allocation, Pool, ReusePolicy};
use crate::sync::lock;

impl Pool {
    /// Rounds `bytes` up to the granularity; `None` on overflow.
    fn round(&self, bytes: u64) -> Option<u64> {
        let g = self.granularity;
        // A power of two (checked at creation): a mask, not a division.
        bytes.checked_add(g - 1).map(|b| b & !(g - 1))
    }

    pub(super) fn max_fit(&self, rounded: u64) -> u64 {
        max_fit(rounded, self.max_waste_percent)
    }

    /// Allocates `bytes` of device memory; returns a guard that frees it on drop.
    /// See [`Pool::allocate_raw`] for the rules and errors.
    pub fn allocate(&self, bytes: u64) -> Result<Allocation<'_>> {
        let (ptr, key) = self.allocate_sync(bytes)?;
        Ok(match key {
            Some(id) => Allocation {
                pool: self,
                ptr,
                bytes,
                id,
                stream: None,
            },
            None => self.guard(ptr, bytes, None),
        })
    }

    /// Allocates `bytes` of device memory and returns its device address, aligned to
    /// the granularity (in [`ReusePolicy::Segments`], a block's address, aligned to
    /// 512 bytes). The caller frees it with [`Pool::free_raw`].
    ///
    /// In [`ReusePolicy::Segments`] (up to `segment_whole_threshold_bytes`) the size
    /// is rounded up to 512 bytes and carved from the synchronous API's heap, which
    /// grows by whole handles (`docs/ARCHITECTURE.md`, "Segments"); otherwise: the
    /// size is rounded up to the granularity. An idle mapping that fits under the
    /// reuse policy is taken with no driver call (memory freed with [`Pool::free_raw`]
    /// first, then memory freed on a stream whose work is known complete); otherwise,
    /// when memory freed on streams would fit, their fences are polled
    /// (`cuEventQuery`, per [`CrossStreamReuse`]); otherwise a new mapping is created
    /// (create, reserve, map, set access for the device and every peer), and a failed
    /// step undoes the earlier ones in reverse. A pool used only through the
    /// synchronous functions makes no stream or event call.
    ///
    /// Errors: [`Error::InvalidArgument`] for 0 bytes or a size whose rounding
    /// overflows; [`Error::RequestTooLarge`] when the rounded size is above the
    /// device's total memory (at once: no driver call, nothing counted);
    /// [`Error::OutOfMemory`] when the device is full (outside a scope,
    /// after releasing idle mappings and retrying once; inside one, with nothing
    /// retained released); [`Error::Driver`] for any other failed driver call;
    /// [`Error::TagState`] while tag 0 (the untagged functions' tag) is asleep or a
    /// sleep or wake of it runs (nothing done: the allocation runs wholly before or
    /// wholly after each of them).
    ///
    /// [`CrossStreamReuse`]: crate::pool::CrossStreamReuse
    pub fn allocate_raw(&self, bytes: u64) -> Result<DevicePtr> {
        self.allocate_sync(bytes).map(|(ptr, _)| ptr)
    }

    /// [`Pool::allocate_raw`]; with the guard's key when a thread cache served it.
    fn allocate_sync(&self, bytes: u64) -> Result<(DevicePtr, Option<u64>)> {
        let _order = self.record_order();
        self.record_call_start();
        let r = self.allocate_sync_inner(bytes);
        self.history_alloc(&r, |(p, _)| *p, bytes, 0, None);
        match &r {
            Ok((ptr, _)) => {
                if let Some(rec) = &self.rec {
                    rec.alloc(*ptr, bytes, 0, None);
                }
            }
            Err(e) => self.record_failed(e, bytes, 0, None),
        }
        r
    }

    /// [`Pool::allocate_sync`], not recorded.
    fn allocate_sync_inner(&self, bytes: u64) -> Result<(DevicePtr, Option<u64>)> {
        let block = self.checked_request(bytes)?;
        let want = self.want(bytes, block)?;
        // A cache hit checks tag 0's gate under the cache's mutex (`tag_gate.rs`).
        if self.caches.may_hold() {
            if let Some((ptr, key)) = self.caches.pop(&want, &self.state, &self.gate, &self.clock) {
                return Ok((ptr, Some(key)));
            }
        }
        let entry = self.enter_untagged()?;
        let r = self.allocate_sync_books(bytes, block);
        self.leave(entry);
        r
    }

    /// [`Pool::allocate_sync_inner`] in the books (tag 0 entered).
    fn allocate_sync_books(
        &self,
        bytes: u64,
        block: Option<u64>,
    ) -> Result<(DevicePtr, Option<u64>)> {
        let ptr = match block {
            Some(size) => self.allocate_block_sync(size, bytes)?,
            None => self.allocate_whole_sync(bytes)?,
        };
        // Served by the books: live through this thread's cache from now on, so
        // that it comes back here whichever thread frees it.
        if self.caches.may_hold() {
            if let Some(key) = self.caches.adopt_live(ptr, &self.state) {
                return Ok((ptr, Some(key)));
            }
        }
        Ok((ptr, None))
    }

    /// What a synchronous request of `bytes` asks of a thread cache (`block`: its
    /// block size in segment mode).
    pub(super) fn want(&self, bytes: u64, block: Option<u64>) -> Result<cache::Want> {
        Ok(match block {
            Some(size) => cache::Want {
                block: true,
                rounded: size,
                waste_percent: None,
                requested: bytes,
            },
            None => cache::Want {
                block: false,
                rounded: self.rounded(bytes)?,
                waste_percent: (self.policy != ReusePolicy::Exact)
                    .then_some(self.max_waste_percent),
                requested: bytes,
            },
        })
    }

    /// A whole mapping for the synchronous `allocate`: the books, this thread's
    /// cache given back to them, memory freed on streams, a new mapping.
    fn allocate_whole_sync(&self, bytes: u64) -> Result<DevicePtr> {
        let (rounded, max_size) = self.sizes(bytes)?;
        if let Some(ptr) = self.take_for(&mut lock(&self.state), None, rounded, bytes, max_size) {
            return Ok(ptr);
        }
        if let Some(ptr) = self.refill_from_caches(&self.want(bytes, None)?, |st| {
            self.take_for(st, None, rounded, bytes, max_size)
        }) {
            return Ok(ptr);
        }
        if let Some(p) = self.take_cross_stream(None, None, rounded, bytes, max_size) {
            return Ok(p);
        }
        self.allocate_miss(bytes, rounded, max_size, None)
    }

    /// Before a miss of the synchronous `allocate` (a request `want`): the calling
    /// thread's cache back to the books, then `retake` under the lock; then what
    /// every other cache holds that fits `want`, and `retake` again. A cache never
    /// makes the pool create memory of a size that one holds idle.
    pub(super) fn refill_from_caches(
        &self,
        want: &cache::Want,
        retake: impl FnMut(&mut State) -> Option<DevicePtr>,
    ) -> Option<DevicePtr> {
        if !self.caches.enabled {
            return None;
        }
        self.caches.drain_own(want, &self.state, retake)
    }

    /// The rounded size of a request of `bytes`, and the largest mapping the policy
    /// takes for it.
    pub(super) fn sizes(&self, bytes: u64) -> Result<(u64, u64)> {
        let rounded = self.rounded(bytes)?;
        Ok((rounded, self.max_fit(rounded)))
    }

    /// The rounded size of a request of `bytes`.
    pub(super) fn rounded(&self, bytes: u64) -> Result<u64> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        self.round(bytes).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "allocation of {bytes} bytes overflows when rounded to the granularity"
            ))
        })
    }

    /// Takes an idle mapping for the caller: on `stream` (with its capture), or,
    /// with `None`, for the synchronous API ([`SYNC_FREED`], then [`ANY`]).
    pub(super) fn take_for(
        &self,
        st: &mut State,
        on: Option<(Stream, Option<u64>)>,
        rounded: u64,
        bytes: u64,
        max_size: u64,
    ) -> Option<DevicePtr> {
        match on {
            Some((s, capture)) => self.take_for_stream(st, s, capture, rounded, bytes, max_size),
            None => st
                .take_idle(SYNC_FREED, rounded, bytes, self.policy, max_size)
                .or_else(|| st.take_idle(ANY, rounded, bytes, self.policy, max_size)),
        }
    }

    /// Allocates `bytes` on `stream` (stream-ordered, like `cuMemAllocAsync`);
    /// returns a guard that frees it on the same stream ([`Pool::free_async_raw`])
    /// when dropped. See [`Pool::allocate_async_raw`] for the rules and errors.
    pub fn allocate_async(&self, bytes: u64, stream: Stream) -> Result<Allocation<'_>> {
        let ptr = self.allocate_async_raw(bytes, stream)?;
        Ok(self.guard(ptr, bytes, Some(stream)))
    }

    /// The guard of live `ptr` (`bytes` asked), freeing on `stream` if any.
    pub(super) fn guard(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        stream: Option<Stream>,
    ) -> Allocation<'_> {
        Allocation {
            pool: self,
            ptr,
            bytes,
            id: self.alloc_id_of(ptr),
            stream,
        }
    }

    /// A stream call on `ptr` finds it in the books: when a thread cache handed it
    /// out, the caches are settled first (rare: memory from the synchronous
    /// `allocate` freed or recorded on a stream).
    pub(super) fn settle_if_cached(&self, ptr: DevicePtr) {
        if self.caches.key_of(ptr).is_some() {
            self.caches.settle(&self.state);
        }
    }

    /// The allocation id of live `ptr` (0 if not live).
    fn alloc_id_of(&self, ptr: DevicePtr) -> u64 {
        if let Some(key) = self.caches.key_of(ptr) {
            return key;
        }
        let st = lock(&self.state);
        st.live
            .get(&ptr)
            .map_or(0, |&slot| st.mapping(slot).alloc_id)
    }
}

/// The largest mapping size best-fit takes for a request of `rounded` bytes with a
/// waste bound of `percent` (of `rounded`): saturates at `u64::MAX`, so a larger
/// percent never gives a smaller bound.
pub(super) fn max_fit(rounded: u64, percent: u64) -> u64 {
    // floor(rounded * percent / 100) in u64: with rounded = 100 q + r it is
    // q * percent + floor(r * percent / 100), saturating. (A u128 division here
    // made valgrind report a conditional jump on uninitialised bits inside
    // compiler-builtins' `__udivti3`, a false positive that failed the C tests
    // under valgrind.) `percent` comes from a u32, so `r * percent` cannot overflow.
    let (q, r) = (rounded / 100, rounded % 100);
    let waste = q
        .checked_mul(percent)
        .and_then(|w| w.checked_add(r.saturating_mul(percent) / 100))
        .unwrap_or(u64::MAX);
    rounded.saturating_add(waste)
}

#[cfg(test)]
mod tests {
    use super::max_fit;

    /// The bound grows with the percent and never wraps: a larger percent never gives
    /// a smaller bound (issue 9: a waste percent near `u32::MAX` wrapped the
    /// product), and it is never below the request.
    #[test]
    fn best_fit_bound_saturates() {
        let percents = [
            0u64,
            1,
            30,
            100,
            1000,
            1 << 20,
            u64::from(u32::MAX) / 2,
            u64::from(u32::MAX),
        ];
        for rounded in [
            2u64 << 20,
            1 << 40,
            1 << 57,
            1 << 62,
            u64::MAX - (2 << 20) + 1,
        ] {
            let mut last = rounded;
            for p in percents {
                let b = max_fit(rounded, p);
                assert!(
                    b >= last,
                    "rounded {rounded}: percent {p} gives {b} < {last}"
                );
                last = b;
            }
            assert_eq!(max_fit(rounded, 0), rounded);
            // 100 % of 2^62 is 2^63; u32::MAX % of it exceeds u64::MAX.
            if rounded == 1 << 62 {
                assert_eq!(max_fit(rounded, 100), 1 << 63);
                assert_eq!(max_fit(rounded, u64::from(u32::MAX)), u64::MAX);
            }
        }
        assert_eq!(max_fit(2 << 20, 30), (2 << 20) + (2 << 20) * 30 / 100);
        // Exactly floor(rounded * (100 + percent) / 100), saturating, as computed
        // in 128 bits, including sizes that are not multiples of 100.
        for rounded in [
            1u64,
            99,
            512,
            1000,
            2 << 20,
            (2 << 20) + 512,
            1 << 62,
            u64::MAX,
        ] {
            for p in [0u64, 1, 30, 99, 100, 101, 12345, u64::from(u32::MAX)] {
                let exact = u128::from(rounded) * u128::from(100 + p) / 100;
                let want = u64::try_from(exact).unwrap_or(u64::MAX);
                assert_eq!(max_fit(rounded, p), want, "rounded {rounded}, percent {p}");
            }
        }
    }
}
