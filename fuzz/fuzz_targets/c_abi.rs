//! The C ABI's argument checks (`src/ffi`): the input is read as a sequence of C
//! calls on up to two simulated pools (configurations of arbitrary bytes and
//! `struct_size`, arbitrary sizes, pointers the pool never handed out, interior and
//! freed ones, bad enum values, NULL and misaligned outputs, versioned structs of any
//! `struct_size`, streams of another pool), each checked against what the header
//! promises:
//! - no panic, caught or not (libfuzzer-sys aborts at the panic itself, so a panic
//!   the boundary would turn into `FLARE_STATUS_INTERNAL` is a finding too);
//! - outputs are written only on success, and never past the caller's
//!   `struct_size` or buffer length;
//! - the pool's books agree with the caller's: what it hands out is not live
//!   already and overlaps nothing live; a free succeeds for a live pointer of an
//!   awake tag and for nothing else; the snapshot's counts are the caller's and its
//!   documented invariants hold; the scope and tag states follow the calls;
//! - at the end, once every capture is ended, the scope closed, every tag woken and
//!   every allocation freed, the pool holds nothing live, and its destroy report
//!   says so (nothing leaked).
//!
//! The backend is always the simulated one (a configuration asking for CUDA gets
//! the simulated backend instead): the target needs no GPU and no driver.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::ptr;

use flare_package::ffi::*;
use libfuzzer_sys::fuzz_target;

type Status = FlareStatus;
const SUCCESS: Status = FlareStatus::FLARE_STATUS_SUCCESS;
const INVALID: Status = FlareStatus::FLARE_STATUS_INVALID_ARGUMENT;
const UNKNOWN_POINTER: Status = FlareStatus::FLARE_STATUS_UNKNOWN_POINTER;
const SCOPE_STATE: Status = FlareStatus::FLARE_STATUS_SCOPE_STATE;
const TAG_STATE: Status = FlareStatus::FLARE_STATUS_TAG_STATE;
const INTERNAL: Status = FlareStatus::FLARE_STATUS_INTERNAL;

/// The most calls one input makes.
const MAX_CALLS: usize = 256;
/// The most allocations an input may hold live in one pool (a bound on the work of
/// the end-of-input checks).
const MAX_LIVE: usize = 512;
/// The largest simulated device a configuration gets, bytes.
const MAX_SIM_CAPACITY: u64 = 1 << 30;
/// The byte every caller buffer is filled with before a call: a byte still equal to
/// it afterwards was not written.
const CANARY: u8 = 0xA5;
/// Bytes of every caller struct buffer: more than the largest `struct_size` a
/// versioned struct takes (4096).
const BUF_BYTES: usize = 4160;

/// A caller's struct buffer: 8-aligned, as a C struct of `uint64_t` fields is.
#[repr(C, align(8))]
struct Buf([u8; BUF_BYTES]);

impl Buf {
    /// The canary everywhere, `struct_size` in the first 4 bytes.
    fn versioned(struct_size: u32) -> Box<Buf> {
        let mut b = Box::new(Buf([CANARY; BUF_BYTES]));
        b.0[..4].copy_from_slice(&struct_size.to_ne_bytes());
        b
    }

    /// Whether `bytes[from..]` were all left alone.
    fn untouched_from(&self, from: usize) -> bool {
        self.0[from.min(BUF_BYTES)..].iter().all(|&b| b == CANARY)
    }

    /// Reads a `T` at the start (a copy: the library's struct, as C sees it).
    fn read<T: Copy>(&self) -> T {
        assert!(size_of::<T>() <= BUF_BYTES);
        // SAFETY: the buffer is 8-aligned and larger than `T`; `T` is one of the C
        // ABI's structs of integers, for which any bytes are a value.
        unsafe { ptr::read(self.0.as_ptr().cast::<T>()) }
    }
}

