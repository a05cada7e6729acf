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

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::ptr;

use flare_package::ffi::*;

mod calls;
mod model;
mod pool;

use calls::*;
use model::*;
use pool::*;

pub(crate) type Status = FlareStatus;

pub(crate) const SUCCESS: Status = FlareStatus::FLARE_STATUS_SUCCESS;

pub(crate) const INVALID: Status = FlareStatus::FLARE_STATUS_INVALID_ARGUMENT;

pub(crate) const UNKNOWN_POINTER: Status = FlareStatus::FLARE_STATUS_UNKNOWN_POINTER;

pub(crate) const SCOPE_STATE: Status = FlareStatus::FLARE_STATUS_SCOPE_STATE;

pub(crate) const TAG_STATE: Status = FlareStatus::FLARE_STATUS_TAG_STATE;

pub(crate) const INTERNAL: Status = FlareStatus::FLARE_STATUS_INTERNAL;

/// The most calls one input makes.
pub(crate) const MAX_CALLS: usize = 256;

/// The most allocations an input may hold live in one pool (a bound on the work of
/// the end-of-input checks).
pub(crate) const MAX_LIVE: usize = 512;

/// The largest simulated device a configuration that sets `sim_capacity_bytes`
/// gets, bytes: 256 MiB. The simulated driver keeps the bytes of device memory and
/// of pinned host buffers (an offload sleep copies every live byte to the host, its
/// wake copies them back), so an input's memory is a few times what it allocates.
pub(crate) const MAX_SIM_CAPACITY: u64 = 1 << 28;

/// The byte every caller buffer is filled with before a call: a byte still equal to
/// it afterwards was not written.
pub(crate) const CANARY: u8 = 0xA5;

/// Bytes of every caller struct buffer: more than the largest `struct_size` a
/// versioned struct takes (4096).
pub(crate) const BUF_BYTES: usize = 4160;

/// A caller's struct buffer: 8-aligned, as a C struct of `uint64_t` fields is.
#[repr(C, align(8))]
pub(crate) struct Buf(pub(crate) [u8; BUF_BYTES]);

impl Buf {
    /// The canary everywhere, `struct_size` in the first 4 bytes.
    pub(crate) fn versioned(struct_size: u32) -> Box<Buf> {
        let mut b = Box::new(Buf([CANARY; BUF_BYTES]));
        b.0[..4].copy_from_slice(&struct_size.to_ne_bytes());
        b
    }

    /// Whether `bytes[from..]` were all left alone.
    pub(crate) fn untouched_from(&self, from: usize) -> bool {
        self.0[from.min(BUF_BYTES)..].iter().all(|&b| b == CANARY)
    }

    /// Reads a `T` at the start (a copy: the library's struct, as C sees it).
    pub(crate) fn read<T: Copy>(&self) -> T {
        assert!(size_of::<T>() <= BUF_BYTES);
        // SAFETY: the buffer is 8-aligned and larger than `T`; `T` is one of the C
        // ABI's structs of integers, for which any bytes are a value.
        unsafe { ptr::read(self.0.as_ptr().cast::<T>()) }
    }
}

/// The input as a stream of values; each read takes what it needs, and reads 0
/// once the input is spent.
pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl Input<'_> {
    pub(crate) fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    pub(crate) fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    /// A size: small, a few MiB, up to 256 MiB, or 1 TiB and more. Not up to 4 GiB: a
    /// configuration whose `struct_size` leaves out `sim_capacity_bytes` gets the
    /// default 140 GiB device, and an offload sleep of a few such allocations made
    /// the simulated driver hold 2 to 4 GB of bytes, past libFuzzer's 2 GiB limit
    /// (no leak: each such input replayed alone used that much).
    pub(crate) fn size(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => u64::from(self.u16()),
            1 => u64::from(self.u8()) << 20,
            2 => u64::from(self.u32() >> 4),
            // At least 1 TiB: beyond every simulated device (refused, nothing
            // changes). A value that fits the default 140 GiB device (an 81 GB
            // allocation) made an offload sleep copy 81 GB through the simulated
            // driver, 4 KiB at a time: 35 s, past libFuzzer's time limit.
            _ => self.u64() | 1 << 40,
        }
    }
    /// A `struct_size` for a struct of `size` bytes: its size, one near it, or any.
    pub(crate) fn struct_size(&mut self, size: usize) -> u32 {
        let size = size as u32;
        match self.u8() % 4 {
            0 | 1 => size,
            2 => u32::from(self.u16()) % (size + 16),
            _ => self.u32(),
        }
    }
}

/// What no call may return (beyond the rules checked at each call):
/// `FLARE_STATUS_INTERNAL`, a panic caught at the boundary or a poisoned pool.
///
/// A failure is a clear error: the thread's last error message names the function,
/// on one line of at most 1 KiB.
pub(crate) fn check_status(call: &str, s: Status) {
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
    pub(crate) static LAST_STATUS: std::cell::Cell<Option<Status>> = const { std::cell::Cell::new(None) };
}

/// Statuses after which nothing changed (the header's `FlareStatus`).
pub(crate) const NOTHING_CHANGED: [Status; 5] = [
    INVALID,
    UNKNOWN_POINTER,
    SCOPE_STATE,
    TAG_STATE,
    FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE,
];

/// The pool's counters (`None` for a NULL pool).
pub(crate) fn counters(pool: *mut FlarePool) -> Option<FlareSnapshot> {
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
pub(crate) fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FLARE_FUZZ_TRACE").is_some())
}

pub(crate) fn last_error() -> String {
    let mut buf = [0u8; 2048];
    // SAFETY: `buf` has 2048 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    let mut text = String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned();
    if n >= buf.len() {
        text.push_str(&format!("... ({n} bytes)"));
    }
    text
}

/// An output slot for a call: valid, NULL or misaligned.
pub(crate) enum Out {
    Valid,
    Null,
    Misaligned,
}

impl Out {
    pub(crate) fn pick(input: &mut Input<'_>) -> Out {
        match input.u8() % 8 {
            0 => Out::Null,
            1 => Out::Misaligned,
            _ => Out::Valid,
        }
    }
    /// The pointer for a slot of `T` in `slot` (a `[u64; 2]`, 8-aligned).
    pub(crate) fn ptr<T>(&self, slot: &mut [u64; 2]) -> *mut T {
        match self {
            Out::Valid => slot.as_mut_ptr().cast(),
            Out::Null => ptr::null_mut(),
            Out::Misaligned => slot.as_mut_ptr().cast::<u8>().wrapping_add(1).cast(),
        }
    }
}

pub(crate) const SLOT_CANARY: u64 = 0xA5A5_A5A5_A5A5_A5A5;

/// A string output: `n` is the full length; at most `len - 1` bytes and a NUL
/// written, nothing past `len`.
pub(crate) fn check_c_string(buf: &[u8; 256], len: usize, n: usize) {
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

/// Runs the calls `data` encodes (at most [`MAX_CALLS`]), then ends every pool
/// ([`finish`]). Panics at the first broken promise.
pub fn run(data: &[u8]) {
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
}

// The layout the buffers assume: `struct_size` first, a `uint32_t`.
const _: () = assert!(offset_of!(FlareSnapshot, scope_open) == 4);
const _: () = assert!(size_of::<FlarePoolConfig>() <= BUF_BYTES);
