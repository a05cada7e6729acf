//! The books of each tag: its buckets, its live, idle and physical bytes, kept where
//! the pool's books move bytes (hand-out, free, index insert and removal, a heap's
//! handle booked or released).

use super::sleeping_segments::SegSleep;
use super::wake_zero::Zeroed;
use super::SleepMode;
use crate::driver::{DevicePtr, HostBuffer};
use crate::error::{Error, Result};
use crate::pool::books::{BucketKind, State, SYNC_FREED};
use crate::pool::segments::home_of;

/// The books of one tag.
#[derive(Debug, Default)]
pub(in crate::pool) struct TagBooks {
    /// The tag's bucket ([`BucketKind::Tag`]), made on first use (tags other than 0).
    pub(in crate::pool) bucket: Option<u32>,
    pub(in crate::pool) live_count: u64,
    pub(in crate::pool) live_bytes: u64,
    pub(in crate::pool) peak_live_bytes: u64,
    pub(in crate::pool) idle_bytes: u64,
    /// Physical bytes of its live allocations (awake, or asleep with a handle the
    /// driver kept).
    pub(in crate::pool) live_physical: u64,
    /// Asleep, with this mode.
    pub(in crate::pool) sleeping: Option<SleepMode>,
    /// A sleep or wake is running: allocations and frees of the tag are refused.
    pub(in crate::pool) busy: bool,
    /// Calls on the tag's memory in flight (tags other than 0; tag 0's are counted
    /// in the gate): a sleep or wake waits for none (`tag_gate.rs`).
    pub(in crate::pool) users: u32,
    /// Its offloaded contents, while asleep in offload mode.
    pub(in crate::pool) host: Option<HostBuffer>,
    /// While asleep: each live slot put to sleep and, offloaded, its bytes' offset in
    /// `host` (`u64::MAX`: not copied).
    pub(in crate::pool) asleep: Vec<(u32, u64)>,
    /// Segment mode, tags other than 0: bytes of the handles of the tag's heaps
    /// (mapped in a segment, or taken out of it for a release still running).
    pub(in crate::pool) seg_physical: u64,
    /// Segment mode, tags other than 0: bytes of the tag's live blocks, awake.
    pub(in crate::pool) seg_live: u64,
    /// While asleep in segment mode: the tag's segments put to sleep.
    pub(in crate::pool) seg_sleep: SegSleep,
    /// Its heap blocks freed with the synchronous `free` ([`BucketKind::TagBlocks`]),
    /// made on first use.
    pub(in crate::pool) blocks_bucket: Option<u32>,
    /// Capture buckets of its heap blocks freed during a capture, by the capture's
    /// own bucket ([`State::tag_capture_bucket`]).
    pub(in crate::pool) capture_buckets: std::collections::HashMap<u32, u32>,
    /// What its zeroing wakes zeroed (`wake_zero.rs`).
    pub(in crate::pool) zeroed: Zeroed,
}

impl TagBooks {
    fn blocked(&self) -> bool {
        self.sleeping.is_some() || self.busy
    }
}

impl State {
    /// The bucket an idle whole mapping freed into `bucket` goes to: a tagged
    /// mapping freed with the synchronous `free` goes to its tag's bucket; one freed
    /// anywhere else becomes tag 0's.
    pub(in crate::pool) fn tag_bucket_for(&mut self, slot: u32, bucket: u32) -> u32 {
        let (tag, block, seg) = {
            let m = self.mref(slot);
            (m.tag, m.is_block(), m.seg)
        };
        if block {
            // A block of a tag's own heap freed with the synchronous `free` waits
            // whole for the tag's synchronous allocations or a release point's
            // synchronize (`BucketKind::TagBlocks`), never in `SYNC_FREED`, which
            // tag 0's allocations take from.
            let seg_tag = self.segs.segs[seg as usize].tag;
            if seg_tag != 0 && bucket == SYNC_FREED {
                return self.tag_blocks_bucket(seg_tag);
            }
            return bucket;
        }
        if tag == 0 {
            return bucket;
        }
        let is_tag_bucket = matches!(
            self.buckets.get(bucket as usize).map(|b| b.kind),
            Some(BucketKind::Tag(_))
        );
        if bucket == crate::pool::books::SYNC_FREED || is_tag_bucket {
            return self.tag_bucket(tag);
        }
        self.mapping_mut(slot).tag = 0;
        bucket
    }

    /// The bucket of tag `tag` (not 0), made on first use.
    pub(in crate::pool) fn tag_bucket(&mut self, tag: u32) -> u32 {
        if let Some(b) = self.tags.get(&tag).and_then(|t| t.bucket) {
            return b;
        }
        let b = self.buckets.len() as u32;
        self.buckets
            .push(crate::pool::books::Bucket::new(BucketKind::Tag(tag)));
        self.tags.entry(tag).or_default().bucket = Some(b);
        b
    }

