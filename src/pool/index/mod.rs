//! The reuse index: idle mappings by bucket and size, for exact and best-fit lookups.
//!
//! A bucket says who may take a mapping (see `books.rs`: any caller, one stream, one
//! capture, nobody). One intrusive doubly linked list per distinct (bucket, size), the
//! most recently freed mapping at its head.
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

/// No slot.
const NIL: u32 = u32::MAX;

/// Classes per group (power of two): 2^5.
const CLASS_BITS: u32 = 5;
const CLASSES: usize = 1 << CLASS_BITS;

/// Groups: group 0 for sizes below [`CLASSES`] bytes (one class per size), then one
/// per power of two from 2^5 to 2^63 (59 more).
const GROUPS: usize = 64 - CLASS_BITS as usize + 1;

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

/// A distinct size present in a class: the size in bytes and its list's head
/// (never [`NIL`]: an emptied size leaves its class).
#[derive(Clone, Copy)]
struct Entry {
    size: u64,
    head: u32,
}

/// One group's classes, each its sizes sorted ascending.
type Group = [Vec<Entry>; CLASSES];

/// One bucket's size classes.
struct Bins {
    /// Bit `g`: group `g` has a non-empty class.
    groups: u64,
    /// Per group, bit `c`: class `c` holds a size.
    classes: [u32; GROUPS],
    /// Per group, its classes (made on the group's first size).
    sizes: [Option<Box<Group>>; GROUPS],
}

impl Bins {
    fn new() -> Box<Bins> {
        Box::new(Bins {
            groups: 0,
            classes: [0; GROUPS],
            sizes: std::array::from_fn(|_| None),
        })
    }

    /// The sizes of class (`g`, `c`); empty if the group was never used.
    fn class(&self, g: usize, c: usize) -> &[Entry] {
        self.sizes[g].as_ref().map_or(&[], |group| &group[c])
    }

    /// The first non-empty class after (`g`, `c`), if any.
    fn next_class(&self, g: usize, c: usize) -> Option<(usize, usize)> {
        // Classes above `c` in group `g` (none above the last).
        let above = self.classes[g] & u32::MAX.checked_shl(c as u32 + 1).unwrap_or(0);
        if above != 0 {
            return Some((g, above.trailing_zeros() as usize));
        }
        let groups = self.groups & u64::MAX.checked_shl(g as u32 + 1).unwrap_or(0);
        if groups == 0 {
            return None;
        }
        let g = groups.trailing_zeros() as usize;
        Some((g, self.classes[g].trailing_zeros() as usize))
    }

    /// Marks class (`g`, `c`) empty after its last size left.
    fn clear(&mut self, g: usize, c: usize) {
        self.classes[g] &= !(1 << c);
        if self.classes[g] == 0 {
            self.groups &= !(1 << g);
        }
    }

    /// The smallest size of at least `size` bytes: its class and position in it.
    fn fit(&self, size: u64) -> Option<(usize, usize, usize)> {
        let (g, c) = class_of(size);
        let own = self.class(g, c);
        let i = own.partition_point(|e| e.size < size);
        if i < own.len() {
            return Some((g, c, i));
        }
        let (g, c) = self.next_class(g, c)?;
        Some((g, c, 0))
    }
}

