//! The trace being written: `a` and `f` lines from the allocation trace (block sizes
//! from the layout) or from the segment events, with the counts and live bytes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::events::{Ev, Field};
use super::layout::{round_request, BlockLayout, Settings};
use super::SnapshotError;

/// The trace being written, with its counts and live bytes.
#[derive(Default)]
pub(super) struct Writer {
    pub(super) body: String,
    /// Live allocations: address -> (bytes, index of the event that made it).
    pub(super) live: BTreeMap<u64, (u64, usize)>,
    pub(super) live_bytes: u64,
    pub(super) peak: u64,
    pub(super) allocations: u64,
    pub(super) frees: u64,
    pub(super) skipped_frees: u64,
    pub(super) rounded_blocks: u64,
}

impl Writer {
    /// `a 0xADDR BYTES`. Errors when `addr` is live, or when `[addr, addr + bytes)`
    /// overlaps a live allocation (two live blocks or segments never share a byte;
    /// a block's size here is at most the real block's: the layout's, or the
    /// request rounded as the caching allocator rounds it at least).
    fn alloc(&mut self, ev: &Ev<'_>, addr: u64, bytes: u64) -> Result<(), SnapshotError> {
        if let Some(&(_, since)) = self.live.get(&addr) {
            return Err(SnapshotError::Unsupported(format!(
                "{}: address {addr:#x} is live (allocated by event {since} and not freed): \
                 an inconsistent snapshot",
                ev.at()
            )));
        }
        let end = addr.saturating_add(bytes);
        let before = self
            .live
            .range(..addr)
            .next_back()
            .filter(|(&a, &(b, _))| a.saturating_add(b) > addr);
        let after = self.live.range(addr..end).next();
        if let Some((&a, &(b, since))) = before.or(after) {
            return Err(SnapshotError::Unsupported(format!(
                "{}: {addr:#x}..{end:#x} overlaps {a:#x}..{:#x}, live (allocated by event \
                 {since} and not freed): an inconsistent snapshot",
                ev.at(),
                a.saturating_add(b)
            )));
        }
        self.live.insert(addr, (bytes, ev.index));
        let _ = writeln!(self.body, "a {addr:#x} {bytes}");
        self.allocations += 1;
        self.live_bytes = self.live_bytes.saturating_add(bytes);
        self.peak = self.peak.max(self.live_bytes);
        Ok(())
    }

    /// `f 0xADDR` when `addr` is live, else a skipped free. Whether it was live.
    fn free(&mut self, addr: u64) -> bool {
        match self.live.remove(&addr) {
            Some((bytes, _)) => {
                let _ = writeln!(self.body, "f {addr:#x}");
                self.frees += 1;
                self.live_bytes = self.live_bytes.saturating_sub(bytes);
                true
            }
            None => {
                self.skipped_frees += 1;
                false
            }
        }
    }
}

/// The allocation trace: `alloc` -> `a` (block size from the layout),
/// `free_requested` -> `f`; `segment_alloc`, `segment_free` and `free_completed`
/// keep the layout.
pub(super) fn tensor_events(
    events: &[Ev<'_>],
    s: &Settings,
    w: &mut Writer,
) -> Result<(), SnapshotError> {
    let mut layout = BlockLayout::new(s.max_split_bytes);
    let modelled = s.not_modelled.is_none();
    for ev in events {
        match ev.action {
            "alloc" => {
                let addr = ev.uint(Field::Addr)?;
                let size = ev.uint(Field::Size)?;
                let block = if modelled {
                    layout.alloc(addr, size)
                } else {
                    None
                };
                let bytes = match block {
                    Some(b) => b,
                    None => {
                        w.rounded_blocks += 1;
                        round_request(size)
                    }
                };
                w.alloc(ev, addr, bytes)?;
            }
            "free_requested" => {
                w.free(ev.uint(Field::Addr)?);
            }
            "free_completed" => layout.free(ev.uint(Field::Addr)?),
            "segment_alloc" => layout.segment_alloc(ev.uint(Field::Addr)?, ev.uint(Field::Size)?),
            "segment_free" => layout.segment_free(ev.uint(Field::Addr)?),
            _ => {}
        }
    }
    Ok(())
}

/// The segment events: `segment_alloc` and `segment_map` -> `a`, `segment_free` and
/// `segment_unmap` -> `f`.
pub(super) fn segment_events(events: &[Ev<'_>], w: &mut Writer) -> Result<(), SnapshotError> {
    // Mapped ranges of expandable segments: address -> bytes.
    let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
    for ev in events {
        match ev.action {
            "segment_alloc" | "segment_map" => {
                let addr = ev.uint(Field::Addr)?;
                let size = ev.uint(Field::Size)?;
                if size == 0 {
                    return Err(SnapshotError::Unsupported(format!(
                        "{}: a segment of 0 bytes",
                        ev.at()
                    )));
                }
                w.alloc(ev, addr, size)?;
                if ev.action == "segment_map" {
                    mapped.insert(addr, size);
                }
            }
            "segment_free" => {
                w.free(ev.uint(Field::Addr)?);
            }
            "segment_unmap" => {
                let addr = ev.uint(Field::Addr)?;
                let end = addr.saturating_add(ev.uint(Field::Size)?);
                // The mappings that overlap [addr, end): each must lie inside it.
                let mut inside = Vec::new();
                let before = mapped.range(..addr).next_back().map(|(&a, &s)| (a, s));
                for (a, s) in before
                    .into_iter()
                    .chain(mapped.range(addr..end).map(|(&a, &s)| (a, s)))
                {
                    let a_end = a.saturating_add(s);
                    if a_end <= addr {
                        continue;
                    }
                    if a < addr || a_end > end {
                        return Err(SnapshotError::Unsupported(format!(
                            "{}: unmapping {addr:#x}..{end:#x} cuts the mapping \
                             {a:#x}..{a_end:#x} of an earlier segment_map in two; \
                             partial unmaps are not supported",
                            ev.at()
                        )));
                    }
                    inside.push(a);
                }
                if inside.is_empty() {
                    // Mapped before recording began.
                    w.skipped_frees += 1;
                }
                for a in inside {
                    mapped.remove(&a);
                    w.free(a);
                }
            }
            _ => {}
        }
    }
    Ok(())
}
