//! What the caller knows of its pools ([`Model`], [`Run`]) and the checks of the
//! pool's answers against it: allocations, frees, snapshots, tags, captures, and the
//! end of an input ([`finish`]).

use super::*;

/// One live allocation as the caller knows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Live {
    pub(crate) size: u64,
    pub(crate) tag: u32,
}

/// A pool and what the caller knows of it.
pub(crate) struct Model {
    pub(crate) pool: *mut FlarePool,
    pub(crate) live: BTreeMap<u64, Live>,
    /// Addresses freed (for second frees).
    pub(crate) freed: Vec<u64>,
    pub(crate) streams: Vec<FlareStream>,
    /// Streams being captured.
    pub(crate) captures: BTreeSet<usize>,
    pub(crate) sleeping: BTreeSet<u32>,
    pub(crate) scope_open: bool,
    /// Failures injected so far (each may fail one later call).
    pub(crate) injected: u32,
    /// Work launched or a capture begun: contract faults may be the caller's.
    pub(crate) caller_may_fault: bool,
}

impl Model {
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live.values().map(|l| l.size).sum()
    }
}

/// The calls of one input and what they know.
pub(crate) struct Run {
    pub(crate) pools: [Option<Model>; 2],
}

impl Run {
    /// The pool a call goes to (its slot), or none (the call gets NULL).
    pub(crate) fn pick_pool(&self, input: &mut Input<'_>) -> Option<usize> {
        let b = input.u8();
        if b % 16 == 15 {
            return None;
        }
        let i = usize::from(b % 2);
        self.pools[i].as_ref().map(|_| i)
    }

    pub(crate) fn handle(&self, slot: Option<usize>) -> *mut FlarePool {
        slot.and_then(|i| self.pools[i].as_ref())
            .map_or(ptr::null_mut(), |m| m.pool)
    }

    /// A pointer argument: NULL, a live one (of this pool or the other), an
    /// interior one, a freed one, or any address.
    pub(crate) fn pick_ptr(&self, input: &mut Input<'_>, slot: Option<usize>) -> u64 {
        let sel = input.u8() % 8;
        let i = usize::from(input.u16());
        let of = |s: usize| self.pools[s].as_ref();
        let mine = slot.and_then(of);
        let other = slot.and_then(|s| of(1 - s));
        let nth_live = |m: Option<&Model>| {
            m.filter(|m| !m.live.is_empty())
                .and_then(|m| m.live.iter().nth(i % m.live.len()))
                .map(|(&a, l)| (a, l.size))
        };
        match sel {
            0 => 0,
            1..=3 => nth_live(mine).map_or(0, |(a, _)| a),
            4 => nth_live(other).map_or(0, |(a, _)| a),
            5 => nth_live(mine).map_or(0, |(a, s)| a + 1 + u64::from(input.u32()) % s.max(1)),
            6 => mine
                .filter(|m| !m.freed.is_empty())
                .map_or(0, |m| m.freed[i % m.freed.len()]),
            _ => input.u64(),
        }
    }

    /// A stream argument: NULL (the legacy stream), one of this pool's, one of the
    /// other pool's, or any handle.
    pub(crate) fn pick_stream(&self, input: &mut Input<'_>, slot: Option<usize>) -> FlareStream {
        let sel = input.u8() % 8;
        let i = usize::from(input.u8());
        let streams = |s: Option<usize>| {
            s.and_then(|s| self.pools[s].as_ref())
                .map_or(&[][..], |m| &m.streams[..])
        };
        let pick = |v: &[FlareStream]| {
            if v.is_empty() {
                ptr::null_mut()
            } else {
                v[i % v.len()]
            }
        };
        match sel {
            0 | 1 => ptr::null_mut(),
            2..=5 => pick(streams(slot)),
            6 => pick(streams(slot.map(|s| 1 - s))),
            _ => input.u64() as usize as FlareStream,
        }
    }

    pub(crate) fn model(&mut self, slot: Option<usize>) -> Option<&mut Model> {
        slot.and_then(|i| self.pools[i].as_mut())
    }

