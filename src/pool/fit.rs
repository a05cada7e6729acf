//! The free-block index of segment mode: free blocks by heap and size, in
//! two-level segregated bins (TLSF, Masmano et al., 2004) for a bounded good fit in
//! constant time.
//!
//! Sizes are multiples of 512 bytes (`u = size / 512` units). The first level is
//! `floor(log2(u))`; the second splits each power-of-two range into [`SUBBINS`]
//! equal bins (below `SUBBINS` units every size has a bin of its own). A bin's
//! blocks are within 1/32 (3.1%) of each other in size. Each heap has a bitmap of
//! its non-empty first levels and one per first level of its non-empty bins, so the
//! first non-empty bin at or above a size is two bit scans away.
//!
//! A lookup for `size` first looks through the first [`OWN_BIN_PROBES`] blocks of
//! `size`'s own bin for the smallest that fits (the exact size of a steady
//! allocate/free pair is found there), then takes the first block of the next
//! non-empty bin above, every block of which fits; only when no bin above holds a
//! block does it look through the rest of the own bin (so a free block that fits is
//! always found). So a fit exceeds the request by less than one bin's width (3.1%)
//! unless no bin closer holds a block: a bounded good fit. Insert, remove and lookup
//! are O(1) (a lookup with nothing larger in the heap: O(own bin)); nothing allocates
//! on that path except when a slot or heap is new.

/// No slot.
const NIL: u32 = u32::MAX;

/// Second-level bins per power of two (2^5).
const SUBBIN_BITS: u32 = 5;
const SUBBINS: usize = 1 << SUBBIN_BITS;

/// First levels: enough for any 64-bit size in 512-byte units.
const LEVELS: usize = 64;

/// Blocks of the request's own bin examined for a fit before moving up a bin.
const OWN_BIN_PROBES: usize = 8;

/// The unit of sizes, bytes.
const UNIT_SHIFT: u32 = 9;

#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    size: u64,
    heap: u32,
    bin: u16,
    linked: bool,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
    size: 0,
    heap: 0,
    bin: 0,
    linked: false,
};

/// One heap's bins.
struct Heap {
    levels: u64,
    bins: [u32; LEVELS],
    heads: [[u32; SUBBINS]; LEVELS],
    len: usize,
}

impl Heap {
    fn new() -> Box<Heap> {
        Box::new(Heap {
            levels: 0,
            bins: [0; LEVELS],
            heads: [[NIL; SUBBINS]; LEVELS],
            len: 0,
        })
    }
}

/// The (first level, second level) bin of a size in units (`u >= 1`).
fn bin_of(u: u64) -> (usize, usize) {
    let fl = 63 - u.leading_zeros();
    if fl < SUBBIN_BITS {
        // Small: one bin per size, in level 0 (u < 32).
        (0, u as usize)
    } else {
        let sl = (u >> (fl - SUBBIN_BITS)) as usize & (SUBBINS - 1);
        ((fl - SUBBIN_BITS + 1) as usize, sl)
    }
}

fn pack(fl: usize, sl: usize) -> u16 {
    (fl * SUBBINS + sl) as u16
}

fn unpack(bin: u16) -> (usize, usize) {
    (bin as usize / SUBBINS, bin as usize % SUBBINS)
}

/// Free blocks by heap (a small integer key) and size, bytes (multiples of 512).
#[derive(Default)]
pub(crate) struct FreeIndex {
    heaps: Vec<Option<Box<Heap>>>,
    links: Vec<Link>,
}

impl FreeIndex {
    fn heap_mut(&mut self, key: u32) -> &mut Heap {
        let k = key as usize;
        if self.heaps.len() <= k {
            self.heaps.resize_with(k + 1, || None);
        }
        self.heaps[k].get_or_insert_with(Heap::new)
    }

    /// Adds free block `slot` of `size` bytes to heap `key` (at the front of its
    /// bin: the block freed last is found first). `slot` must not be in the index.
    pub(crate) fn insert(&mut self, slot: u32, key: u32, size: u64) {
        let i = slot as usize;
        if self.links.len() <= i {
            self.links.resize(i + 1, UNLINKED);
        }
        debug_assert!(!self.links[i].linked, "slot {slot} indexed twice");
        let (fl, sl) = bin_of((size >> UNIT_SHIFT).max(1));
        let heap = self.heap_mut(key);
        let old = heap.heads[fl][sl];
        heap.heads[fl][sl] = slot;
        heap.bins[fl] |= 1 << sl;
        heap.levels |= 1 << fl;
        heap.len += 1;
        if old != NIL {
            self.links[old as usize].prev = slot;
        }
        self.links[i] = Link {
            prev: NIL,
            next: old,
            size,
            heap: key,
            bin: pack(fl, sl),
            linked: true,
        };
    }

