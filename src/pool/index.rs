//! The reuse index: idle mappings by bucket and size, for exact and best-fit lookups.
//!
//! A bucket says who may take a mapping (see `books.rs`: any caller, one stream, one
//! capture, nobody). One intrusive doubly linked list per distinct (bucket, size),
//! its head in a `BTreeMap` keyed by (bucket, size). Insert, remove and an exact
//! lookup are O(log s) in the number of distinct keys `s`; best fit is one ordered
//! range query within a bucket. Nothing on the reuse path allocates except when a
//! key is new to the map.

use std::collections::BTreeMap;

/// No slot.
const NIL: u32 = u32::MAX;

/// (bucket, mapping size in bytes).
type Key = (u32, u64);

#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    key: Key,
    linked: bool,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
    key: (0, 0),
    linked: false,
};

/// Idle mapping slots by bucket and mapping size (bytes).
///
/// A size class whose list empties keeps its map entry (head [`NIL`]): the next
/// free of that size (a steady allocate/free pair) then updates the entry in place,
/// one map descent instead of a node removal and a reinsertion. Empty entries are
/// purged when they outnumber the others (and are more than
/// [`PURGE_AT_EMPTY`]), so a lookup never walks more than about as many empty
/// entries as full ones.
#[derive(Default)]
pub(crate) struct ReuseIndex {
    heads: BTreeMap<Key, u32>,
    links: Vec<Link>,
    len: usize,
    /// Map entries whose head is [`NIL`].
    empty: usize,
}

