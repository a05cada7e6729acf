//! The caching allocator's block layout, rebuilt from a snapshot's events: the
//! rounding of a request, the blocks of each segment and how they split and merge,
//! and the allocator settings that decide it.

use std::collections::BTreeMap;

use crate::pickle::{Obj, ObjId, Pickle};

/// The caching allocator's smallest block and its rounding unit, bytes
/// (`kMinBlockSize`): a request is rounded up to a multiple of it, 512 at least.
pub const MIN_BLOCK_BYTES: u64 = 512;

/// The largest request the caching allocator serves from its small pool, bytes
/// (`kSmallSize`, 1 MiB). A split of a large block keeps a remainder only when it
/// is larger than this.
pub const SMALL_REQUEST_BYTES: u64 = 1 << 20;

/// The caching allocator's rounding of a request of `bytes` bytes (default
/// settings: no `roundup_power2_divisions`): [`MIN_BLOCK_BYTES`] below it, else
/// `bytes` rounded up to a multiple of it. Saturates at the largest multiple of 512
/// that fits in a `u64`.
pub fn round_request(bytes: u64) -> u64 {
    if bytes < MIN_BLOCK_BYTES {
        return MIN_BLOCK_BYTES;
    }
    bytes
        .checked_next_multiple_of(MIN_BLOCK_BYTES)
        .unwrap_or(u64::MAX / MIN_BLOCK_BYTES * MIN_BLOCK_BYTES)
}

/// One block of the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    /// Bytes.
    size: u64,
    allocated: bool,
    /// Address of the segment the block is in (blocks merge only within one).
    segment: u64,
}

/// The caching allocator's blocks, rebuilt from the events: per segment (from
/// `segment_alloc`, dropped at `segment_free`), blocks by address, each allocated or
/// free. An `alloc` at the start of a free block takes it whole or splits it as the
/// allocator does ([`BlockLayout::alloc`]); `free_completed` frees the block and
/// merges it with free neighbours of the same segment.
#[derive(Clone, Debug, Default)]
pub struct BlockLayout {
    blocks: BTreeMap<u64, Block>,
    /// `max_split_size` when set (bytes): a large block is split only for a request
    /// below it.
    max_split_bytes: Option<u64>,
}

impl BlockLayout {
    /// An empty layout. `max_split_bytes`: the allocator's `max_split_size`, bytes,
    /// `None` when unset (the snapshot's `-1`).
    pub fn new(max_split_bytes: Option<u64>) -> BlockLayout {
        BlockLayout {
            blocks: BTreeMap::new(),
            max_split_bytes,
        }
    }

    /// A segment of `size` bytes at `addr`: one free block.
    pub fn segment_alloc(&mut self, addr: u64, size: u64) {
        self.blocks.insert(
            addr,
            Block {
                size,
                allocated: false,
                segment: addr,
            },
        );
    }

    /// The segment at `addr` is released: its blocks are dropped.
    pub fn segment_free(&mut self, addr: u64) {
        let gone: Vec<u64> = self
            .blocks
            .range(addr..)
            .take_while(|(_, b)| b.segment == addr)
            .map(|(&a, _)| a)
            .collect();
        for a in gone {
            self.blocks.remove(&a);
        }
    }

    /// An allocation of `request` bytes at `addr`: the size of the block it got,
    /// bytes, or `None` when no free block of at least the rounded request starts at
    /// `addr` (the layout then is unchanged). With `r` the rounded request
    /// ([`round_request`]) and `B` the free block's size, the block is split into
    /// `r` and a free remainder of `B - r` at `addr + r` when the remainder is at
    /// least [`MIN_BLOCK_BYTES`] for a small request (`r` at most
    /// [`SMALL_REQUEST_BYTES`]), or more than [`SMALL_REQUEST_BYTES`] for a large one
    /// (and `r` is below `max_split_size` when that is set); else the whole `B` is
    /// allocated.
    pub fn alloc(&mut self, addr: u64, request: u64) -> Option<u64> {
        let r = round_request(request);
        let max_split = self.max_split_bytes;
        let block = self.blocks.get_mut(&addr)?;
        if block.allocated || block.size < r {
            return None;
        }
        let remaining = block.size - r;
        let split = if r <= SMALL_REQUEST_BYTES {
            remaining >= MIN_BLOCK_BYTES
        } else {
            max_split.is_none_or(|m| r < m) && remaining > SMALL_REQUEST_BYTES
        };
        block.allocated = true;
        if !split {
            return Some(block.size);
        }
        block.size = r;
        let segment = block.segment;
        self.blocks.insert(
            addr + r,
            Block {
                size: remaining,
                allocated: false,
                segment,
            },
        );
        Some(r)
    }