/// The input as a stream of values; each read takes what it needs, and reads 0
/// once the input is spent.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    /// A size: small, a few MiB, 32 bits or any 64 bits.
    fn size(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => u64::from(self.u16()),
            1 => u64::from(self.u8()) << 20,
            2 => u64::from(self.u32()),
            _ => self.u64(),
        }
    }
    /// A `struct_size` for a struct of `size` bytes: its size, one near it, or any.
    fn struct_size(&mut self, size: usize) -> u32 {
        let size = size as u32;
        match self.u8() % 4 {
            0 | 1 => size,
            2 => u32::from(self.u16()) % (size + 16),
            _ => self.u32(),
        }
    }
}

/// One live allocation as the caller knows it.
#[derive(Clone, Copy, Debug)]
struct Live {
    size: u64,
    tag: u32,
}

/// A pool and what the caller knows of it.
struct Model {
    pool: *mut FlarePool,
    live: BTreeMap<u64, Live>,
    /// Addresses freed (for second frees).
    freed: Vec<u64>,
    streams: Vec<FlareStream>,
    /// Streams being captured.
    captures: BTreeSet<usize>,
    sleeping: BTreeSet<u32>,
    scope_open: bool,
    /// Failures injected so far (each may fail one later call).
    injected: u32,
    /// Work launched or a capture begun: contract faults may be the caller's.
    caller_may_fault: bool,
}

impl Model {
    fn live_bytes(&self) -> u64 {
        self.live.values().map(|l| l.size).sum()
    }
}

/// What no call may return (beyond the rules checked at each call):
/// `FLARE_STATUS_INTERNAL`, a panic caught at the boundary or a poisoned pool.
///
/// A failure is a clear error: the thread's last error message names the function,
/// on one line of at most 1 KiB.
fn check_status(call: &str, s: Status) {
    if tracing() {
        eprintln!("  {call} -> {s:?}");
    }
    LAST_STATUS.set(Some(s));
    if s == SUCCESS {
        return;
    }
    let message = last_error();
    assert_ne!(s, INTERNAL, "{call}: {message}");
    assert!(
        message.starts_with("flare_") && !message.contains('\n') && message.len() <= 1024,
        "{call}: {s:?} with the message {message:?}"
    );
}

thread_local! {
    /// The status of the last call checked.
    static LAST_STATUS: std::cell::Cell<Option<Status>> = const { std::cell::Cell::new(None) };
}

/// Statuses after which nothing changed (the header's `FlareStatus`).
const NOTHING_CHANGED: [Status; 5] = [
    INVALID,
    UNKNOWN_POINTER,
    SCOPE_STATE,
    TAG_STATE,
    FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE,
];

/// The pool's counters (`None` for a NULL pool).
fn counters(pool: *mut FlarePool) -> Option<FlareSnapshot> {
    if pool.is_null() {
        return None;
    }
    let mut buf = Buf::versioned(size_of::<FlareSnapshot>() as u32);
    // SAFETY: a live pool; a buffer larger than the struct.
    let s = unsafe { flare_pool_snapshot(pool, buf.0.as_mut_ptr().cast()) };
    assert_eq!(s, SUCCESS);
    Some(buf.read())
}

/// Whether `FLARE_FUZZ_TRACE` is set: each call and its status are printed (to
/// read a finding: `FLARE_FUZZ_TRACE=1 c_abi fuzz/artifacts/c_abi/crash-...`).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FLARE_FUZZ_TRACE").is_some())
}

fn last_error() -> String {
    let mut buf = [0u8; 2048];
    // SAFETY: `buf` has 2048 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    let mut text = String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned();
    if n >= buf.len() {
        text.push_str(&format!("... ({n} bytes)"));
    }
    text
}

/// A caller's configuration: `flare_pool_config_init` with an arbitrary size, then
/// fields overwritten with arbitrary values. Owns what its pointers point to.
struct Config {
    buf: Box<Buf>,
    peers: Box<[i32; 1024]>,
}

/// Record paths a configuration may name: none is a file the target writes (an
/// empty path is refused; a missing directory stops the recording at once).
const RECORD_PATHS: [&CStr; 2] = [c"", c"/nonexistent-flare-fuzz-dir/recorded.trace"];

