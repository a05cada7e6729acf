//! The reuse index: idle mappings by bucket and size, for exact and best-fit lookups.
//!
//! A bucket says who may take a mapping (see `books/buckets.rs`: any caller, one
//! stream, one capture, nobody). One intrusive doubly linked list per distinct
//! (bucket, size), the most recently freed mapping at its head.
//!
//! Each bucket sorts its sizes into segregated size classes (as in TLSF, Masmano et
//! al., 2004), on the size in bytes: below 32 bytes one class per size; above, 32
//! classes per power of two (a class spans 1/32 of its power of two, 3.1%). A class
//! holds the distinct sizes present in it, sorted, each with its list's head: usually
//! one, since sizes are multiples of the pool's granularity (one size per class below
//! 64 granules: 128 MiB at the 2 MiB measured on the devices) or of 512 bytes
//! (segment-mode blocks kept whole in a bucket). A bucket keeps a bitmap of its
//! non-empty groups (powers of two) and one per group of its non-empty classes, so
//! the first non-empty class above a size is two bit scans away.
//!
//! An exact lookup is the size's class, then a binary search of its sizes. A best fit
//! is the first size at least the request's in the request's own class, else the
//! smallest size of the next non-empty class (found with the bitmaps), rejected if it
//! exceeds the bound. Insert, remove, exact and best-fit lookups are O(1) in the
//! number of distinct sizes except for the search of one class's sorted sizes
//! (O(log k) to find, O(k) to insert or drop a size, `k` the sizes present in that
//! class, usually 1). A size whose list empties leaves its class at once (no empty
//! entries to skip or purge); a class keeps its vector's capacity, so the steady
//! reuse path (a size taken and freed again) does not allocate. Allocation happens
//! only when a bucket, a group of 32 classes or a slot is new to the index, or a
//! class holds more distinct sizes than it ever did.

mod classes;
#[cfg(test)]
mod tests;

use classes::{class_of, Bins, Entry};

/// No slot.
const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    bucket: u32,
    size: u64,
    linked: bool,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
    bucket: 0,
    size: 0,
    linked: false,
};

/// Idle mapping slots by bucket and mapping size (bytes).
///
/// Buckets are small integers (the books number them densely from 0): the index keeps
/// a table indexed by bucket number, each bucket's classes made on its first insert.
#[derive(Default)]
pub(crate) struct ReuseIndex {
    buckets: Vec<Option<Box<Bins>>>,
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

    /// The bucket `slot` is indexed in, if it is in the index.
    pub(crate) fn bucket_of(&self, slot: u32) -> Option<u32> {
        self.links
            .get(slot as usize)
            .filter(|l| l.linked)
            .map(|l| l.bucket)
    }

    fn bins(&self, bucket: u32) -> Option<&Bins> {
        self.buckets.get(bucket as usize)?.as_deref()
    }

    /// Adds `slot`, a mapping of `size` bytes, to `bucket`, at the front of its size
    /// (the most recently freed mapping is reused first). `slot` must not be in the
    /// index.
    pub(crate) fn insert(&mut self, slot: u32, bucket: u32, size: u64) {
        let i = slot as usize;
        if self.links.len() <= i {
            self.links.resize(i + 1, UNLINKED);
        }
        debug_assert!(!self.links[i].linked, "slot {slot} indexed twice");
        let b = bucket as usize;
        if self.buckets.len() <= b {
            self.buckets.resize_with(b + 1, || None);
        }
        let bins = self.buckets[b].get_or_insert_with(Bins::new);
        let (g, c) = class_of(size);
        let class = &mut bins.sizes[g]
            .get_or_insert_with(|| Box::new(std::array::from_fn(|_| Vec::new())))[c];
        let old = match class.binary_search_by_key(&size, |e| e.size) {
            Ok(k) => std::mem::replace(&mut class[k].head, slot),
            Err(k) => {
                class.insert(k, Entry { size, head: slot });
                bins.classes[g] |= 1 << c;
                bins.groups |= 1 << g;
                NIL
            }
        };
        self.links[i] = Link {
            prev: NIL,
            next: old,
            bucket,
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
        } else if let Some((g, c, k)) = self.position(link.bucket, link.size) {
            self.set_head(link.bucket, g, c, k, link.next);
        }
        if link.next != NIL {
            self.links[link.next as usize].prev = link.prev;
        }
        self.links[slot as usize] = UNLINKED;
        self.len -= 1;
        true
    }

    /// Where `size` sits in `bucket`: its class and position in it, if present.
    fn position(&self, bucket: u32, size: u64) -> Option<(usize, usize, usize)> {
        let (g, c) = class_of(size);
        let k = self
            .bins(bucket)?
            .class(g, c)
            .binary_search_by_key(&size, |e| e.size)
            .ok()?;
        Some((g, c, k))
    }

