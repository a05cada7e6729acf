//! The pointer table (issue 13): from a device address to what the thread caches
//! know of the allocation there, readable with no lock.
//!
//! A radix tree over the address in 512-byte units (a block's alignment; a whole
//! mapping's address is a multiple of it too): a root of `2^ROOT_BITS` children,
//! three levels of `2^MID_BITS`, then leaves of `2^LEAF_BITS` entries, which cover
//! the 64-bit address space. Nodes are made on first use, under the pool's lock
//! (`OnceLock`), and never freed until the pool is; a lookup is five dependent
//! acquire loads. Only addresses that went through a thread cache get a path, so a
//! pool that never uses its caches allocates nothing here.
//!
//! Each [`Entry`] holds a `word` (state, owning cache, generation) changed by one
//! compare-and-swap per free, so that of two racing frees of one pointer exactly one
//! wins, and the rest of the allocation's record (slot, size, requested bytes, the
//! remote-list link).

use std::sync::{Arc, OnceLock};

use crate::driver::DevicePtr;
use crate::sync::atomic::{AtomicU64, Ordering};

/// Address bits below the table's unit (512 bytes, `SEGMENT_BLOCK_ROUND_BYTES`).
const UNIT_SHIFT: u32 = 9;
#[cfg(not(flare_loom))]
const LEAF_BITS: u32 = 9;
#[cfg(not(flare_loom))]
const MID_BITS: u32 = 12;
// Loom tracks every atomic it sees: small leaves keep its models small.
#[cfg(flare_loom)]
const LEAF_BITS: u32 = 2;
#[cfg(flare_loom)]
const MID_BITS: u32 = 14;
const ROOT_BITS: u32 = 64 - UNIT_SHIFT - LEAF_BITS - 3 * MID_BITS;

/// `word`'s state: the allocation is live, handed out by a thread cache.
pub(super) const LIVE: u64 = 1;
/// `word`'s state: not live through the caches (idle in a cache, in transit, back in
/// the books, or never there).
pub(super) const IDLE: u64 = 0;
const STATE_BITS: u32 = 2;
const OWNER_BITS: u32 = 16;
const GEN_SHIFT: u32 = STATE_BITS + OWNER_BITS;

/// Packs a `word`: `state`, the owning cache's id (1-based; 0: none), `generation`
/// (46 bits, wrapping: bumped at every hand-out, so a stale guard never frees a
/// later allocation at the same address).
pub(super) fn pack(state: u64, owner: u16, generation: u64) -> u64 {
    state | (u64::from(owner) << STATE_BITS) | (generation << GEN_SHIFT)
}

/// The state of a `word`.
pub(super) fn state(word: u64) -> u64 {
    word & ((1 << STATE_BITS) - 1)
}

/// The owning cache's id (1-based; 0: none) of a `word`.
pub(super) fn owner(word: u64) -> u16 {
    ((word >> STATE_BITS) & ((1 << OWNER_BITS) - 1)) as u16
}

/// The generation of a `word`.
pub(super) fn generation(word: u64) -> u64 {
    word >> GEN_SHIFT
}

/// The generation after `word`'s (wrapping within its 46 bits).
pub(super) fn next_generation(word: u64) -> u64 {
    (generation(word) + 1) & ((1 << (64 - GEN_SHIFT)) - 1)
}

/// What the caches know of the allocation at one address.
pub(super) struct Entry {
    /// State, owner, generation ([`pack`]).
    pub(super) word: AtomicU64,
    /// The slot in the books (low 32 bits) and whether it is a block (bit 32);
    /// written under the pool's lock before the entry first enters a cache, fixed
    /// while it is in the caches.
    pub(super) meta: AtomicU64,
    /// The allocation's size, bytes (a whole mapping's, or a block's); fixed like
    /// `meta`.
    pub(super) size: AtomicU64,
    /// Bytes asked for while live through a cache.
    pub(super) requested: AtomicU64,
    /// The next address in its owner's remote list (0: the end).
    pub(super) next: AtomicU64,
    /// While live through a cache: its stamp's sequence number and step word
    /// (`steps.rs`), written under its cache's mutex and read under every cache's
    /// (the mutex orders them): std's atomics in every build, as the step clock's
    /// (`sync.rs`), so that loom does not explore them.
    pub(super) seq: std::sync::atomic::AtomicU64,
    pub(super) steps: std::sync::atomic::AtomicU64,
}