fn config(input: &mut Input<'_>) -> Config {
    let mut buf = Box::new(Buf([CANARY; BUF_BYTES]));
    let size = size_of::<FlarePoolConfig>();
    let init = usize::from(input.u16()) % (BUF_BYTES + 1);
    match input.u8() % 8 {
        0 => {
            // SAFETY: NULL is a documented no-op.
            unsafe { flare_pool_config_init(ptr::null_mut(), init) };
        }
        1 => {
            // Misaligned: nothing written.
            let p = buf.0.as_mut_ptr().wrapping_add(1).cast::<FlarePoolConfig>();
            // SAFETY: `init <= BUF_BYTES - 1` bytes from offset 1 are writable.
            unsafe { flare_pool_config_init(p, init.min(BUF_BYTES - 1)) };
            assert!(
                buf.untouched_from(0),
                "config_init wrote to a misaligned struct"
            );
        }
        _ => {
            // SAFETY: `buf` has `init <= BUF_BYTES` writable bytes.
            unsafe { flare_pool_config_init(buf.0.as_mut_ptr().cast(), init) };
            assert!(
                buf.untouched_from(init.min(size)),
                "config_init({init}) wrote past min({init}, sizeof = {size})"
            );
            if init >= size {
                let c: FlarePoolConfig = buf.read();
                assert_eq!(c.struct_size as usize, size);
            }
        }
    }
    let mut peers = Box::new([0i32; 1024]);
    for p in peers.iter_mut().take(usize::from(input.u8() % 8)) {
        *p = i32::from(input.u8() as i8);
    }
    let mut c: FlarePoolConfig = buf.read();
    // The pointer fields are always the caller's choice (NULL unless set below):
    // any other bytes there (the buffer's canary past what config_init wrote) would
    // be a caller's bug, not the library's.
    let mut peer_devices = ptr::null();
    let mut record_path = ptr::null();
    for _ in 0..input.u8() % 6 {
        let v = input.u64();
        match input.u8() % 14 {
            0 => c.struct_size = input.struct_size(size),
            1 => c.backend = v as u32,
            2 => c.device = v as i32,
            3 => c.reuse_policy = v as u32 % 5,
            4 => c.release_threshold_bytes = v,
            5 => {
                peer_devices = match v % 3 {
                    0 => ptr::null(),
                    1 => peers.as_ptr(),
                    _ => peers.as_ptr().cast::<u8>().wrapping_add(1).cast(),
                };
                c.peer_device_count = input.u16().into();
            }
            6 => c.sim_capacity_bytes = v,
            7 => {
                c.sim_granularity_bytes = if v.is_multiple_of(2) {
                    1 << (v % 40)
                } else {
                    v
                }
            }
            8 => c.sim_device_count = v as u32,
            9 => c.best_fit_max_waste_percent = v as u32,
            10 => c.cross_stream_reuse = v as u32 % 4,
            11 => c.segment_whole_threshold_bytes = v,
            12 => {
                c.thread_cache_entries = v as u32;
                c.thread_cache_bytes = input.u64();
            }
            _ => {
                record_path = match v % 4 {
                    0 | 1 => ptr::null(),
                    i => RECORD_PATHS[(i - 2) as usize].as_ptr(),
                };
            }
        }
    }
    c.peer_devices = peer_devices;
    c.record_path = record_path;
    // Never the real driver: the simulated backend instead.
    if c.backend == FlareBackend::FLARE_BACKEND_CUDA as u32 {
        c.backend = FlareBackend::FLARE_BACKEND_SIMULATED as u32;
    }
    // A simulated device of at most 1 GiB (0, the default, would be 140 GiB): the
    // simulated driver's copies (an offload sleep, its wake) take time linear in the
    // bytes copied, a page of 4 KiB at a time, so a sleep of 100 GiB takes seconds,
    // a time no input's length bounds.
    c.sim_capacity_bytes = match c.sim_capacity_bytes {
        0 => MAX_SIM_CAPACITY,
        v => v.min(MAX_SIM_CAPACITY),
    };
    // SAFETY: the buffer is 8-aligned and larger than the struct.
    unsafe { ptr::write(buf.0.as_mut_ptr().cast::<FlarePoolConfig>(), c) };
    Config { buf, peers }
}

/// The calls of one input and what they know.
struct Run {
    pools: [Option<Model>; 2],
}