    /// Records a successful allocation of `size` bytes for `tag` at `addr`: not live
    /// already, overlapping nothing live, aligned to 512 bytes.
    pub(crate) fn allocated(&mut self, slot: Option<usize>, addr: u64, size: u64, tag: u32) {
        let m = self
            .model(slot)
            .expect("an allocation succeeded on a NULL pool");
        assert_ne!(addr, 0, "an allocation returned NULL");
        assert_eq!(addr % 512, 0, "an allocation at {addr:#x}: not 512-aligned");
        assert!(
            !m.sleeping.contains(&tag),
            "an allocation for sleeping tag {tag}"
        );
        let end = addr
            .checked_add(size)
            .expect("an allocation past the address space");
        if let Some((&a, l)) = m.live.range(..end).next_back() {
            assert!(
                a + l.size <= addr,
                "{addr:#x}+{size} overlaps the live {a:#x}+{}",
                l.size
            );
        }
        m.live.insert(addr, Live { size, tag });
        m.freed.retain(|&f| f != addr);
    }

    /// Checks a free's (or `record_stream`'s) status against what the caller knows,
    /// and records a successful free.
    pub(crate) fn freed(
        &mut self,
        call: &str,
        slot: Option<usize>,
        addr: u64,
        s: Status,
        frees: bool,
    ) {
        let Some(m) = self.model(slot) else {
            assert_eq!(s, INVALID, "{call} on a NULL pool");
            return;
        };
        if addr == 0 {
            assert_eq!(s, SUCCESS, "{call}(NULL): {}", last_error());
            return;
        }
        let want = match m.live.get(&addr) {
            None => UNKNOWN_POINTER,
            Some(l) if m.sleeping.contains(&l.tag) => TAG_STATE,
            Some(_) => SUCCESS,
        };
        assert_eq!(s, want, "{call}({addr:#x}): {}", last_error());
        if s == SUCCESS && frees {
            m.live.remove(&addr);
            m.freed.push(addr);
        }
    }
}

/// A snapshot's checks: the caller's counts, the documented invariants.
pub(crate) fn check_snapshot(m: &Model, s: &FlareSnapshot) {
    assert_eq!(s.live_count, m.live.len() as u64, "live_count");
    assert_eq!(
        s.live_requested_bytes,
        m.live_bytes(),
        "live_requested_bytes"
    );
    assert_eq!(s.scope_open, u32::from(m.scope_open), "scope_open");
    assert_eq!(s.tags_sleeping, m.sleeping.len() as u64, "tags_sleeping");
    assert_eq!(
        s.allocations,
        s.frees + s.live_count,
        "allocations == frees + live"
    );
    assert_eq!(
        s.physical_bytes,
        s.live_mapped_bytes
            + s.idle_bytes
            + s.pending_bytes
            + s.segment_mapped_bytes
            + s.sleeping_held_bytes,
        "physical bytes: {s:?}"
    );
    assert_eq!(
        s.segment_mapped_bytes,
        s.block_live_bytes + s.block_free_bytes,
        "segment bytes: {s:?}"
    );
    assert!(s.block_live_count <= s.live_count, "{s:?}");
    assert!(s.physical_bytes <= s.peak_physical_bytes, "{s:?}");
}

/// Whether tag `tag` of `pool` sleeps, as its census says.
pub(crate) fn census_sleeping(pool: *mut FlarePool, tag: u32) -> bool {
    let mut buf = Buf::versioned(size_of::<FlareTagCensus>() as u32);
    // SAFETY: a live pool; a buffer larger than the struct.
    let s = unsafe { flare_pool_tag_census(pool, tag, buf.0.as_mut_ptr().cast()) };
    assert_eq!(s, SUCCESS, "census: {}", last_error());
    buf.read::<FlareTagCensus>().sleeping == 1
}

