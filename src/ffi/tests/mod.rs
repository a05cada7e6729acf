//! Tests of the C ABI called from Rust, as C calls it, one module per file of
//! `src/ffi` (`boundary`, `pool` and `config`, `memory`, `stream`, `sim`, `tags`,
//! `torch`, `version`, `viz`, `growth` for `growth` and `torch_growth`) and two of races and lifetimes: statuses and messages, NULL pools and
//! outputs, misaligned outputs, `struct_size` versioning, zero and overflowing sizes,
//! unknown pointers, the counters after an allocate and free, scopes, tags, fault
//! injection, the panic boundary and poisoning, destroy reports, the last error's
//! copy-out, stream order. One contract clause at a time (issue 16: the bodies behind
//! the C shells are mutated, and these catch the mutants). Every expected value comes
//! from the function's documented contract (the header's comments) and the simulated
//! driver's defaults (2 MiB granularity, 140 GiB, one device).
//!
//! This module holds the helpers the test modules share.

use std::ffi::{c_char, c_void, CStr};
use std::mem::size_of;
use std::ptr;

use super::*;

mod boundary;
mod config;
mod growth;
mod memory;
mod pool;
mod sim;
mod stream;
// A stream's end (issue 34): `flare_pool_forget_stream` and `flare_sim_stream_destroy`.
mod stream_lifetime;
// Sleep and wake racing a tag's own calls from other threads (issue 34).
mod tag_state_races;
mod tags;
mod torch;
// memory_viz snapshots and the history frame (issue 38).
mod version;
mod viz;

const MIB: u64 = 1 << 20;

const GIB: u64 = 1 << 30;
/// The simulated driver's default granularity.
const GRANULARITY: u64 = 2 * MIB;

const NULL_POOL: *mut FlarePool = ptr::null_mut();

const SENTINEL: *mut c_void = 0x5e5e as *mut c_void;

/// The calling thread's last error message (`flare_last_error_message`).
pub(super) fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A configuration as `flare_pool_config_init` writes it.
pub(super) fn config() -> FlarePoolConfig {
    let mut c = FlarePoolConfig::default_for_layout();
    // SAFETY: `c` is a whole, writable FlarePoolConfig.
    unsafe { flare_pool_config_init(&mut c, size_of::<FlarePoolConfig>()) };
    c
}

/// Asserts `status` and that the last error starts with `function: ` and contains
/// `detail`.
#[track_caller]
fn refused(status: FlareStatus, want: FlareStatus, function: &str, detail: &str) {
    assert_eq!(status, want, "{function}: {}", last_error());
    let message = last_error();
    assert!(
        message.starts_with(&format!("{function}: ")) && message.contains(detail),
        "{function}: message {message:?} lacks {detail:?}"
    );
}

#[track_caller]
fn ok(status: FlareStatus) {
    assert_eq!(
        status,
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
}

fn create(c: &FlarePoolConfig) -> *mut FlarePool {
    let mut pool = ptr::null_mut();
    // SAFETY: `c` is a whole config, `pool` writable.
    ok(unsafe { flare_pool_create(c, &mut pool) });
    assert!(!pool.is_null());
    pool
}

/// Destroys a live pool; the destroy must succeed.
fn destroy(pool: *mut FlarePool) {
    // SAFETY: the callers pass a live pool and use it no more.
    ok(unsafe { flare_pool_destroy(pool) });
}

fn snap(pool: *const FlarePool) -> FlareSnapshot {
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    // SAFETY: `pool` is live; `s` is a whole FlareSnapshot.
    ok(unsafe { flare_pool_snapshot(pool, &mut s) });
    s
}

fn allocate(pool: *mut FlarePool, size: usize) -> (FlareStatus, *mut c_void) {
    let mut p = SENTINEL;
    // SAFETY: `pool` is live or NULL; `p` is writable.
    let status = unsafe { flare_package_allocate(pool, size, &mut p) };
    (status, p)
}

fn free(pool: *mut FlarePool, p: *mut c_void) -> FlareStatus {
    // SAFETY: `pool` is live or NULL; `p` is only compared.
    unsafe { flare_package_free(pool, p) }
}

fn census(pool: *const FlarePool, tag: u32) -> FlareTagCensus {
    let mut c = FlareTagCensus {
        struct_size: size_of::<FlareTagCensus>() as u32,
        ..FlareTagCensus::default()
    };
    // SAFETY: `pool` is live; `c` is a whole FlareTagCensus.
    ok(unsafe { flare_pool_tag_census(pool, tag, &mut c) });
    c
}

fn allocate_tagged(pool: *mut FlarePool, size: usize, tag: u32) -> (FlareStatus, *mut c_void) {
    let mut p = SENTINEL;
    // SAFETY: `pool` is live or NULL; `p` is writable; NULL is the legacy stream.
    let status = unsafe { flare_package_allocate_tagged(pool, size, ptr::null_mut(), tag, &mut p) };
    (status, p)
}

/// A buffer a versioned struct is written into: 512 bytes of 0xcd, aligned to 8,
/// with `struct_size` set.
#[repr(C, align(8))]
struct Buf([u8; 512]);

impl Buf {
    fn with_struct_size(struct_size: u32) -> Buf {
        let mut b = Buf([0xcd; 512]);
        b.0[..4].copy_from_slice(&struct_size.to_ne_bytes());
        b
    }
    fn u32_at(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.0[at..at + 4].try_into().unwrap_or_default())
    }
    fn u64_at(&self, at: usize) -> u64 {
        u64::from_ne_bytes(self.0[at..at + 8].try_into().unwrap_or_default())
    }
    fn untouched_from(&self, at: usize) -> bool {
        self.0[at..].iter().all(|&b| b == 0xcd)
    }
}