/// An output slot for a call: valid, NULL or misaligned.
enum Out {
    Valid,
    Null,
    Misaligned,
}

impl Out {
    fn pick(input: &mut Input<'_>) -> Out {
        match input.u8() % 8 {
            0 => Out::Null,
            1 => Out::Misaligned,
            _ => Out::Valid,
        }
    }
    /// The pointer for a slot of `T` in `slot` (a `[u64; 2]`, 8-aligned).
    fn ptr<T>(&self, slot: &mut [u64; 2]) -> *mut T {
        match self {
            Out::Valid => slot.as_mut_ptr().cast(),
            Out::Null => ptr::null_mut(),
            Out::Misaligned => slot.as_mut_ptr().cast::<u8>().wrapping_add(1).cast(),
        }
    }
}

const SLOT_CANARY: u64 = 0xA5A5_A5A5_A5A5_A5A5;

impl Run {
    /// The pool a call goes to (its slot), or none (the call gets NULL).
    fn pick_pool(&self, input: &mut Input<'_>) -> Option<usize> {
        let b = input.u8();
        if b % 16 == 15 {
            return None;
        }
        let i = usize::from(b % 2);
        self.pools[i].as_ref().map(|_| i)
    }

    fn handle(&self, slot: Option<usize>) -> *mut FlarePool {
        slot.and_then(|i| self.pools[i].as_ref())
            .map_or(ptr::null_mut(), |m| m.pool)
    }