/// A tag: mostly a few small ones (so that they meet), sometimes any.
pub(crate) fn pick_tag(input: &mut Input<'_>) -> u32 {
    match input.u8() % 8 {
        7 => input.u32(),
        t => u32::from(t % 3),
    }
}

pub(crate) fn end_capture(
    run: &mut Run,
    slot: Option<usize>,
    stream: FlareStream,
    out: Out,
) -> Status {
    let pool = run.handle(slot);
    let mut out_slot = [SLOT_CANARY; 2];
    let p = out.ptr::<c_int>(&mut out_slot);
    // SAFETY: `pool` NULL or live; `p` NULL, misaligned or writable.
    let s = unsafe { flare_sim_end_capture(pool, stream, p) };
    check_status("end_capture", s);
    if s != SUCCESS {
        assert_eq!(out_slot, [SLOT_CANARY; 2]);
    } else if let Some(m) = run.model(slot) {
        assert!(
            m.captures.remove(&(stream as usize)),
            "ended a capture never begun"
        );
        let valid = out_slot[0] as u32;
        assert!(valid <= 1, "out_valid {valid}");
    }
    s
}

/// The end of an input, for the pool in `slot`: every capture ended, the scope
/// closed, every tag woken, every allocation freed; then the pool holds nothing
/// live, and its destroy report says so.
pub(crate) fn finish(run: &mut Run, slot: usize) {
    let Some(m) = run.pools[slot].as_ref() else {
        return;
    };
    let pool = m.pool;
    let retries = m.injected + 2;
    for stream in m.captures.clone() {
        let s = end_capture(run, Some(slot), stream as FlareStream, Out::Valid);
        assert_eq!(s, SUCCESS, "ending a capture: {}", last_error());
    }
    let Some(m) = run.pools[slot].as_mut() else {
        return;
    };
    if m.scope_open {
        // SAFETY: a live pool.
        let s = unsafe { flare_retention_finish(pool) };
        check_status("finish", s);
        assert_ne!(s, SCOPE_STATE);
        m.scope_open = false;
    }
    // Free what is awake, wake the tags that sleep (a wake may fail once per
    // injected failure, and for want of memory), then free what they held.
    free_awake(m);
    for tag in m.sleeping.clone() {
        for _ in 0..retries {
            // SAFETY: a live pool.
            let s = unsafe { flare_pool_wake(pool, tag) };
            check_status("wake", s);
            if s == SUCCESS {
                m.sleeping.remove(&tag);
                break;
            }
        }
    }
    free_awake(m);
    let mut snap = Buf::versioned(size_of::<FlareSnapshot>() as u32);
    // SAFETY: a live pool; a buffer larger than the struct.
    let s = unsafe { flare_pool_snapshot(pool, snap.0.as_mut_ptr().cast()) };
    assert_eq!(s, SUCCESS);
    check_snapshot(m, &snap.read());
    let mut report = Buf::versioned(size_of::<FlareDestroyReport>() as u32);
    // SAFETY: a live pool, no other call on it; a buffer larger than the struct.
    let s = unsafe { flare_pool_destroy_report(pool, report.0.as_mut_ptr().cast()) };
    check_status("destroy_report", s);
    let r: FlareDestroyReport = report.read();
    assert_eq!(r.live_count, m.live.len() as u64, "leaked: {r:?}");
    assert_eq!(r.live_requested_bytes, m.live_bytes(), "leaked: {r:?}");
    run.pools[slot] = None;
}

/// Frees every live allocation of an awake tag: each free must succeed.
pub(crate) fn free_awake(m: &mut Model) {
    let awake: Vec<u64> = m
        .live
        .iter()
        .filter(|(_, l)| !m.sleeping.contains(&l.tag))
        .map(|(&a, _)| a)
        .collect();
    for addr in awake {
        // SAFETY: a live pool; the pointer only compared.
        let s = unsafe { flare_package_free(m.pool, addr as usize as *mut c_void) };
        assert_eq!(s, SUCCESS, "freeing live {addr:#x}: {}", last_error());
        m.live.remove(&addr);
    }
}
