use super::classes::{CLASSES, GROUPS};
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