    /// A pointer argument: NULL, a live one (of this pool or the other), an
    /// interior one, a freed one, or any address.
    fn pick_ptr(&self, input: &mut Input<'_>, slot: Option<usize>) -> u64 {
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
    fn pick_stream(&self, input: &mut Input<'_>, slot: Option<usize>) -> FlareStream {
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

    fn model(&mut self, slot: Option<usize>) -> Option<&mut Model> {
        slot.and_then(|i| self.pools[i].as_mut())
    }

    /// Records a successful allocation of `size` bytes for `tag` at `addr`: not live
    /// already, overlapping nothing live, aligned to 512 bytes.
    fn allocated(&mut self, slot: Option<usize>, addr: u64, size: u64, tag: u32) {
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
    fn freed(&mut self, call: &str, slot: Option<usize>, addr: u64, s: Status, frees: bool) {
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
fn check_snapshot(m: &Model, s: &FlareSnapshot) {
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

/// The fields of a versioned struct of `size` bytes written for `struct_size`: the
/// ends of those lying wholly inside both.
fn written_end(struct_size: u32, size: usize) -> usize {
    (struct_size as usize).min(size)
}

fn snapshot(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>) {
    let size = size_of::<FlareSnapshot>();
    let struct_size = input.struct_size(size);
    let mut buf = Buf::versioned(struct_size);
    let out = Out::pick(input);
    let p = match out {
        Out::Valid => buf.0.as_mut_ptr().cast::<FlareSnapshot>(),
        Out::Null => ptr::null_mut(),
        Out::Misaligned => buf.0.as_mut_ptr().wrapping_add(4).cast(),
    };
    // SAFETY: `p` is NULL, misaligned, or has `BUF_BYTES >= struct_size` (when
    // accepted, at most 4096) writable bytes.
    let s = unsafe { flare_pool_snapshot(run.handle(slot), p) };
    check_status("flare_pool_snapshot", s);
    let ok_size = (8..=4096).contains(&struct_size);
    if s != SUCCESS {
        assert!(buf.untouched_from(4), "a failed snapshot wrote its output");
        return;
    }
    assert!(matches!(out, Out::Valid) && ok_size && slot.is_some());
    assert!(buf.untouched_from(written_end(struct_size, size)));
    assert_eq!(
        buf.0[..4],
        struct_size.to_ne_bytes(),
        "struct_size was written"
    );
    if struct_size as usize >= size {
        let m = run.model(slot).expect("a snapshot of a NULL pool");
        check_snapshot(m, &buf.read());
    }
}

fn census(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>) {
    let size = size_of::<FlareTagCensus>();
    let tag = pick_tag(input);
    let struct_size = input.struct_size(size);
    let mut buf = Buf::versioned(struct_size);
    let p = if input.u8().is_multiple_of(8) {
        ptr::null_mut()
    } else {
        buf.0.as_mut_ptr().cast::<FlareTagCensus>()
    };
    // SAFETY: as for the snapshot.
    let s = unsafe { flare_pool_tag_census(run.handle(slot), tag, p) };
    check_status("flare_pool_tag_census", s);
    if s != SUCCESS {
        assert!(buf.untouched_from(4), "a failed census wrote its output");
        return;
    }
    assert!(buf.untouched_from(written_end(struct_size, size)));
    if struct_size as usize >= size {
        let m = run.model(slot).expect("a census of a NULL pool");
        let c: FlareTagCensus = buf.read();
        assert_eq!(
            c.sleeping,
            u32::from(m.sleeping.contains(&tag)),
            "tag {tag}"
        );
        let live: Vec<&Live> = m.live.values().filter(|l| l.tag == tag).collect();
        assert_eq!(c.live_count, live.len() as u64, "tag {tag}: {c:?}");
    }
}

/// Whether tag `tag` of `pool` sleeps, as its census says.
fn census_sleeping(pool: *mut FlarePool, tag: u32) -> bool {
    let mut buf = Buf::versioned(size_of::<FlareTagCensus>() as u32);
    // SAFETY: a live pool; a buffer larger than the struct.
    let s = unsafe { flare_pool_tag_census(pool, tag, buf.0.as_mut_ptr().cast()) };
    assert_eq!(s, SUCCESS, "census: {}", last_error());
    buf.read::<FlareTagCensus>().sleeping == 1
}

/// A tag: mostly a few small ones (so that they meet), sometimes any.
fn pick_tag(input: &mut Input<'_>) -> u32 {
    match input.u8() % 8 {
        7 => input.u32(),
        t => u32::from(t % 3),
    }
}

/// Destroys the pool in `slot` with a report of an arbitrary `struct_size` (or
/// with `flare_pool_destroy`), checking what it says was released.
fn destroy(run: &mut Run, input: &mut Input<'_>, slot: usize, plain: bool) {
    let Some(m) = run.pools[slot].as_ref() else {
        return;
    };
    if plain {
        // SAFETY: a live pool, no other call on it.
        let s = unsafe { flare_pool_destroy(m.pool) };
        check_status("flare_pool_destroy", s);
        run.pools[slot] = None;
        return;
    }
    let size = size_of::<FlareDestroyReport>();
    let struct_size = input.struct_size(size);
    let mut buf = Buf::versioned(struct_size);
    let p = if input.u8().is_multiple_of(8) {
        ptr::null_mut()
    } else {
        buf.0.as_mut_ptr().cast::<FlareDestroyReport>()
    };
    // SAFETY: a live pool, no other call on it; `p` as for the snapshot.
    let s = unsafe { flare_pool_destroy_report(m.pool, p) };
    check_status("flare_pool_destroy_report", s);
    if s == INVALID {
        // The pool is not destroyed; nothing is written.
        assert!(buf.untouched_from(4));
        return;
    }
    assert!(buf.untouched_from(written_end(struct_size, size)));
    if struct_size as usize >= size {
        let r: FlareDestroyReport = buf.read();
        assert_eq!(r.live_count, m.live.len() as u64, "released: {r:?}");
        assert_eq!(r.live_requested_bytes, m.live_bytes(), "released: {r:?}");
        assert_eq!(r.scope_was_open, u32::from(m.scope_open), "released: {r:?}");
    }
    run.pools[slot] = None;
}

fn create(run: &mut Run, input: &mut Input<'_>) {
    let slot = usize::from(input.u8() % 2);
    let c = config(input);
    let out = Out::pick(input);
    let mut out_slot = [SLOT_CANARY; 2];
    let p = out.ptr::<*mut FlarePool>(&mut out_slot);
    let cfg = if input.u8().is_multiple_of(16) {
        ptr::null()
    } else {
        c.buf.0.as_ptr().cast::<FlarePoolConfig>()
    };
    // SAFETY: `cfg` is NULL or an 8-aligned buffer of `BUF_BYTES` bytes (more than
    // any accepted `struct_size`), its `peer_devices` NULL, misaligned, or `c.peers`
    // (1024 values; a larger count is refused) and its `record_path` NULL or a
    // static C string; `p` is NULL, misaligned or an 8-aligned slot.
    let s = unsafe { flare_pool_create(cfg, p) };
    drop(c.peers);
    check_status("flare_pool_create", s);
    if s != SUCCESS {
        assert_eq!(
            out_slot, [SLOT_CANARY; 2],
            "a failed create wrote its output"
        );
        return;
    }
    let pool = out_slot[0] as *mut FlarePool;
    assert!(!pool.is_null() && out_slot[1] == SLOT_CANARY);
    if run.pools[slot].is_some() {
        destroy(run, input, slot, true);
    }
    run.pools[slot] = Some(Model {
        pool,
        live: BTreeMap::new(),
        freed: Vec::new(),
        streams: Vec::new(),
        captures: BTreeSet::new(),
        sleeping: BTreeSet::new(),
        scope_open: false,
        injected: 0,
        caller_may_fault: false,
    });
}

/// An allocation call (0: synchronous, 1: stream-ordered, 2: tagged).
fn allocate(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>, kind: u8) {
    if run.model(slot).is_some_and(|m| m.live.len() >= MAX_LIVE) {
        return;
    }
    let size = input.size();
    let Ok(size_arg) = usize::try_from(size) else {
        return;
    };
    let stream = run.pick_stream(input, slot);
    let tag = if kind == 2 { pick_tag(input) } else { 0 };
    let out = Out::pick(input);
    let mut out_slot = [SLOT_CANARY; 2];
    let p = out.ptr::<*mut c_void>(&mut out_slot);
    let pool = run.handle(slot);
    // SAFETY: `pool` NULL or live; `p` NULL, misaligned or writable; `stream` a
    // handle the simulated driver checks.
    let s = unsafe {
        match kind {
            0 => flare_package_allocate(pool, size_arg, p),
            1 => flare_package_allocate_async(pool, size_arg, stream, p),
            _ => flare_package_allocate_tagged(pool, size_arg, stream, tag, p),
        }
    };
    check_status("allocate", s);
    if tracing() {
        eprintln!("  kind {kind}, {size} bytes, tag {tag}: {:#x}", out_slot[0]);
    }
    if s != SUCCESS {
        assert_eq!(
            out_slot, [SLOT_CANARY; 2],
            "a failed allocation wrote its output"
        );
        if s == TAG_STATE {
            assert!(run.model(slot).is_some_and(|m| m.sleeping.contains(&tag)));
        }
        return;
    }
    assert!(size > 0, "an allocation of 0 bytes succeeded");
    assert_eq!(out_slot[1], SLOT_CANARY);
    run.allocated(slot, out_slot[0], size, tag);
}

/// Runs one call; `false` when the input is spent.
fn step(run: &mut Run, input: &mut Input<'_>) -> bool {
    if input.0.is_empty() {
        return false;
    }
    let op = input.u8() % 27;
    if op == 0 {
        create(run, input);
        return true;
    }
    let slot = run.pick_pool(input);
    let pool = run.handle(slot);
    if tracing() {
        eprintln!("op {op} on pool {slot:?}");
    }
    // What a refused call must leave as it was.
    let before = if matches!(op, 1 | 2) {
        None
    } else {
        counters(pool)
    };
    LAST_STATUS.set(None);
    match op {
        1 | 2 => {
            if let Some(i) = slot {
                destroy(run, input, i, op == 1);
            }
        }
        3..=5 => allocate(run, input, slot, op - 3),
        6..=8 => {
            let addr = run.pick_ptr(input, slot);
            let stream = run.pick_stream(input, slot);
            let p = addr as usize as *mut c_void;
            // SAFETY: `pool` NULL or live; `ptr` only compared.
            let s = unsafe {
                match op {
                    6 => flare_package_free(pool, p),
                    7 => flare_package_free_async(pool, p, stream),
                    _ => flare_package_record_stream(pool, p, stream),
                }
            };
            check_status("free", s);
            if tracing() {
                eprintln!("  {addr:#x}");
            }
            run.freed(&format!("call {op}"), slot, addr, s, op != 8);
        }
        9..=11 => {
            // SAFETY: `pool` NULL or live.
            let s = unsafe {
                match op {
                    9 => flare_retention_begin(pool),
                    10 => flare_retention_finish(pool),
                    _ => flare_retention_abort(pool),
                }
            };
            check_status("retention", s);
            if let Some(m) = run.model(slot) {
                if op == 9 {
                    assert_eq!(s == SCOPE_STATE, m.scope_open, "begin: {}", last_error());
                    m.scope_open |= s == SUCCESS;
                } else {
                    assert_eq!(s == SCOPE_STATE, !m.scope_open, "finish: {}", last_error());
                    m.scope_open = false;
                }
            }
        }
        12 => {
            // SAFETY: `pool` NULL or live.
            let s = unsafe { flare_pool_trim(pool) };
            check_status("flare_pool_trim", s);
            if let Some(m) = run.model(slot) {
                assert_eq!(s == SCOPE_STATE, m.scope_open, "trim: {}", last_error());
            }
        }
        13 => {
            // SAFETY: `pool` NULL or live.
            check_status("record_flush", unsafe { flare_pool_record_flush(pool) });
        }
        14 => {
            let mut buf = [CANARY; 256];
            let len = usize::from(input.u8());
            // SAFETY: `buf` has 256 >= `len` writable bytes.
            let n = unsafe { flare_pool_record_error(pool, buf.as_mut_ptr().cast(), len) };
            check_c_string(&buf, len, n);
        }
        15 => snapshot(run, input, slot),
        16 => census(run, input, slot),
        17 | 18 => {
            let tag = pick_tag(input);
            let mode = input.u32() % 3;
            // SAFETY: `pool` NULL or live.
            let s = unsafe {
                if op == 17 {
                    flare_pool_sleep(pool, tag, RawSleepMode(mode))
                } else {
                    flare_pool_wake(pool, tag)
                }
            };
            check_status("sleep/wake", s);
            if tracing() {
                eprintln!("  tag {tag}, mode {mode}");
            }
            if let Some(m) = run.model(slot) {
                let asleep = m.sleeping.contains(&tag);
                if s == SUCCESS {
                    assert_eq!(asleep, op == 18, "sleep/wake of tag {tag} succeeded");
                    if op == 17 {
                        m.sleeping.insert(tag);
                    } else {
                        m.sleeping.remove(&tag);
                    }
                } else if op == 17 && s == FlareStatus::FLARE_STATUS_DRIVER_ERROR {
                    // A refused step whose undo was refused too may leave the tag
                    // asleep (the Rust `Pool::sleep`'s exceptions): the census says.
                    if census_sleeping(m.pool, tag) {
                        m.sleeping.insert(tag);
                    }
                }
                if op == 18 {
                    assert_eq!(s == TAG_STATE, !asleep, "wake: {}", last_error());
                }
            }
        }
        19 => {
            let call = input.u32() % 12;
            let nth = u32::from(input.u8() % 8);
            let error = i32::from(input.u16() as i16);
            // SAFETY: `pool` NULL or live.
            let s = unsafe { flare_sim_inject_failure(pool, RawDriverCall(call), nth, error) };
            check_status("inject_failure", s);
            if tracing() {
                eprintln!("  call {call}, nth {nth}, error {error}");
            }
            if let Some(m) = run.model(slot) {
                m.injected += u32::from(s == SUCCESS);
            }
        }
        20 => {
            let out = Out::pick(input);
            let mut out_slot = [SLOT_CANARY; 2];
            // SAFETY: `pool` NULL or live; the output NULL, misaligned or writable.
            let s = unsafe { flare_sim_stream_create(pool, out.ptr(&mut out_slot)) };
            check_status("stream_create", s);
            if s != SUCCESS {
                assert_eq!(out_slot, [SLOT_CANARY; 2]);
            } else if let Some(m) = run.model(slot) {
                assert_ne!(out_slot[0], 0, "a NULL stream");
                m.streams.push(out_slot[0] as usize as FlareStream);
            }
        }
        21 => {
            let stream = run.pick_stream(input, slot);
            let addr = run.pick_ptr(input, slot);
            let bytes = input.size() as usize;
            // SAFETY: `pool` NULL or live; `ptr` never dereferenced.
            let s =
                unsafe { flare_sim_launch(pool, stream, addr as usize as *const c_void, bytes) };
            check_status("launch", s);
            if let Some(m) = run.model(slot) {
                m.caller_may_fault |= s == SUCCESS;
            }
        }
        22 => {
            let stream = run.pick_stream(input, slot);
            // SAFETY: `pool` NULL or live.
            check_status("stream_complete", unsafe {
                flare_sim_stream_complete(pool, stream)
            });
        }
        23 => {
            let stream = run.pick_stream(input, slot);
            // SAFETY: `pool` NULL or live.
            let s = unsafe { flare_sim_begin_capture(pool, stream) };
            check_status("begin_capture", s);
            if let Some(m) = run.model(slot) {
                if s == SUCCESS {
                    m.caller_may_fault = true;
                    assert!(m.captures.insert(stream as usize), "a capture begun twice");
                }
            }
        }
        24 => {
            let stream = run.pick_stream(input, slot);
            end_capture(run, slot, stream, Out::pick(input));
        }
        25 => {
            let out = Out::pick(input);
            let mut out_slot = [SLOT_CANARY; 2];
            // SAFETY: `pool` NULL or live; the output NULL, misaligned or writable.
            let s = unsafe { flare_sim_faults(pool, out.ptr(&mut out_slot)) };
            check_status("faults", s);
            if s != SUCCESS {
                assert_eq!(out_slot, [SLOT_CANARY; 2]);
            } else if let Some(m) = run.model(slot) {
                assert!(
                    m.caller_may_fault || out_slot[0] == 0,
                    "{} faults",
                    out_slot[0]
                );
            }
        }
        _ => {
            let mut buf = [CANARY; 256];
            let len = usize::from(input.u8());
            // SAFETY: `buf` has 256 >= `len` writable bytes.
            let n = unsafe { flare_last_error_message(buf.as_mut_ptr().cast(), len) };
            check_c_string(&buf, len, n);
            let status = RawStatus(input.u32() % 16);
            // Static storage, never NULL.
            // SAFETY: the function returns a NUL-terminated static string.
            let name = unsafe { CStr::from_ptr(flare_status_name(status)) };
            assert!(name.to_bytes().starts_with(b"FLARE_STATUS_"));
        }
    }
    if let (Some(before), Some(s)) = (before, LAST_STATUS.get()) {
        if NOTHING_CHANGED.contains(&s) {
            if let Some(after) = counters(pool) {
                assert_eq!(before, after, "op {op} returned {s:?} and changed the pool");
            }
        }
    }
    true
}

/// A string output: `n` is the full length; at most `len - 1` bytes and a NUL
/// written, nothing past `len`.
fn check_c_string(buf: &[u8; 256], len: usize, n: usize) {
    if len == 0 {
        assert!(buf.iter().all(|&b| b == CANARY), "written with len 0");
        return;
    }
    let end = n.min(len - 1);
    assert_eq!(
        buf[end], 0,
        "not NUL-terminated at {end} (n {n}, len {len})"
    );
    assert!(
        buf[len..].iter().all(|&b| b == CANARY),
        "written past len {len}"
    );
}

fn end_capture(run: &mut Run, slot: Option<usize>, stream: FlareStream, out: Out) -> Status {
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
fn finish(run: &mut Run, slot: usize) {
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
fn free_awake(m: &mut Model) {
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

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mut run = Run {
        pools: [None, None],
    };
    for _ in 0..MAX_CALLS {
        if !step(&mut run, &mut input) {
            break;
        }
    }
    finish(&mut run, 0);
    finish(&mut run, 1);
});

// The layout the buffers assume: `struct_size` first, a `uint32_t`.
const _: () = assert!(offset_of!(FlareSnapshot, scope_open) == 4);
const _: () = assert!(size_of::<FlarePoolConfig>() <= BUF_BYTES);