    /// `size` idle bytes into (`add`) or out of tag `tag`'s bucket.
    pub(in crate::pool) fn tag_idle_bytes(&mut self, tag: u32, size: u64, add: bool) {
        let t = self.tags.entry(tag).or_default();
        if add {
            t.idle_bytes += size;
        } else {
            t.idle_bytes = t.idle_bytes.saturating_sub(size);
        }
    }

    /// Live `slot` is no longer live: out of its tag's live counts (tags other than
    /// 0; the tag is kept on the mapping for [`State::tag_bucket_for`]).
    pub(in crate::pool) fn untag_live(&mut self, slot: u32) {
        let (tag, size, block) = {
            let m = self.mref(slot);
            (m.tag, m.size(), m.is_block())
        };
        if tag == 0 {
            return;
        }
        if let Some(t) = self.tags.get_mut(&tag) {
            t.live_count = t.live_count.saturating_sub(1);
            t.live_bytes = t.live_bytes.saturating_sub(size);
            if block {
                t.seg_live = t.seg_live.saturating_sub(size);
            } else {
                t.live_physical = t.live_physical.saturating_sub(size);
            }
        }
    }

    /// Live `ptr` (a whole mapping, or a block of the tag's heap), just handed out,
    /// becomes tag `tag`'s.
    pub(super) fn tag_live(&mut self, ptr: DevicePtr, tag: u32) {
        let Some(&slot) = self.live.get(&ptr) else {
            return;
        };
        let (size, block) = {
            let m = self.mapping_mut(slot);
            m.tag = tag;
            (m.size(), m.is_block())
        };
        let t = self.tags.entry(tag).or_default();
        t.live_count += 1;
        t.live_bytes += size;
        if block {
            t.seg_live += size;
        } else {
            t.live_physical += size;
        }
        t.peak_live_bytes = t.peak_live_bytes.max(t.live_bytes);
    }

    /// The tag whose heap `key` is: the tag of its home bucket when that is a tag's
    /// bucket, else 0.
    pub(in crate::pool) fn heap_tag(&self, key: u32) -> u32 {
        match self.buckets.get(home_of(key) as usize).map(|b| b.kind) {
            Some(BucketKind::Tag(t)) => t,
            _ => 0,
        }
    }

    /// `size` bytes of handles join (`add`) or leave segment `seg`'s heap: counted
    /// in its tag's books (tags other than 0; tag 0's census is the rest).
    pub(in crate::pool) fn tag_handle_bytes(&mut self, seg: u32, size: u64, add: bool) {
        let tag = self.segs.segs[seg as usize].tag;
        if tag == 0 {
            return;
        }
        let t = self.tags.entry(tag).or_default();
        if add {
            t.seg_physical += size;
        } else {
            t.seg_physical = t.seg_physical.saturating_sub(size);
        }
    }

    /// Whether `slot` is a block of a tag's own heap (tags other than 0).
    pub(in crate::pool) fn is_tag_block(&self, slot: u32) -> bool {
        let m = self.mref(slot);
        m.is_block() && self.segs.segs[m.seg as usize].tag != 0
    }

    /// The bucket of tag `tag`'s heap blocks freed with the synchronous `free`
    /// ([`BucketKind::TagBlocks`]), made on first use.
    pub(in crate::pool) fn tag_blocks_bucket(&mut self, tag: u32) -> u32 {
        if let Some(b) = self.tags.get(&tag).and_then(|t| t.blocks_bucket) {
            return b;
        }
        let b = self.buckets.len() as u32;
        self.buckets
            .push(crate::pool::books::Bucket::new(BucketKind::TagBlocks(tag)));
        self.tags.entry(tag).or_default().blocks_bucket = Some(b);
        b
    }

    /// The bucket where `slot`, freed during a capture, waits for the capture's
    /// release (`b`: the capture's bucket): `b` itself, or for a block of a tag's
    /// heap a bucket of the same kind that no allocation takes from (not registered
    /// for the capture's id): the capture's graph may replay into it, and no other
    /// tag's allocation may take a block of the tag's handles. Released with the
    /// capture's memory.
    pub(in crate::pool) fn tag_capture_bucket(&mut self, slot: u32, b: u32) -> u32 {
        if !self.is_tag_block(slot) {
            return b;
        }
        let tag = self.segs.segs[self.mref(slot).seg as usize].tag;
        if let Some(&own) = self.tags.get(&tag).and_then(|t| t.capture_buckets.get(&b)) {
            return own;
        }
        let kind = self.buckets[b as usize].kind;
        let own = self.buckets.len() as u32;
        self.buckets.push(crate::pool::books::Bucket::new(kind));
        self.tags
            .entry(tag)
            .or_default()
            .capture_buckets
            .insert(b, own);
        own
    }

    /// Error unless tag `tag` may allocate and free now (and have streams
    /// recorded on its allocations).
    pub(in crate::pool) fn tag_usable(&self, tag: u32) -> Result<()> {
        match self.tags.get(&tag) {
            Some(t) if t.blocked() => Err(Error::TagState {
                tag,
                reason: "the tag is asleep (or being put to sleep or woken): wake it first",
            }),
            _ => Ok(()),
        }
    }
}