pub(super) fn destroy_report(pool: *mut FlarePool) -> (FlareStatus, FlareDestroyReport) {
    let mut r = FlareDestroyReport {
        struct_size: size_of::<FlareDestroyReport>() as u32,
        ..FlareDestroyReport::default()
    };
    // SAFETY: `pool` is NULL or live; `r` is a whole report.
    let st = unsafe { flare_pool_destroy_report(pool, &mut r) };
    (st, r)
}

/// The simulated driver under a C pool, kept to look at after destroy.
fn snap_sim(pool: *const FlarePool) -> std::sync::Arc<crate::SimDriver> {
    // SAFETY: `pool` is live.
    let pool = unsafe { pool.as_ref() }.unwrap_or_else(|| panic!("pool is NULL"));
    match pool.pool.sim_driver() {
        Some(sim) => sim.clone(),
        None => panic!("not a simulated pool"),
    }
}

fn stream_create(pool: *mut FlarePool) -> FlareStream {
    let mut s = ptr::null_mut();
    // SAFETY: `pool` is live; `s` is writable.
    ok(unsafe { flare_sim_stream_create(pool, &mut s) });
    s
}

fn allocate_async(
    pool: *mut FlarePool,
    size: usize,
    stream: FlareStream,
) -> (FlareStatus, *mut c_void) {
    let mut p = 0x5e5e as *mut c_void;
    // SAFETY: `pool` is live; `p` is writable.
    let status = unsafe { flare_package_allocate_async(pool, size, stream, &mut p) };
    (status, p)
}

/// An allocation on `stream` that must succeed.
#[track_caller]
fn allocate_on(pool: *mut FlarePool, size: usize, stream: FlareStream) -> *mut c_void {
    let (status, p) = allocate_async(pool, size, stream);
    ok(status);
    p
}

#[track_caller]
fn free_on(pool: *mut FlarePool, p: *mut c_void, stream: FlareStream) {
    // SAFETY: `pool` is live.
    ok(unsafe { flare_package_free_async(pool, p, stream) });
}

#[track_caller]
fn launch(pool: *mut FlarePool, stream: FlareStream, p: *mut c_void, bytes: u64) {
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_launch(pool, stream, p, bytes as usize) });
}

#[track_caller]
fn complete(pool: *mut FlarePool, stream: FlareStream) {
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_stream_complete(pool, stream) });
}

#[track_caller]
fn faults(pool: *const FlarePool) -> u64 {
    let mut n = u64::MAX;
    // SAFETY: `pool` is live; `n` is writable.
    ok(unsafe { flare_sim_faults(pool, &mut n) });
    n
}

/// Ends the capture on `stream`; whether it ended valid.
#[track_caller]
fn end_capture(pool: *mut FlarePool, stream: FlareStream) -> bool {
    let mut valid: std::ffi::c_int = 7;
    // SAFETY: `pool` is live; `valid` is writable.
    ok(unsafe { flare_sim_end_capture(pool, stream, &mut valid) });
    assert!(valid == 0 || valid == 1, "out_valid {valid}");
    valid == 1
}

/// A simulated pool with release threshold `threshold` bytes and cross-stream mode
/// `mode` (a `FlareCrossStreamReuse` number).
fn stream_pool(threshold: u64, mode: u32) -> *mut FlarePool {
    let mut c = config();
    c.release_threshold_bytes = threshold;
    c.cross_stream_reuse = mode;
    create(&c)
}

/// Trims, checks that the pool holds nothing and that the simulated driver saw no
/// contract fault, and destroys the pool.
#[track_caller]
fn trim_check_destroy(pool: *mut FlarePool) {
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    let s = snap(pool);
    assert_eq!(
        (
            s.live_count,
            s.physical_bytes,
            s.reserved_bytes,
            s.pending_count
        ),
        (0, 0, 0, 0),
        "trim released everything"
    );
    assert_eq!(faults(pool), 0, "no contract fault");
    destroy(pool);
}
