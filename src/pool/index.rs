//! The reuse index: idle mappings by size, for exact and best-fit lookups.
//!
//! One intrusive doubly linked list per distinct size, its head in a `BTreeMap`
//! keyed by size. Insert, remove and an exact lookup are O(log s) in the number of
//! distinct idle sizes `s`; best fit is one ordered range query. Nothing on the
//! reuse path allocates except when a size class is new to the map.

use std::collections::BTreeMap;

/// No slot.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    size: u64,
    linked: bool,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
    size: 0,
    linked: false,
};

/// Idle mapping slots by mapping size (bytes).
#[derive(Default)]
pub(crate) struct ReuseIndex {
    heads: BTreeMap<u64, u32>,
    links: Vec<Link>,
    len: usize,
}

impl ReuseIndex {
    /// Number of slots in the index.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `slot` is in the index.
    #[cfg(test)]
    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.links.get(slot as usize).is_some_and(|l| l.linked)
    }

    /// Adds `slot`, a mapping of `size` bytes, at the front of its size class (the
    /// most recently freed mapping is reused first). `slot` must not be in the index.
    pub(crate) fn insert(&mut self, slot: u32, size: u64) {
        let i = slot as usize;
        if self.links.len() <= i {
            self.links.resize(i + 1, UNLINKED);
        }
        debug_assert!(!self.links[i].linked, "slot {slot} indexed twice");
        let head = self.heads.entry(size).or_insert(NIL);
        let old = *head;
        *head = slot;
        self.links[i] = Link {
            prev: NIL,
            next: old,
            size,
            linked: true,
        };
        if old != NIL {
            self.links[old as usize].prev = slot;
        }
        self.len += 1;
    }

    /// Removes `slot` if it is in the index; returns whether it was.
    pub(crate) fn remove(&mut self, slot: u32) -> bool {
        let Some(link) = self.links.get(slot as usize).copied() else {
            return false;
        };
        if !link.linked {
            return false;
        }
        if link.prev != NIL {
            self.links[link.prev as usize].next = link.next;
        } else if link.next != NIL {
            self.heads.insert(link.size, link.next);
        } else {
            self.heads.remove(&link.size);
        }
        if link.next != NIL {
            self.links[link.next as usize].prev = link.prev;
        }
        self.links[slot as usize] = UNLINKED;
        self.len -= 1;
        true
    }

    /// Takes an idle mapping of exactly `size` bytes.
    pub(crate) fn take_exact(&mut self, size: u64) -> Option<u32> {
        let slot = *self.heads.get(&size)?;
        self.remove(slot);
        Some(slot)
    }

    /// Takes the smallest idle mapping of at least `size` and at most `max_size`
    /// bytes; returns its slot and size.
    pub(crate) fn take_best_fit(&mut self, size: u64, max_size: u64) -> Option<(u32, u64)> {
        if max_size < size {
            return None;
        }
        let (&found, &slot) = self.heads.range(size..=max_size).next()?;
        self.remove(slot);
        Some((slot, found))
    }

    /// Removes every slot; returns them.
    pub(crate) fn drain(&mut self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        for (_, &head) in self.heads.iter() {
            let mut s = head;
            while s != NIL {
                out.push(s);
                let l = self.links[s as usize];
                self.links[s as usize] = UNLINKED;
                s = l.next;
            }
        }
        self.heads.clear();
        self.len = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_best_fit() {
        let mut ix = ReuseIndex::default();
        ix.insert(0, 4);
        ix.insert(1, 8);
        ix.insert(2, 8);
        ix.insert(3, 32);
        assert_eq!(ix.len(), 4);
        assert_eq!(ix.take_exact(6), None);
        assert_eq!(
            ix.take_best_fit(6, 12),
            Some((2, 8)),
            "most recent of the 8s"
        );
        assert_eq!(ix.take_best_fit(6, 12), Some((1, 8)));
        assert_eq!(ix.take_best_fit(6, 12), None, "32 is beyond the bound");
        assert_eq!(ix.take_best_fit(6, 64), Some((3, 32)));
        assert_eq!(ix.take_exact(4), Some(0));
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn remove_middle_head_tail() {
        let mut ix = ReuseIndex::default();
        for s in 0..5 {
            ix.insert(s, 2);
        }
        // list order: 4 3 2 1 0
        assert!(ix.remove(2));
        assert!(!ix.remove(2));
        assert!(ix.remove(4));
        assert!(ix.remove(0));
        assert!(!ix.contains(0));
        assert!(ix.contains(3));
        assert_eq!(ix.take_exact(2), Some(3));
        assert_eq!(ix.take_exact(2), Some(1));
        assert_eq!(ix.take_exact(2), None);
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn drain_returns_all() {
        let mut ix = ReuseIndex::default();
        ix.insert(7, 2);
        ix.insert(3, 2);
        ix.insert(9, 6);
        let mut d = ix.drain();
        d.sort();
        assert_eq!(d, vec![3, 7, 9]);
        assert_eq!(ix.len(), 0);
        assert_eq!(ix.take_best_fit(0, u64::MAX), None);
        ix.insert(3, 2);
        assert_eq!(ix.take_exact(2), Some(3));
    }
}