/// The (group, class) of `size` bytes.
fn class_of(size: u64) -> (usize, usize) {
    if size < CLASSES as u64 {
        (0, size as usize)
    } else {
        // floor(log2(size)) >= CLASS_BITS.
        let fl = 63 - size.leading_zeros();
        let c = (size >> (fl - CLASS_BITS)) as usize & (CLASSES - 1);
        ((fl - CLASS_BITS + 1) as usize, c)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap};

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

    /// `any_in` visits each slot of the bucket once (slots of several groups, the
    /// small-size group 0 among them) and stops when `f` holds: with `f` holding
    /// only from a fourth call on, three slots give three calls and `false`.
    #[test]
    fn any_in_visits_each_slot_once() {
        let mut ix = ReuseIndex::default();
        ix.insert(7, 2, 2);
        ix.insert(9, 2, 6);
        ix.insert(4, 2, 1 << 20);
        let mut seen = 0;
        assert!(!ix.any_in(2, |_| {
            seen += 1;
            seen > 3
        }));
        assert_eq!(seen, 3);
        seen = 0;
        assert!(ix.any_in(2, |_| {
            seen += 1;
            seen > 1
        }));
        assert_eq!(seen, 2, "stops at the first slot f holds for");
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

    /// The class layout: one class per size below 32 bytes, then 32 per power of
    /// two, each 1/32 of it wide, ordered like the sizes up to 2^64 - 1.
    #[test]
    fn classes_split_powers_of_two_in_32() {
        assert_eq!(class_of(0), (0, 0));
        assert_eq!(class_of(31), (0, 31));
        assert_eq!(class_of(32), (1, 0));
        assert_eq!(class_of(63), (1, 31));
        assert_eq!(class_of(64), (2, 0));
        assert_eq!(class_of(65), (2, 0), "64 and 65 share the 2-byte class");
        assert_eq!(class_of(66), (2, 1));
        // 2 MiB = 2^21: group 21 - 5 + 1 = 17; its classes are 64 KiB wide.
        let mib = 1u64 << 20;
        assert_eq!(class_of(2 * mib), (17, 0));
        assert_eq!(class_of(2 * mib + 64 * 1024 - 1), (17, 0));
        assert_eq!(class_of(2 * mib + 64 * 1024), (17, 1));
        // 2 MiB multiples: one per class below 128 MiB (in [64, 128) MiB a class is
        // 2 MiB wide), two per class in [128, 256) MiB.
        assert_eq!(class_of(124 * mib), (22, 30));
        assert_eq!(class_of(126 * mib), (22, 31));
        assert_eq!(class_of(128 * mib).0, class_of(130 * mib).0);
        assert_eq!(class_of(128 * mib), class_of(130 * mib));
        assert_eq!(class_of(u64::MAX / 2), (58, 31));
        assert_eq!(class_of(u64::MAX / 2 + 1), (59, 0));
        assert_eq!(class_of(u64::MAX), (GROUPS - 1, CLASSES - 1));
        let mut last = (0, 0);
        for k in 0..64 {
            for s in [1u64 << k, (1u64 << k) | ((1u64 << k) - 1)] {
                let cl = class_of(s);
                assert!(cl >= last, "class of {s} below the previous one");
                last = cl;
            }
        }
    }

    /// Several sizes in one class: the smallest that fits is found among them, a
    /// larger one in the same class is subject to the bound, and the next class is
    /// reached only when none in the own class fits.
    #[test]
    fn sizes_sharing_a_class() {
        let mib = 1u64 << 20;
        let mut ix = ReuseIndex::default();
        // 128, 130 and 132 MiB: one class ([128, 132) MiB is 4 MiB wide) holds the
        // first two; 132 MiB is the next class.
        ix.insert(1, 0, 130 * mib);
        ix.insert(2, 0, 128 * mib);
        ix.insert(3, 0, 132 * mib);
        assert_eq!(class_of(128 * mib), class_of(130 * mib));
        assert_ne!(class_of(130 * mib), class_of(132 * mib));
        assert_eq!(
            ix.peek_best_fit(0, 127 * mib, u64::MAX),
            Some((2, 128 * mib))
        );
        assert_eq!(
            ix.peek_best_fit(0, 129 * mib, u64::MAX),
            Some((1, 130 * mib))
        );
        assert_eq!(ix.peek_best_fit(0, 129 * mib, 130 * mib - 1), None);
        assert_eq!(
            ix.peek_best_fit(0, 131 * mib, u64::MAX),
            Some((3, 132 * mib))
        );
        assert_eq!(ix.take_exact(0, 129 * mib), None);
        assert_eq!(ix.take_exact(0, 130 * mib), Some(1));
        // 130 MiB gone: 129 MiB now finds 132 MiB in the next class.
        assert_eq!(
            ix.take_best_fit(0, 129 * mib, u64::MAX),
            Some((3, 132 * mib))
        );
        assert_eq!(ix.take_best_fit(0, 129 * mib, u64::MAX), None);
        assert_eq!(ix.take_best_fit(0, 0, u64::MAX), Some((2, 128 * mib)));
        assert!(ix.bucket_is_empty(0));
        assert_eq!(ix.len(), 0);
    }

    /// A free of a size whose list emptied refills it in place: the size's class
    /// keeps its vector's capacity (no allocation on the steady reuse path).
    #[test]
    fn an_emptied_size_leaves_its_class_and_keeps_the_capacity() {
        let mut ix = ReuseIndex::default();
        ix.insert(0, 1, 2 << 20);
        assert_eq!(ix.take_exact(1, 2 << 20), Some(0));
        assert!(ix.bucket_is_empty(1));
        let (g, c) = class_of(2 << 20);
        let class = |ix: &ReuseIndex| {
            let group = ix.buckets.get(1)?.as_ref()?.sizes[g].as_ref()?;
            Some((group[c].len(), group[c].capacity()))
        };
        let Some((len, cap)) = class(&ix) else {
            panic!("bucket 1's group of 2 MiB was made by the insert");
        };
        assert_eq!(len, 0, "an emptied size is not kept");
        assert!(cap >= 1);
        ix.insert(0, 1, 2 << 20);
        assert_eq!(class(&ix), Some((1, cap)));
    }

    /// The model: per (bucket, size), its slots, the most recently inserted first.
    #[derive(Default)]
    struct Model {
        lists: BTreeMap<(u32, u64), Vec<u32>>,
        at: HashMap<u32, (u32, u64)>,
    }

    impl Model {
        fn insert(&mut self, slot: u32, bucket: u32, size: u64) {
            self.lists
                .entry((bucket, size))
                .or_default()
                .insert(0, slot);
            self.at.insert(slot, (bucket, size));
        }
        fn remove(&mut self, slot: u32) -> bool {
            let Some(key) = self.at.remove(&slot) else {
                return false;
            };
            if let Some(list) = self.lists.get_mut(&key) {
                list.retain(|&s| s != slot);
                if list.is_empty() {
                    self.lists.remove(&key);
                }
            }
            true
        }
        fn best_fit(&self, bucket: u32, size: u64, max: u64) -> Option<(u32, u64)> {
            if max < size {
                return None;
            }
            self.lists
                .range((bucket, size)..=(bucket, max))
                .next()
                .map(|(&(_, s), l)| (l[0], s))
        }
        fn slots_in(&self, bucket: u32) -> Vec<u32> {
            self.lists
                .range((bucket, 0)..=(bucket, u64::MAX))
                .flat_map(|(_, l)| l.iter().copied())
                .collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert {
            slot: u32,
            bucket: u32,
            size: usize,
        },
        Remove {
            slot: u32,
        },
        TakeExact {
            bucket: u32,
            size: usize,
            nudge: i8,
        },
        TakeBestFit {
            bucket: u32,
            size: usize,
            nudge: i8,
            max: Max,
        },
        PeekBestFit {
            bucket: u32,
            size: usize,
            nudge: i8,
            max: Max,
        },
    }

    #[derive(Debug, Clone)]
    enum Max {
        Unbounded,
        Same,
        Pool(usize),
        Plus(u64),
    }

    const BUCKETS: u32 = 5;
    const SLOTS: u32 = 48;

    /// Sizes that share classes, straddle powers of two, and reach u64::MAX.
    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..80,
            (1u64..400).prop_map(|u| u * 512),
            (1u64..80).prop_map(|m| m * (2 << 20)),
            (5u32..64, 0u64..4, any::<bool>()).prop_map(|(k, off, below)| {
                let p = 1u64 << k;
                if below {
                    p - 1 - off
                } else {
                    p + off
                }
            }),
            // Sizes in one class of 2^k: offsets below 2^(k-5).
            (6u32..64, 0u64..3, 0u64..4)
                .prop_map(|(k, j, off)| (1u64 << k) + j * (1u64 << (k - 6)) + off),
            (0u64..8).prop_map(|off| u64::MAX / 2 - off),
            (0u64..8).prop_map(|off| u64::MAX / 2 + 1 + off),
            (0u64..8).prop_map(|off| u64::MAX - off),
        ]
    }

    fn op(pool: usize) -> impl Strategy<Value = Op> {
        let max = prop_oneof![
            Just(Max::Unbounded),
            Just(Max::Same),
            (0..pool).prop_map(Max::Pool),
            (0u64..(64 << 20)).prop_map(Max::Plus),
        ];
        prop_oneof![
            4 => (0..SLOTS, 0..BUCKETS, 0..pool)
                .prop_map(|(slot, bucket, size)| Op::Insert { slot, bucket, size }),
            1 => (0..SLOTS).prop_map(|slot| Op::Remove { slot }),
            1 => (0..BUCKETS, 0..pool, -1i8..=1)
                .prop_map(|(bucket, size, nudge)| Op::TakeExact { bucket, size, nudge }),
            2 => (0..BUCKETS, 0..pool, -1i8..=1, max.clone()).prop_map(
                |(bucket, size, nudge, max)| Op::TakeBestFit { bucket, size, nudge, max }
            ),
            1 => (0..BUCKETS, 0..pool, -1i8..=1, max).prop_map(
                |(bucket, size, nudge, max)| Op::PeekBestFit { bucket, size, nudge, max }
            ),
        ]
    }

    fn case() -> impl Strategy<Value = (Vec<u64>, Vec<Op>)> {
        proptest::collection::vec(size(), 1..12).prop_flat_map(|pool| {
            let n = pool.len();
            (Just(pool), proptest::collection::vec(op(n), 1..300))
        })
    }

    fn nudged(size: u64, nudge: i8) -> u64 {
        match nudge {
            -1 => size.saturating_sub(1),
            1 => size.saturating_add(1),
            _ => size,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Every operation agrees with an ordered-map model: the same slot and size
        /// from every lookup (smallest size that fits the bound, most recently freed
        /// first within a size), the same listing order, counts and buckets.
        #[test]
        fn agrees_with_an_ordered_map((pool, ops) in case()) {
            let mut ix = ReuseIndex::default();
            let mut model = Model::default();
            let bound = |max: &Max, size: u64| match *max {
                Max::Unbounded => u64::MAX,
                Max::Same => size,
                Max::Pool(i) => pool[i],
                Max::Plus(d) => size.saturating_add(d),
            };
            for op in &ops {
                match *op {
                    Op::Insert { slot, bucket, size } => {
                        if model.at.contains_key(&slot) {
                            continue;
                        }
                        ix.insert(slot, bucket, pool[size]);
                        model.insert(slot, bucket, pool[size]);
                    }
                    Op::Remove { slot } => {
                        prop_assert_eq!(ix.remove(slot), model.remove(slot));
                    }
                    Op::TakeExact { bucket, size, nudge } => {
                        let size = nudged(pool[size], nudge);
                        let want = model.best_fit(bucket, size, size).map(|(s, _)| s);
                        if let Some(s) = want {
                            model.remove(s);
                        }
                        prop_assert_eq!(ix.take_exact(bucket, size), want);
                    }
                    Op::TakeBestFit { bucket, size, nudge, ref max } => {
                        let size = nudged(pool[size], nudge);
                        let max = bound(max, size);
                        let want = model.best_fit(bucket, size, max);
                        if let Some((s, _)) = want {
                            model.remove(s);
                        }
                        prop_assert_eq!(ix.take_best_fit(bucket, size, max), want);
                    }
                    Op::PeekBestFit { bucket, size, nudge, ref max } => {
                        let size = nudged(pool[size], nudge);
                        let max = bound(max, size);
                        prop_assert_eq!(
                            ix.peek_best_fit(bucket, size, max),
                            model.best_fit(bucket, size, max)
                        );
                    }
                }
                prop_assert_eq!(ix.len(), model.at.len());
                for b in 0..BUCKETS + 1 {
                    let want = model.slots_in(b);
                    prop_assert_eq!(ix.bucket_is_empty(b), want.is_empty());
                    prop_assert_eq!(ix.slots_in(b), want.clone());
                    let mut visited = Vec::new();
                    let stop = want.get(want.len() / 2).copied();
                    let hit = ix.any_in(b, |s| {
                        visited.push(s);
                        Some(s) == stop
                    });
                    prop_assert_eq!(hit, stop.is_some());
                    let upto = if want.is_empty() { 0 } else { want.len() / 2 + 1 };
                    prop_assert_eq!(&visited[..], &want[..upto]);
                }
                for slot in 0..SLOTS + 1 {
                    prop_assert_eq!(ix.bucket_of(slot), model.at.get(&slot).map(|k| k.0));
                    prop_assert_eq!(ix.contains(slot), model.at.contains_key(&slot));
                }
            }
        }
    }
}