    /// Removes `slot` if it is in the index; returns whether it was.
    pub(crate) fn remove(&mut self, slot: u32) -> bool {
        let Some(link) = self.links.get(slot as usize).copied() else {
            return false;
        };
        if !link.linked {
            return false;
        }
        if link.next != NIL {
            self.links[link.next as usize].prev = link.prev;
        }
        // A linked slot's heap exists.
        let Some(Some(heap)) = self.heaps.get_mut(link.heap as usize) else {
            return false;
        };
        heap.len -= 1;
        if link.prev != NIL {
            self.links[link.prev as usize].next = link.next;
        } else {
            let (fl, sl) = unpack(link.bin);
            heap.heads[fl][sl] = link.next;
            if link.next == NIL {
                heap.bins[fl] &= !(1 << sl);
                if heap.bins[fl] == 0 {
                    heap.levels &= !(1 << fl);
                }
            }
        }
        self.links[slot as usize] = UNLINKED;
        true
    }

    /// Takes a free block of heap `key` of at least `size` bytes (a bounded good fit,
    /// see the module documentation); returns its slot and size.
    pub(crate) fn take_fit(&mut self, key: u32, size: u64) -> Option<(u32, u64)> {
        let slot = self.find_fit(key, size)?;
        let found = self.links[slot as usize].size;
        self.remove(slot);
        Some((slot, found))
    }

    fn find_fit(&self, key: u32, size: u64) -> Option<u32> {
        let heap = self.heaps.get(key as usize)?.as_ref()?;
        if heap.len == 0 {
            return None;
        }
        let (fl, sl) = bin_of((size >> UNIT_SHIFT).max(1));
        // The request's own bin: the smallest of its first few blocks that fits.
        let mut best: Option<(u64, u32)> = None;
        let mut s = heap.heads[fl][sl];
        for _ in 0..OWN_BIN_PROBES {
            if s == NIL {
                break;
            }
            let l = &self.links[s as usize];
            if l.size >= size && best.is_none_or(|(b, _)| l.size < b) {
                best = Some((l.size, s));
                if l.size == size {
                    break;
                }
            }
            s = l.next;
        }
        if let Some((_, s)) = best {
            return Some(s);
        }
        // The next non-empty bin above: every block in it fits.
        let above = if sl + 1 < SUBBINS {
            heap.bins[fl] & (u32::MAX << (sl + 1))
        } else {
            0
        };
        let (fl, bins) = if above != 0 {
            (fl, above)
        } else {
            let levels = if fl + 1 < LEVELS {
                heap.levels & (u64::MAX << (fl + 1))
            } else {
                0
            };
            if levels == 0 {
                // Nothing larger: a fit can only be further down the request's own
                // bin (a miss would grow the heap, or fail on a full device, while
                // a free block fits). O(bin length), on a miss only.
                while s != NIL {
                    let l = &self.links[s as usize];
                    if l.size >= size && best.is_none_or(|(b, _)| l.size < b) {
                        best = Some((l.size, s));
                    }
                    s = l.next;
                }
                return best.map(|(_, s)| s);
            }
            let f = levels.trailing_zeros() as usize;
            (f, heap.bins[f])
        };
        let sl = bins.trailing_zeros() as usize;
        let s = heap.heads[fl][sl];
        (s != NIL).then_some(s)
    }