    /// Sets the head of the size at (`g`, `c`, `k`) of `bucket` to `head`; a size
    /// whose list is now empty ([`NIL`]) leaves its class, and an emptied class its
    /// bitmaps.
    fn set_head(&mut self, bucket: u32, g: usize, c: usize, k: usize, head: u32) {
        let Some(bins) = self
            .buckets
            .get_mut(bucket as usize)
            .and_then(|b| b.as_deref_mut())
        else {
            return;
        };
        let Some(group) = bins.sizes[g].as_deref_mut() else {
            return;
        };
        let class = &mut group[c];
        if head != NIL {
            class[k].head = head;
            return;
        }
        class.remove(k);
        if class.is_empty() {
            bins.clear(g, c);
        }
    }

    /// Pops the most recently freed slot of the size at (`g`, `c`, `k`) of `bucket`;
    /// returns it and its size.
    fn pop(&mut self, bucket: u32, g: usize, c: usize, k: usize) -> Option<(u32, u64)> {
        let entry = *self.bins(bucket)?.class(g, c).get(k)?;
        let slot = entry.head;
        let next = self.links[slot as usize].next;
        self.set_head(bucket, g, c, k, next);
        if next != NIL {
            self.links[next as usize].prev = NIL;
        }
        self.links[slot as usize] = UNLINKED;
        self.len -= 1;
        Some((slot, entry.size))
    }

    /// Takes a mapping of exactly `size` bytes from `bucket`.
    pub(crate) fn take_exact(&mut self, bucket: u32, size: u64) -> Option<u32> {
        let (g, c, k) = self.position(bucket, size)?;
        self.pop(bucket, g, c, k).map(|(slot, _)| slot)
    }

    /// The smallest size of `bucket` of at least `size` and at most `max_size` bytes:
    /// its class, its position in it, and its entry.
    fn best_fit(
        &self,
        bucket: u32,
        size: u64,
        max_size: u64,
    ) -> Option<(usize, usize, usize, Entry)> {
        if max_size < size {
            return None;
        }
        let bins = self.bins(bucket)?;
        let (g, c, k) = bins.fit(size)?;
        let entry = *bins.class(g, c).get(k)?;
        (entry.size <= max_size).then_some((g, c, k, entry))
    }

    /// The smallest mapping of `bucket` of at least `size` and at most `max_size`
    /// bytes (the most recently freed of that size): its slot and size, left in the
    /// index.
    pub(crate) fn peek_best_fit(
        &self,
        bucket: u32,
        size: u64,
        max_size: u64,
    ) -> Option<(u32, u64)> {
        let (_, _, _, entry) = self.best_fit(bucket, size, max_size)?;
        Some((entry.head, entry.size))
    }

    /// Takes the smallest mapping of `bucket` of at least `size` and at most
    /// `max_size` bytes (the most recently freed of that size); returns its slot and
    /// size. An exact size is found first, in the request's own class.
    pub(crate) fn take_best_fit(
        &mut self,
        bucket: u32,
        size: u64,
        max_size: u64,
    ) -> Option<(u32, u64)> {
        let (g, c, k, _) = self.best_fit(bucket, size, max_size)?;
        self.pop(bucket, g, c, k)
    }

    /// The slots of `bucket`, left in the index: by ascending size, the most recently
    /// freed first within a size.
    pub(crate) fn slots_in(&self, bucket: u32) -> Vec<u32> {
        let mut out = Vec::new();
        self.any_in(bucket, |s| {
            out.push(s);
            false
        });
        out
    }

    /// Whether `f` holds for some slot of `bucket` (stops at the first), visiting
    /// them in the order of [`slots_in`](Self::slots_in).
    pub(crate) fn any_in(&self, bucket: u32, mut f: impl FnMut(u32) -> bool) -> bool {
        let Some(bins) = self.bins(bucket) else {
            return false;
        };
        let mut groups = bins.groups;
        while groups != 0 {
            let g = groups.trailing_zeros() as usize;
            groups &= groups - 1;
            let mut classes = bins.classes[g];
            while classes != 0 {
                let c = classes.trailing_zeros() as usize;
                classes &= classes - 1;
                for entry in bins.class(g, c) {
                    let mut s = entry.head;
                    while s != NIL {
                        if f(s) {
                            return true;
                        }
                        s = self.links[s as usize].next;
                    }
                }
            }
        }
        false
    }

    /// Whether `bucket` holds any slot.
    pub(crate) fn bucket_is_empty(&self, bucket: u32) -> bool {
        self.bins(bucket).is_none_or(|b| b.groups == 0)
    }
}
