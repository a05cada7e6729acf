//! What the caches change in the snapshot's counters ([`Deltas`]), kept per cache
//! and added to the books' counters by a snapshot or a settle.

use crate::pool::Snapshot;

macro_rules! deltas {
    ($($f:ident),* $(,)?) => {
        /// Changes to the snapshot's counters made by one cache's hand-outs and frees
        /// (wrapping: one cache may free what another handed out; only the sum over
        /// every cache, added to the books' counters, is meaningful).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub(in crate::pool) struct Deltas {
            $(pub(in crate::pool) $f: u64,)*
        }

        impl Deltas {
            /// Adds these changes to `c`.
            pub(in crate::pool) fn add_to(&self, c: &mut Snapshot) {
                $(c.$f = c.$f.wrapping_add(self.$f);)*
            }

            /// Moves `other`'s changes into these; `other` is zeroed.
            pub(super) fn take_from(&mut self, other: &mut Deltas) {
                $(self.$f = self.$f.wrapping_add(other.$f);)*
                *other = Deltas::default();
            }
        }
    };
}

deltas!(
    allocations,
    frees,
    reuse_hits,
    reuse_exact_hits,
    live_count,
    live_requested_bytes,
    live_mapped_bytes,
    idle_count,
    idle_bytes,
    block_live_count,
    block_live_bytes,
    block_free_bytes,
    thread_cache_count,
    thread_cache_bytes,
    thread_cache_hits,
    remote_frees,
);

pub(super) fn add(v: &mut u64, x: u64) {
    *v = v.wrapping_add(x);
}

pub(super) fn sub(v: &mut u64, x: u64) {
    *v = v.wrapping_sub(x);
}

impl Deltas {
    /// An idle allocation of `size` bytes made live for a caller asking `requested`.
    pub(super) fn handed_out(&mut self, size: u64, requested: u64, block: bool, exact: bool) {
        add(&mut self.allocations, 1);
        add(&mut self.reuse_hits, 1);
        add(&mut self.thread_cache_hits, 1);
        add(&mut self.reuse_exact_hits, u64::from(exact));
        self.made_live(size, requested, block);
    }

    /// An idle allocation made live (counted here; the books count it idle).
    pub(super) fn made_live(&mut self, size: u64, requested: u64, block: bool) {
        add(&mut self.live_count, 1);
        add(&mut self.live_requested_bytes, requested);
        if block {
            add(&mut self.block_live_count, 1);
            add(&mut self.block_live_bytes, size);
            sub(&mut self.block_free_bytes, size);
        } else {
            add(&mut self.live_mapped_bytes, size);
            sub(&mut self.idle_count, 1);
            sub(&mut self.idle_bytes, size);
        }
    }

    /// A live allocation freed: the reverse of [`Deltas::handed_out`].
    pub(super) fn freed(&mut self, size: u64, requested: u64, block: bool) {
        add(&mut self.frees, 1);
        sub(&mut self.live_count, 1);
        sub(&mut self.live_requested_bytes, requested);
        if block {
            sub(&mut self.block_live_count, 1);
            sub(&mut self.block_live_bytes, size);
            add(&mut self.block_free_bytes, size);
        } else {
            sub(&mut self.live_mapped_bytes, size);
            add(&mut self.idle_count, 1);
            add(&mut self.idle_bytes, size);
        }
    }

    /// An idle entry of `size` bytes joins (`joins`) or leaves the caches.
    pub(super) fn held(&mut self, size: u64, joins: bool) {
        if joins {
            add(&mut self.thread_cache_count, 1);
            add(&mut self.thread_cache_bytes, size);
        } else {
            sub(&mut self.thread_cache_count, 1);
            sub(&mut self.thread_cache_bytes, size);
        }
    }
}