    /// Calls `f` on the blocks of heap `key` of at least `min` bytes (bin by bin
    /// upward from `min`'s) until it returns true; returns whether it did.
    pub(crate) fn any_in_from(&self, key: u32, min: u64, mut f: impl FnMut(u32) -> bool) -> bool {
        let Some(Some(heap)) = self.heaps.get(key as usize) else {
            return false;
        };
        let (fl0, sl0) = bin_of((min >> UNIT_SHIFT).max(1));
        for fl in fl0..LEVELS {
            if heap.levels & (1 << fl) == 0 {
                continue;
            }
            for sl in 0..SUBBINS {
                if (fl == fl0 && sl < sl0) || heap.bins[fl] & (1 << sl) == 0 {
                    continue;
                }
                let mut s = heap.heads[fl][sl];
                while s != NIL {
                    let l = self.links[s as usize];
                    if l.size >= min && f(s) {
                        return true;
                    }
                    s = l.next;
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn bins_are_monotonic_and_within_a_thirty_second() {
        let mut last = (0, 0);
        for u in 1..(1u64 << 16) {
            let b = bin_of(u);
            assert!(b >= last, "u {u}: {b:?} < {last:?}");
            last = b;
        }
        // A bin above the exact small ones spans 1/32 of the power of two it lies in:
        // two sizes in one bin differ by less than 1/32 of the smaller. Checked at
        // the bin's two edges.
        for f in [5u32, 10, 17, 40, 58] {
            for sl in [0u64, 1, 17, 31] {
                let width = 1u64 << (f - 5);
                let lower = (1u64 << f) + sl * width;
                let upper = lower + width - 1;
                assert_eq!(bin_of(lower), bin_of(upper), "f {f} sl {sl}");
                assert_ne!(bin_of(lower - 1), bin_of(lower), "f {f} sl {sl}");
                assert_ne!(bin_of(upper + 1), bin_of(upper), "f {f} sl {sl}");
                assert!((upper - lower) * 32 < lower);
            }
        }
        assert_eq!(bin_of(1), (0, 1));
        assert_eq!(bin_of(31), (0, 31));
        assert_eq!(bin_of(32), (1, 0));
        assert_eq!(bin_of(63), (1, 31));
        assert_eq!(bin_of(64), (2, 0));
        assert_eq!(bin_of(u64::MAX), (59, 31));
    }

    #[test]
    fn exact_then_good_fit() {
        let mut ix = FreeIndex::default();
        ix.insert(0, 3, 64 * K);
        ix.insert(1, 3, 4 * K);
        ix.insert(2, 3, 8 * K);
        ix.insert(3, 4, 4 * K);
        assert_eq!(ix.take_fit(3, 4 * K), Some((1, 4 * K)), "the exact size");
        assert_eq!(ix.take_fit(3, 4 * K), Some((2, 8 * K)), "the next bin up");
        assert_eq!(ix.take_fit(3, 65 * K), None, "nothing that large");
        assert_eq!(ix.take_fit(3, 5 * K), Some((0, 64 * K)));
        assert_eq!(
            ix.take_fit(3, 512),
            None,
            "heap 3 is empty; heap 4's is not its"
        );
        assert_eq!(ix.take_fit(4, 512), Some((3, 4 * K)));
        assert_eq!(ix.take_fit(9, 512), None, "an unknown heap");
    }

    #[test]
    fn own_bin_probes_take_the_smallest_fit() {
        let mut ix = FreeIndex::default();
        // One bin: 1 MiB .. 1 MiB + 32 KiB (2048 units .. 2112).
        let base = 1 << 20;
        ix.insert(0, 0, base + 16 * K);
        ix.insert(1, 0, base + 4 * K);
        ix.insert(2, 0, base);
        ix.insert(3, 0, base + 8 * K);
        // Request base + 2 KiB: base is too small; of the rest, base + 4 KiB.
        assert_eq!(ix.take_fit(0, base + 2 * K), Some((1, base + 4 * K)));
        assert!(ix.remove(2));
        assert!(!ix.remove(2));
        assert_eq!(ix.take_fit(0, base), Some((3, base + 8 * K)));
        assert_eq!(ix.take_fit(0, base), Some((0, base + 16 * K)));
        assert_eq!(ix.take_fit(0, 512), None);
    }

    #[test]
    fn remove_keeps_the_bitmaps_true() {
        let mut ix = FreeIndex::default();
        for s in 0..4u32 {
            ix.insert(s, 1, 2 << 20);
        }
        ix.insert(9, 1, 8 << 20);
        for s in [2, 0, 3, 1] {
            assert!(ix.remove(s));
        }
        // The 2 MiB bin is empty: a 2 MiB request goes up to 8 MiB.
        assert_eq!(ix.take_fit(1, 2 << 20), Some((9, 8 << 20)));
        assert_eq!(ix.take_fit(1, 512), None);
        let mut seen = Vec::new();
        ix.insert(5, 1, 4 * K);
        ix.insert(6, 1, 16 * K);
        ix.insert(7, 1, 1 << 30);
        assert!(!ix.any_in_from(1, 8 * K, |s| {
            seen.push(s);
            false
        }));
        assert_eq!(seen, [6, 7], "blocks of at least 8 KiB, smallest bin first");
        assert!(ix.any_in_from(1, 0, |s| s == 5));
    }

    /// `insert`: "the block freed last is found first", also when the fit lies past
    /// the own bin's probes and nothing larger is free (the scan of the rest of the
    /// bin): of two fitting blocks of one size, the one inserted last.
    #[test]
    fn past_the_probes_the_block_freed_last_is_found_first() {
        let mut ix = FreeIndex::default();
        let base = 1 << 20;
        ix.insert(100, 0, base + 8 * K);
        ix.insert(101, 0, base + 8 * K);
        for s in 0..OWN_BIN_PROBES as u32 {
            ix.insert(s, 0, base);
        }
        assert_eq!(ix.take_fit(0, base + 4 * K), Some((101, base + 8 * K)));
        assert_eq!(ix.take_fit(0, base + 4 * K), Some((100, base + 8 * K)));
        assert_eq!(ix.take_fit(0, base + 4 * K), None);
    }

    /// A link's bin is packed into 16 bits (`pack`) and read back by `remove`
    /// (`unpack`): every (level, sub-bin) of the index round-trips.
    #[test]
    fn a_packed_bin_unpacks_to_its_level_and_sub_bin() {
        for fl in 0..LEVELS {
            for sl in 0..SUBBINS {
                assert_eq!(unpack(pack(fl, sl)), (fl, sl));
            }
        }
    }
}
