//! The size classes of one bucket (as in TLSF): 32 classes per power of two, each
//! its distinct sizes sorted, and the bitmaps that find the first non-empty class
//! above a size.

#[cfg(doc)]
use super::NIL;

/// Classes per group (power of two): 2^5.
pub(super) const CLASS_BITS: u32 = 5;
pub(super) const CLASSES: usize = 1 << CLASS_BITS;

/// Groups: group 0 for sizes below [`CLASSES`] bytes (one class per size), then one
/// per power of two from 2^5 to 2^63 (59 more).
pub(super) const GROUPS: usize = 64 - CLASS_BITS as usize + 1;

/// A distinct size present in a class: the size in bytes and its list's head
/// (never [`NIL`]: an emptied size leaves its class).
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) size: u64,
    pub(super) head: u32,
}

/// One group's classes, each its sizes sorted ascending.
pub(super) type Group = [Vec<Entry>; CLASSES];

/// One bucket's size classes.
pub(super) struct Bins {
    /// Bit `g`: group `g` has a non-empty class.
    pub(super) groups: u64,
    /// Per group, bit `c`: class `c` holds a size.
    pub(super) classes: [u32; GROUPS],
    /// Per group, its classes (made on the group's first size).
    pub(super) sizes: [Option<Box<Group>>; GROUPS],
}

impl Bins {
    pub(super) fn new() -> Box<Bins> {
        Box::new(Bins {
            groups: 0,
            classes: [0; GROUPS],
            sizes: std::array::from_fn(|_| None),
        })
    }

    /// The sizes of class (`g`, `c`); empty if the group was never used.
    pub(super) fn class(&self, g: usize, c: usize) -> &[Entry] {
        self.sizes[g].as_ref().map_or(&[], |group| &group[c])
    }

    /// The first non-empty class after (`g`, `c`), if any.
    pub(super) fn next_class(&self, g: usize, c: usize) -> Option<(usize, usize)> {
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
    pub(super) fn clear(&mut self, g: usize, c: usize) {
        self.classes[g] &= !(1 << c);
        if self.classes[g] == 0 {
            self.groups &= !(1 << g);
        }
    }

    /// The smallest size of at least `size` bytes: its class and position in it.
    pub(super) fn fit(&self, size: u64) -> Option<(usize, usize, usize)> {
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
pub(super) fn class_of(size: u64) -> (usize, usize) {
    if size < CLASSES as u64 {
        (0, size as usize)
    } else {
        // floor(log2(size)) >= CLASS_BITS.
        let fl = 63 - size.leading_zeros();
        let c = (size >> (fl - CLASS_BITS)) as usize & (CLASSES - 1);
        ((fl - CLASS_BITS + 1) as usize, c)
    }
}