impl Entry {
    fn new() -> Entry {
        Entry {
            word: AtomicU64::new(0),
            meta: AtomicU64::new(0),
            size: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            next: AtomicU64::new(0),
            seq: std::sync::atomic::AtomicU64::new(0),
            steps: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The slot and whether it is a block.
    pub(super) fn slot(&self) -> (u32, bool) {
        let m = self.meta.load(Ordering::Relaxed);
        (m as u32, m >> 32 != 0)
    }

    /// Records the slot, block flag and size (under the pool's lock, while no cache
    /// holds the entry).
    pub(super) fn set_slot(&self, slot: u32, block: bool, size: u64) {
        self.meta.store(
            u64::from(slot) | (u64::from(block) << 32),
            Ordering::Relaxed,
        );
        self.size.store(size, Ordering::Relaxed);
    }
}

struct Node<T> {
    kids: Box<[OnceLock<Box<T>>]>,
}

impl<T> Node<T> {
    fn new(bits: u32) -> Self {
        Node {
            kids: (0..1usize << bits).map(|_| OnceLock::new()).collect(),
        }
    }
}

/// A leaf: the entries of `2^LEAF_BITS` consecutive 512-byte units.
pub(super) struct Leaf {
    entries: Box<[Entry]>,
}

impl Leaf {
    /// The entry of `ptr`, which lies in this leaf; `None` for an address inside a
    /// 512-byte unit (an interior pointer: every allocation starts on a unit).
    pub(super) fn entry(&self, ptr: DevicePtr) -> Option<&Entry> {
        if !is_unit_start(ptr) {
            return None;
        }
        self.entries
            .get(((ptr >> UNIT_SHIFT) & ((1 << LEAF_BITS) - 1)) as usize)
    }
}

/// Whether `ptr` starts a 512-byte unit: every whole mapping and every block does,
/// so an address that does not is an interior pointer, which must not find the
/// entry of the allocation it lies in.
fn is_unit_start(ptr: DevicePtr) -> bool {
    ptr & ((1 << UNIT_SHIFT) - 1) == 0
}

/// The key of the leaf holding `ptr` (its address above the leaf's span).
pub(super) fn leaf_key(ptr: DevicePtr) -> u64 {
    ptr >> (UNIT_SHIFT + LEAF_BITS)
}

/// The level above the leaves: leaves are shared (`Arc`), so that a thread cache
/// keeps the one it used last (see [`Tlb`]).
struct L1 {
    kids: Box<[OnceLock<Arc<Leaf>>]>,
}

/// A thread's last leaf: a lookup in the same leaf (the same allocation freed and
/// allocated again, or its neighbours) is one comparison instead of five loads.
#[derive(Default)]
pub(super) struct Tlb {
    key: u64,
    leaf: Option<Arc<Leaf>>,
}

impl Tlb {
    /// Runs `f` on the entry of `ptr` (if its path exists), through the last leaf
    /// when `ptr` lies in it. Otherwise the tree is walked, and with `fill` its leaf
    /// becomes the last one: a free does not fill (it would touch the leaf's shared
    /// reference count on every free of memory another thread allocated), an
    /// allocation does.
    pub(super) fn with<R>(
        &mut self,
        table: &Table,
        ptr: DevicePtr,
        fill: bool,
        f: impl FnOnce(&Entry) -> R,
    ) -> Option<R> {
        let key = leaf_key(ptr);
        if self.key != key || self.leaf.is_none() {
            if !fill {
                return table.get(ptr).map(f);
            }
            self.leaf = Some(table.leaf(ptr)?);
            self.key = key;
        }
        self.leaf.as_ref()?.entry(ptr).map(f)
    }

    /// Lets go of the leaf (the pool is being dropped).
    pub(super) fn clear(&mut self) {
        self.leaf = None;
    }
}

type L2 = Node<L1>;
type L3 = Node<L2>;

/// The pointer table.
#[derive(Default)]
pub(super) struct Table {
    root: OnceLock<Box<Node<L3>>>,
}

/// The radix digits of `ptr`: root, three middle levels, leaf.
fn digits(ptr: DevicePtr) -> [usize; 5] {
    let k = ptr >> UNIT_SHIFT;
    let leaf = (k & ((1 << LEAF_BITS) - 1)) as usize;
    let k = k >> LEAF_BITS;
    let mask = (1u64 << MID_BITS) - 1;
    let a = (k & mask) as usize;
    let b = ((k >> MID_BITS) & mask) as usize;
    let c = ((k >> (2 * MID_BITS)) & mask) as usize;
    let r = ((k >> (3 * MID_BITS)) & ((1 << ROOT_BITS) - 1)) as usize;
    [r, c, b, a, leaf]
}

impl Table {
    /// The entry of `ptr`, if its path exists (`None` for an address inside a
    /// 512-byte unit). No lock; five acquire loads.
    pub(super) fn get(&self, ptr: DevicePtr) -> Option<&Entry> {
        if !is_unit_start(ptr) {
            return None;
        }
        let [r, c, b, a, l] = digits(ptr);
        let n3 = self.root.get()?.kids.get(r)?.get()?;
        let n2 = n3.kids.get(c)?.get()?;
        let n1 = n2.kids.get(b)?.get()?;
        n1.kids.get(a)?.get()?.entries.get(l)
    }

    /// The leaf of `ptr`, shared, if its path exists.
    fn leaf(&self, ptr: DevicePtr) -> Option<Arc<Leaf>> {
        let [r, c, b, a, _] = digits(ptr);
        let n3 = self.root.get()?.kids.get(r)?.get()?;
        let n2 = n3.kids.get(c)?.get()?;
        let n1 = n2.kids.get(b)?.get()?;
        n1.kids.get(a)?.get().cloned()
    }

    /// The entry of `ptr`, its path made if missing. Called under the pool's lock
    /// only (so a node is never initialised twice at once).
    pub(super) fn get_or_make(&self, ptr: DevicePtr) -> Option<&Entry> {
        let [r, c, b, a, l] = digits(ptr);
        let root = self.root.get_or_init(|| Box::new(Node::new(ROOT_BITS)));
        let n3 = root
            .kids
            .get(r)?
            .get_or_init(|| Box::new(Node::new(MID_BITS)));
        let n2 = n3
            .kids
            .get(c)?
            .get_or_init(|| Box::new(Node::new(MID_BITS)));
        let n1 = n2.kids.get(b)?.get_or_init(|| {
            Box::new(L1 {
                kids: (0..1usize << MID_BITS).map(|_| OnceLock::new()).collect(),
            })
        });
        let leaf = n1.kids.get(a)?.get_or_init(|| {
            Arc::new(Leaf {
                entries: (0..1usize << LEAF_BITS).map(|_| Entry::new()).collect(),
            })
        });
        leaf.entries.get(l)
    }
}

#[cfg(all(test, not(flare_loom)))]
mod tests {
    use super::*;

    /// Every address maps to its own entry: neighbours 512 bytes apart, addresses
    /// differing only in their top bits, and the ends of the address space.
    #[test]
    fn distinct_addresses_have_distinct_entries() {
        let t = Table::default();
        let ptrs = [
            0x7f00_0000_0000u64,
            0x7f00_0000_0200,
            0x7f00_0020_0000,
            0xff00_0000_0000,
            0x0000_7f00_0000_0000 | (1 << 63),
            !511,
            512,
        ];
        assert!(t.get(ptrs[0]).is_none(), "no path before one is made");
        for (i, &p) in ptrs.iter().enumerate() {
            let Some(e) = t.get_or_make(p) else {
                panic!("no entry for {p:#x}");
            };
            e.size.store(i as u64 + 1, Ordering::Relaxed);
        }
        for (i, &p) in ptrs.iter().enumerate() {
            let size = t.get(p).map(|e| e.size.load(Ordering::Relaxed));
            assert_eq!(size, Some(i as u64 + 1), "ptr {p:#x}");
        }
        // An address inside a 512-byte unit is an interior pointer: no entry.
        assert!(t.get(ptrs[1] + 1).is_none());
        assert!(t.get(ptrs[1] + 511).is_none());
    }

    #[test]
    fn word_fields_round_trip() {
        let w = pack(LIVE, 0xfffe, (1 << 46) - 1);
        assert_eq!(
            (state(w), owner(w), generation(w)),
            (LIVE, 0xfffe, (1 << 46) - 1)
        );
        assert_eq!(
            next_generation(w),
            0,
            "the generation wraps within its bits"
        );
        let w = pack(IDLE, 3, 7);
        assert_eq!(
            (state(w), owner(w), generation(w), next_generation(w)),
            (IDLE, 3, 7, 8)
        );
    }

    /// The radix levels split the address above its 512-byte unit exactly: the
    /// root takes what the leaf and the three middle levels leave of 64 bits: a
    /// root of `2^10` children (a middle node has `2^12`), no address bit left out
    /// or counted twice.
    #[test]
    fn the_levels_cover_the_address_bits_above_the_unit() {
        assert_eq!(UNIT_SHIFT + LEAF_BITS + 3 * MID_BITS + ROOT_BITS, 64);
        assert_eq!(ROOT_BITS, 10);
        let t = Table::default();
        assert!(t.get_or_make(0x7f00_0000_0000).is_some());
        let root = t.root.get().map(|r| r.kids.len());
        assert_eq!(root, Some(1 << 10));
    }

    /// `leaf_key`: "its address above the leaf's span": a leaf covers `2^9` units of
    /// 512 bytes, 256 KiB, so addresses in one 256 KiB-aligned span share a key and
    /// addresses in different spans (neighbours, or differing only in the top bit)
    /// do not. Through a thread's last leaf ([`Tlb`]): after a lookup of one
    /// address, one that differs only in its top bit reaches its own entry, not the
    /// entry at the same offset of the last leaf.
    #[test]
    fn a_leaf_key_names_the_256_kib_span_of_its_address() {
        let base = 0x7f00_0000_0000u64;
        assert_eq!(leaf_key(base), leaf_key(base + 512));
        assert_eq!(leaf_key(base), leaf_key(base + (256 << 10) - 512));
        assert_ne!(leaf_key(base), leaf_key(base + (256 << 10)));
        assert_ne!(leaf_key(base), leaf_key(base | 1 << 63));
        assert_eq!(leaf_key(base + (256 << 10)), (base >> 18) + 1);

        let t = Table::default();
        let (low, high) = (base, base | 1 << 63);
        for (p, size) in [(low, 1u64), (high, 2)] {
            let e = t
                .get_or_make(p)
                .map(|e| e.size.store(size, Ordering::Relaxed));
            assert!(e.is_some());
        }
        let mut tlb = Tlb::default();
        let size = |tlb: &mut Tlb, p| tlb.with(&t, p, true, |e| e.size.load(Ordering::Relaxed));
        assert_eq!(size(&mut tlb, low), Some(1));
        assert_eq!(size(&mut tlb, high), Some(2));
        assert_eq!(size(&mut tlb, low), Some(1));
    }

    /// `Tlb::clear` ("lets go of the leaf"): a thread's last leaf is shared with the
    /// table; once cleared, the table's own reference is the only one left.
    #[test]
    fn a_cleared_tlb_lets_go_of_its_leaf() {
        let t = Table::default();
        let p = 0x7f00_0000_0000u64;
        assert!(t.get_or_make(p).is_some());
        let mut tlb = Tlb::default();
        assert_eq!(tlb.with(&t, p, true, |_| ()), Some(()));
        let count = |t: &Table| t.leaf(p).map(|l| Arc::strong_count(&l) - 1);
        assert_eq!(count(&t), Some(2), "the table's and the Tlb's");
        tlb.clear();
        assert_eq!(count(&t), Some(1), "the table's only");
    }
}