/// Empty size-class entries are purged only above this many.
const PURGE_AT_EMPTY: usize = 64;

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

    /// Map entries kept with an empty list (for the tests of the purge).
    #[cfg(test)]
    pub(crate) fn empty_entries(&self) -> usize {
        self.empty
    }

    /// The bucket `slot` is indexed in, if it is in the index.
    pub(crate) fn bucket_of(&self, slot: u32) -> Option<u32> {
        self.links
            .get(slot as usize)
            .filter(|l| l.linked)
            .map(|l| l.key.0)
    }

    /// Adds `slot`, a mapping of `size` bytes, to `bucket`, at the front of its size
    /// class (the most recently freed mapping is reused first). `slot` must not be in
    /// the index.
    pub(crate) fn insert(&mut self, slot: u32, bucket: u32, size: u64) {
        let key = (bucket, size);
        let i = slot as usize;
        if self.links.len() <= i {
            self.links.resize(i + 1, UNLINKED);
        }
        debug_assert!(!self.links[i].linked, "slot {slot} indexed twice");
        let old = match self.heads.get_mut(&key) {
            Some(head) => {
                let old = *head;
                *head = slot;
                if old == NIL {
                    self.empty -= 1;
                }
                old
            }
            None => {
                self.heads.insert(key, slot);
                NIL
            }
        };
        self.links[i] = Link {
            prev: NIL,
            next: old,
            key,
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
        let mut emptied = false;
        if link.prev != NIL {
            self.links[link.prev as usize].next = link.next;
        } else if let Some(head) = self.heads.get_mut(&link.key) {
            *head = link.next;
            emptied = link.next == NIL;
        }
        self.unlink(slot, link);
        if emptied {
            // Only an emptied list adds an empty entry, so only then can the purge
            // become due.
            self.empty += 1;
            self.maybe_purge();
        }
        true
    }

    /// The list bookkeeping after `slot` (with `link`) left its list's head or
    /// middle: its successor's back link, its own link, the count.
    fn unlink(&mut self, slot: u32, link: Link) {
        if link.next != NIL {
            self.links[link.next as usize].prev = link.prev;
        }
        self.links[slot as usize] = UNLINKED;
        self.len -= 1;
    }

    /// Pops the head of the list whose head is `head` (a map entry's value).
    fn pop(head: &mut u32, links: &mut [Link], empty: &mut usize) -> u32 {
        let slot = *head;
        let next = links[slot as usize].next;
        *head = next;
        if next == NIL {
            *empty += 1;
        } else {
            links[next as usize].prev = NIL;
        }
        links[slot as usize] = UNLINKED;
        slot
    }

    fn maybe_purge(&mut self) {
        if self.empty > PURGE_AT_EMPTY && self.empty > self.heads.len() / 2 {
            self.heads.retain(|_, head| *head != NIL);
            self.empty = 0;
        }
    }

    /// Takes a mapping of exactly `size` bytes from `bucket`.
    pub(crate) fn take_exact(&mut self, bucket: u32, size: u64) -> Option<u32> {
        let head = self.heads.get_mut(&(bucket, size))?;
        if *head == NIL {
            return None;
        }
        let slot = Self::pop(head, &mut self.links, &mut self.empty);
        self.len -= 1;
        self.maybe_purge();
        Some(slot)
    }

    /// The smallest mapping of `bucket` of at least `size` and at most `max_size`
    /// bytes: its slot and size, left in the index.
    pub(crate) fn peek_best_fit(
        &self,
        bucket: u32,
        size: u64,
        max_size: u64,
    ) -> Option<(u32, u64)> {
        if max_size < size {
            return None;
        }
        self.heads
            .range((bucket, size)..=(bucket, max_size))
            .find(|(_, &head)| head != NIL)
            .map(|(&(_, found), &slot)| (slot, found))
    }

    /// Takes the smallest mapping of `bucket` of at least `size` and at most
    /// `max_size` bytes; returns its slot and size. An exact size is looked up
    /// first (one map descent; the common case of a pair of one size).
    pub(crate) fn take_best_fit(
        &mut self,
        bucket: u32,
        size: u64,
        max_size: u64,
    ) -> Option<(u32, u64)> {
        if max_size < size {
            return None;
        }
        if let Some(slot) = self.take_exact(bucket, size) {
            return Some((slot, size));
        }
        let (&(_, found), head) = self
            .heads
            .range_mut((bucket, size)..=(bucket, max_size))
            .find(|(_, head)| **head != NIL)?;
        let slot = Self::pop(head, &mut self.links, &mut self.empty);
        self.len -= 1;
        self.maybe_purge();
        Some((slot, found))
    }

    /// The slots of `bucket`, left in the index.
    pub(crate) fn slots_in(&self, bucket: u32) -> Vec<u32> {
        let mut out = Vec::new();
        self.any_in(bucket, |s| {
            out.push(s);
            false
        });
        out
    }

    /// Whether `f` holds for some slot of `bucket` (stops at the first).
    pub(crate) fn any_in(&self, bucket: u32, mut f: impl FnMut(u32) -> bool) -> bool {
        for (_, &head) in self.heads.range((bucket, 0)..=(bucket, u64::MAX)) {
            let mut s = head;
            while s != NIL {
                if f(s) {
                    return true;
                }
                s = self.links[s as usize].next;
            }
        }
        false
    }

    /// Whether `bucket` holds any slot.
    pub(crate) fn bucket_is_empty(&self, bucket: u32) -> bool {
        !self
            .heads
            .range((bucket, 0)..=(bucket, u64::MAX))
            .any(|(_, &head)| head != NIL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Emptied size classes stay in the map until they outnumber the others (and
    /// exceed the floor), then go all at once; lookups skip them meanwhile.
    #[test]
    fn empty_size_classes_are_kept_then_purged() {
        let mut ix = ReuseIndex::default();
        ix.insert(0, 0, 1);
        // 65 distinct sizes inserted and taken: 65 empty entries, 1 full.
        for k in 0..PURGE_AT_EMPTY as u64 {
            ix.insert(1, 0, 100 + k);
            assert_eq!(ix.take_exact(0, 100 + k), Some(1));
        }
        assert_eq!(ix.empty_entries(), PURGE_AT_EMPTY, "kept: at the floor");
        assert_eq!(ix.take_exact(0, 100), None, "an empty class is not a hit");
        assert_eq!(ix.peek_best_fit(0, 2, u64::MAX), None, "nor a best fit");
        assert_eq!(ix.take_best_fit(0, 2, u64::MAX), None);
        assert!(ix.bucket_is_empty(1));
        assert!(!ix.bucket_is_empty(0));
        // Refilling an empty class takes it back out of the count.
        ix.insert(1, 0, 100);
        assert_eq!(ix.empty_entries(), PURGE_AT_EMPTY - 1);
        assert_eq!(ix.take_best_fit(0, 2, u64::MAX), Some((1, 100)));
        assert_eq!(ix.empty_entries(), PURGE_AT_EMPTY);
        // One more emptied class: above the floor and above half the entries.
        ix.insert(2, 0, 5000);
        assert!(ix.remove(2));
        assert_eq!(ix.empty_entries(), 0, "purged");
        assert_eq!(ix.take_exact(0, 1), Some(0), "the full class survives");
        assert_eq!(ix.len(), 0);
    }

    /// Above the floor but not more than half the entries: kept (the purge is for
    /// when the empty entries outnumber the full ones).
    #[test]
    fn empty_entries_are_kept_while_full_ones_outnumber_them() {
        let mut ix = ReuseIndex::default();
        let full = 70u64;
        for k in 0..full {
            ix.insert(k as u32, 1, 1 + k);
        }
        let empty = PURGE_AT_EMPTY as u64 + 1;
        for k in 0..empty {
            ix.insert(1000, 0, 1 + k);
            assert_eq!(ix.take_exact(0, 1 + k), Some(1000));
        }
        // 65 empty of 135 entries: 65 <= 135 / 2 = 67.
        assert_eq!(ix.empty_entries(), empty as usize, "kept");
        assert_eq!(ix.len(), full as usize);
    }

    #[test]
    fn exact_and_best_fit() {
        let mut ix = ReuseIndex::default();
        ix.insert(0, 0, 4);
        ix.insert(1, 0, 8);
        ix.insert(2, 0, 8);
        ix.insert(3, 0, 32);
        ix.insert(4, 1, 8);
        assert_eq!(ix.len(), 5);
        assert_eq!(ix.take_exact(0, 6), None);
        assert_eq!(
            ix.take_best_fit(0, 6, 12),
            Some((2, 8)),
            "most recent of the 8s"
        );
        assert_eq!(ix.take_best_fit(0, 6, 12), Some((1, 8)));
        assert_eq!(
            ix.take_best_fit(0, 6, 12),
            None,
            "32 is beyond the bound, and bucket 1's 8 is another bucket's"
        );
        assert_eq!(ix.take_best_fit(0, 6, 64), Some((3, 32)));
        // A bound equal to the size (a 0% waste bound, or `exact`) is the exact size.
        ix.insert(5, 0, 16);
        assert_eq!(ix.peek_best_fit(0, 16, 16), Some((5, 16)));
        assert_eq!(ix.peek_best_fit(0, 16, 15), None, "a bound below the size");
        assert_eq!(ix.take_best_fit(0, 16, 16), Some((5, 16)));
        assert_eq!(ix.take_exact(0, 4), Some(0));
        assert_eq!(ix.take_exact(0, 8), None);
        assert_eq!(ix.bucket_of(4), Some(1));
        assert_eq!(ix.take_exact(1, 8), Some(4));
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn remove_middle_head_tail() {
        let mut ix = ReuseIndex::default();
        for s in 0..5 {
            ix.insert(s, 3, 2);
        }
        // list order: 4 3 2 1 0
        assert!(ix.remove(2));
        assert!(!ix.remove(2));
        assert!(ix.remove(4));
        assert!(ix.remove(0));
        assert!(!ix.contains(0));
        assert!(ix.contains(3));
        assert_eq!(ix.take_exact(3, 2), Some(3));
        assert_eq!(ix.take_exact(3, 2), Some(1));
        assert_eq!(ix.take_exact(3, 2), None);
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn buckets_drain_and_list_apart() {
        let mut ix = ReuseIndex::default();
        ix.insert(7, 2, 2);
        ix.insert(3, 2, 2);
        ix.insert(9, 2, 6);
        ix.insert(5, 0, 2);
        ix.insert(6, 3, u64::MAX);
        let mut listed = ix.slots_in(2);
        listed.sort();
        assert_eq!(listed, vec![3, 7, 9]);
        assert_eq!(ix.len(), 5, "listing leaves them in");
        assert!(ix.any_in(2, |s| s == 9));
        assert!(!ix.any_in(2, |s| s == 5), "5 is bucket 0's");
        let mut seen = 0;
        assert!(!ix.any_in(2, |_| {
            seen += 1;
            false
        }));
        assert_eq!(seen, 3, "every slot of bucket 2 visited once");
        for s in [3, 7, 9] {
            assert!(ix.remove(s));
        }
        assert!(ix.bucket_is_empty(2));
        assert!(!ix.bucket_is_empty(0));
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.peek_best_fit(2, 0, u64::MAX), None);
        assert_eq!(ix.peek_best_fit(3, 1, u64::MAX), Some((6, u64::MAX)));
        assert_eq!(ix.len(), 2, "peeking leaves it in");
        ix.insert(3, 2, 2);
        assert_eq!(ix.take_exact(2, 2), Some(3));
        assert_eq!(ix.bucket_of(3), None);
    }
}