    /// The block at `addr` is free again (`free_completed`): it merges with the next
    /// block and the previous one when they are free and in the same segment.
    /// Nothing happens when no allocated block starts at `addr`.
    pub fn free(&mut self, addr: u64) {
        let Some(block) = self.blocks.get(&addr).copied() else {
            return;
        };
        if !block.allocated {
            return;
        }
        let mut size = block.size;
        let next_addr = addr.saturating_add(size);
        if let Some(next) = self.blocks.get(&next_addr).copied() {
            if !next.allocated && next.segment == block.segment {
                size += next.size;
                self.blocks.remove(&next_addr);
            }
        }
        let prev = self
            .blocks
            .range(..addr)
            .next_back()
            .map(|(&a, &b)| (a, b))
            .filter(|&(a, b)| {
                !b.allocated && b.segment == block.segment && a.saturating_add(b.size) == addr
            });
        if let Some((prev_addr, prev)) = prev {
            self.blocks.remove(&addr);
            self.blocks.insert(
                prev_addr,
                Block {
                    size: prev.size + size,
                    ..prev
                },
            );
        } else {
            self.blocks.insert(
                addr,
                Block {
                    size,
                    allocated: false,
                    segment: block.segment,
                },
            );
        }
    }
}

/// The allocator settings that decide the block layout.
pub(super) struct Settings {
    /// `max_split_size`, bytes, when set.
    pub(super) max_split_bytes: Option<u64>,
    /// Why the layout cannot be modelled, if it cannot.
    pub(super) not_modelled: Option<String>,
}

/// Reads `allocator_settings` of the snapshot's dict `top` (absent in older
/// snapshots: defaults).
pub(super) fn settings(p: &Pickle, top: ObjId) -> Settings {
    let mut s = Settings {
        max_split_bytes: None,
        not_modelled: None,
    };
    let Some(cfg) = p.get(top, "allocator_settings") else {
        return s;
    };
    if let Some(m) = p.get(cfg, "max_split_size").and_then(|v| p.int(v)) {
        s.max_split_bytes = u64::try_from(m).ok().filter(|&m| m < u64::MAX);
    }
    let mut why = Vec::new();
    if let Some(v) = p.get(cfg, "expandable_segments") {
        if p.obj(v) == Some(&Obj::Bool(true)) {
            why.push("expandable_segments is on".to_string());
        }
    }
    let nonzero = |v: ObjId| p.int(v).is_some_and(|n| n != 0);
    let divisions_set = match p.get(cfg, "roundup_power2_divisions") {
        Some(v) => match p.obj(v) {
            Some(Obj::Dict(pairs)) => pairs.iter().any(|&(_, x)| nonzero(x)),
            Some(Obj::List(l) | Obj::Tuple(l)) => l.iter().any(|&x| nonzero(x)),
            _ => nonzero(v),
        },
        None => false,
    };
    if divisions_set {
        why.push("roundup_power2_divisions are set".to_string());
    }
    if !why.is_empty() {
        s.not_modelled = Some(why.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_to_512_bytes() {
        assert_eq!(round_request(0), 512);
        assert_eq!(round_request(1), 512);
        assert_eq!(round_request(512), 512);
        assert_eq!(round_request(513), 1024);
        assert_eq!(round_request(u64::MAX), u64::MAX - 511);
    }

    #[test]
    fn small_blocks_split_when_512_bytes_remain() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 2 << 20);
        assert_eq!(l.alloc(0, 1000), Some(1024));
        // the remainder starts at 1024
        assert_eq!(l.alloc(1024, 2 << 20), None);
        assert_eq!(l.alloc(1024, 1 << 20), Some(1 << 20));
        // (2 MiB - 1024 - 1 MiB) left at 1024 + 1 MiB: a small request of all but
        // 256 bytes of it takes it whole (256 < 512 left)
        let rest = (2 << 20) - 1024 - (1 << 20);
        assert_eq!(l.alloc(1024 + (1 << 20), rest - 256), Some(rest));
        // freeing the middle block merges nothing (neighbours allocated)
        l.free(1024);
        l.free(0);
        // 0 and 1024 merged: a 1 MiB + 1024 free block at 0
        assert_eq!(l.alloc(0, (1 << 20) + 1024), Some((1 << 20) + 1024));
    }

    #[test]
    fn large_blocks_split_only_when_more_than_1_mib_remains() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 20 << 20);
        // 20 MiB - 19 MiB = 1 MiB remains: not split
        assert_eq!(l.alloc(0, 19 << 20), Some(20 << 20));
        l.free(0);
        // 2 MiB remain: split
        assert_eq!(l.alloc(0, 18 << 20), Some(18 << 20));
        assert_eq!(l.alloc(18 << 20, 2 << 20), Some(2 << 20));
        // max_split_size: no split of a request at or above it
        let mut l = BlockLayout::new(Some(4 << 20));
        l.segment_alloc(0, 20 << 20);
        assert_eq!(l.alloc(0, 4 << 20), Some(20 << 20));
        l.free(0);
        assert_eq!(l.alloc(0, 3 << 20), Some(3 << 20));
    }

    #[test]
    fn segment_free_drops_its_blocks_only() {
        let mut l = BlockLayout::new(None);
        l.segment_alloc(0, 2 << 20);
        l.segment_alloc(2 << 20, 2 << 20);
        assert_eq!(l.alloc(0, 512), Some(512));
        l.segment_free(0);
        assert_eq!(l.alloc(512, 512), None);
        // a free block of the other segment does not merge across segments
        assert_eq!(l.alloc(2 << 20, 512), Some(512));
        l.free(2 << 20);
        assert_eq!(l.alloc(2 << 20, 2 << 20), Some(2 << 20));
    }
}
