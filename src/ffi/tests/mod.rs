//! Tests of the C ABI called from Rust, as C calls it: statuses and messages, the
//! configuration's versioning, the panic boundary and poisoning, destroy reports.

use std::ffi::{c_char, c_void, CStr};
use std::mem::size_of;
use std::ptr;

use super::boundary::boundary;
use super::*;
use crate::{Error, ReusePolicy};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

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

fn create(c: &FlarePoolConfig) -> *mut FlarePool {
    let mut pool = ptr::null_mut();
    // SAFETY: `c` is a valid config of `struct_size` bytes, `pool` writable.
    let status = unsafe { flare_pool_create(c, &mut pool) };
    assert_eq!(
        status,
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    pool
}

fn snap(pool: *const FlarePool) -> FlareSnapshot {
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    // SAFETY: `pool` is live; `s` is a whole FlareSnapshot.
    let status = unsafe { flare_pool_snapshot(pool, &mut s) };
    assert_eq!(
        status,
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    s
}

/// Destroys a live pool; the destroy must succeed.
fn destroy(pool: *mut FlarePool) {
    // SAFETY: the callers pass a live pool and use it no more.
    let status = unsafe { flare_pool_destroy(pool) };
    assert_eq!(status, FlareStatus::FLARE_STATUS_SUCCESS);
}

fn allocate(pool: *mut FlarePool, size: usize) -> (FlareStatus, *mut c_void) {
    let mut p = 0x5e5e as *mut c_void;
    // SAFETY: `pool` is live (or poisoned, still allocated); `p` is writable.
    let status = unsafe { flare_package_allocate(pool, size, &mut p) };
    (status, p)
}

#[test]
fn a_panic_is_an_internal_status_with_its_message() {
    let status = boundary("flare_test", || panic!("boom {}", 42));
    assert_eq!(status, FlareStatus::FLARE_STATUS_INTERNAL);
    let mut buf = [0 as c_char; 256];
    // SAFETY: `buf` has 256 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    assert_eq!(n, msg.len());
    assert!(msg.starts_with("flare_test: internal error") && msg.ends_with("boom 42"));
}

#[test]
fn errors_map_to_their_statuses() {
    let status = boundary("flare_test", || Err(Error::UnknownPointer { ptr: 0x10 }));
    assert_eq!(status, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
    let status = boundary("flare_test", || {
        Err(Error::RequestTooLarge {
            requested: 2 << 30,
            device_total: 1 << 30,
        })
    });
    assert_eq!(status, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    let status = boundary("flare_test", || Err(Error::NoDriver("x".into())));
    assert_eq!(status, FlareStatus::FLARE_STATUS_NO_DRIVER);
    // SAFETY: NULL with length 0 writes nothing.
    let n = unsafe { flare_last_error_message(ptr::null_mut(), 0) };
    assert_eq!(n, "flare_test: no CUDA driver: x".len());
}

#[test]
fn status_names_match_the_enum() {
    // The contract's numbers and names, written out here rather than derived from
    // the enum, for every status and a few values outside it.
    let table: [(u32, &str); 15] = [
        (0, "FLARE_STATUS_SUCCESS"),
        (1, "FLARE_STATUS_INVALID_ARGUMENT"),
        (2, "FLARE_STATUS_OUT_OF_MEMORY"),
        (3, "FLARE_STATUS_NOT_SUPPORTED"),
        (4, "FLARE_STATUS_UNKNOWN_POINTER"),
        (5, "FLARE_STATUS_SCOPE_STATE"),
        (6, "FLARE_STATUS_DRIVER_ERROR"),
        (7, "FLARE_STATUS_NO_DRIVER"),
        (8, "FLARE_STATUS_INTERNAL"),
        (9, "FLARE_STATUS_REQUEST_TOO_LARGE"),
        (10, "FLARE_STATUS_TAG_STATE"),
        (11, "FLARE_STATUS_STREAM_STATE"),
        (12, "FLARE_STATUS_UNRECOGNIZED"),
        (0x8000_0000, "FLARE_STATUS_UNRECOGNIZED"),
        (u32::MAX, "FLARE_STATUS_UNRECOGNIZED"),
    ];
    for (value, name) in table {
        // SAFETY: flare_status_name returns a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(flare_status_name(RawStatus(value))) };
        assert_eq!(got.to_str().ok(), Some(name), "status {value}");
    }
    // The enum's discriminants are the contract's numbers, and its Rust names the C
    // names.
    for (value, name) in table {
        let status = FlareStatus::from_raw(value);
        if name == "FLARE_STATUS_UNRECOGNIZED" {
            assert_eq!(status, None, "status {value}");
        } else {
            let status = status.unwrap_or_else(|| panic!("status {value} missing"));
            assert_eq!((status as u32, format!("{status:?}")), (value, name.into()));
        }
    }
    assert_eq!(FlareStatus::ALL.len(), 12);
}

/// A buffer a config is initialised into, aligned like the struct.
#[repr(C, align(8))]
struct Buf([u8; 128]);

fn init_into(config_size: usize) -> Buf {
    let mut buf = Buf([0xcd; 128]);
    // SAFETY: `buf` has 128 >= config_size writable bytes, aligned to 8.
    unsafe { flare_pool_config_init(buf.0.as_mut_ptr().cast(), config_size) };
    buf
}

fn u32_at(b: &Buf, at: usize) -> u32 {
    u32::from_ne_bytes([b.0[at], b.0[at + 1], b.0[at + 2], b.0[at + 3]])
}

#[test]
fn config_init_writes_at_most_config_size_bytes() {
    // The C layout on a 64-bit target, by hand: struct_size 0..4, backend 4..8,
    // device 8..12, reuse_policy 12..16, release_threshold_bytes 16..24,
    // peer_devices 24..32, peer_device_count 32..36, padding 36..40,
    // sim_capacity_bytes 40..48, sim_granularity_bytes 48..56, sim_device_count
    // 56..60, best_fit_max_waste_percent 60..64, cross_stream_reuse 64..68, padding
    // 68..72 (a u64 is 8-aligned), segment_whole_threshold_bytes 72..80,
    // thread_cache_entries 80..84, padding 84..88, thread_cache_bytes 88..96,
    // record_path 96..104; no tail padding.
    for size in [0, 1, 3] {
        assert!(init_into(size).0.iter().all(|&b| b == 0xcd), "size {size}");
    }
    // Only struct_size fits.
    let b = init_into(7);
    assert_eq!(u32_at(&b, 0), 7);
    assert!(b.0[4..].iter().all(|&x| x == 0xcd));
    // struct_size, backend (simulated = 1), device 0.
    let b = init_into(12);
    assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (12, 1, 0));
    assert!(b.0[12..].iter().all(|&x| x == 0xcd));
    // Up to peer_device_count: the padding after it is not the caller's field and
    // lies past the last whole field, so it is left alone too.
    let b = init_into(40);
    assert_eq!(u32_at(&b, 0), 40);
    assert!(b.0[12..36].iter().all(|&x| x == 0));
    assert!(b.0[36..].iter().all(|&x| x == 0xcd));
    // An older caller whose struct ended with sim_device_count.
    let b = init_into(60);
    assert_eq!(u32_at(&b, 0), 60);
    assert!(b.0[36..60].iter().all(|&x| x == 0), "padding zeroed");
    assert!(b.0[60..].iter().all(|&x| x == 0xcd));
    // A caller compiled before cross_stream_reuse (sizeof 64): its 64 bytes, not one
    // more.
    let b = init_into(64);
    assert_eq!((u32_at(&b, 0), u32_at(&b, 60)), (64, 30));
    assert!(b.0[64..].iter().all(|&x| x == 0xcd));
    // Up to cross_stream_reuse; and a caller compiled before
    // segment_whole_threshold_bytes (sizeof 72, with 4 bytes of tail padding then):
    // the same 68 bytes, its padding past the last whole field left alone, the new
    // field's 8 bytes not written.
    for size in [68, 72, 79] {
        let b = init_into(size);
        assert_eq!(
            (u32_at(&b, 0), u32_at(&b, 64)),
            (size as u32, 0),
            "size {size}"
        );
        assert_eq!(u32_at(&b, 60), 30, "size {size}");
        assert!(b.0[68..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // A caller compiled before the thread-cache fields (sizeof 80): its 80 bytes (the
    // padding before segment_whole_threshold_bytes zeroed), the new fields' bytes
    // not written.
    for size in [80, 83] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), size as u32, "size {size}");
        assert_eq!(u32_at(&b, 68), 0, "padding, size {size}");
        assert_eq!((u32_at(&b, 72), u32_at(&b, 76)), (0, 0), "size {size}");
        assert!(b.0[80..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // Up to thread_cache_entries (32, the default): the padding after it lies past
    // the last whole field and is left alone, thread_cache_bytes is not written.
    for size in [84, 88, 95] {
        let b = init_into(size);
        assert_eq!(
            (u32_at(&b, 0), u32_at(&b, 80)),
            (size as u32, 32),
            "size {size}"
        );
        assert!(b.0[84..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // A caller compiled before record_path (sizeof 96): its 96 bytes, not one more.
    for size in [96, 100, 103] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), size as u32, "size {size}");
        assert!(b.0[96..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // This header's struct, and a newer caller's larger one: 104 bytes written (the
    // padding before segment_whole_threshold_bytes and before thread_cache_bytes
    // zeroed, record_path NULL), struct_size says 104, the rest untouched.
    for size in [104, 128] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), 104, "size {size}");
        assert_eq!(u32_at(&b, 12), 0, "best fit");
        assert_eq!(u32_at(&b, 60), 30, "the default waste bound");
        assert_eq!(u32_at(&b, 64), 0, "FLARE_CROSS_STREAM_WHEN_COMPLETE");
        assert_eq!(u32_at(&b, 68), 0, "padding, size {size}");
        assert_eq!(
            (u32_at(&b, 72), u32_at(&b, 76)),
            (0, 0),
            "segment_whole_threshold_bytes 0 (the default), size {size}"
        );
        assert_eq!(u32_at(&b, 80), 32, "thread_cache_entries, size {size}");
        assert_eq!(u32_at(&b, 84), 0, "padding, size {size}");
        // Read as a whole u64 (native byte order, as C writes it).
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&b.0[88..96]);
        assert_eq!(
            u64::from_ne_bytes(bytes),
            GIB,
            "thread_cache_bytes, size {size}"
        );
        assert!(b.0[96..104].iter().all(|&x| x == 0), "record_path NULL");
        assert!(b.0[104..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // NULL is a no-op.
    // SAFETY: NULL is allowed.
    unsafe { flare_pool_config_init(ptr::null_mut(), size_of::<FlarePoolConfig>()) };
    // What an older caller initialised creates a pool with the defaults.
    let b = init_into(40);
    let mut older = FlarePoolConfig::default_for_layout();
    // SAFETY: `b` has 128 bytes, `older` is a whole FlarePoolConfig (104 bytes);
    // every byte pattern is a valid FlarePoolConfig.
    unsafe {
        ptr::copy_nonoverlapping(
            b.0.as_ptr(),
            ptr::addr_of_mut!(older).cast::<u8>(),
            size_of::<FlarePoolConfig>(),
        )
    };
    let pool = create(&older);
    assert_eq!(snap(pool).granularity_bytes, 2 * MIB);
    destroy(pool);
}

/// Inside a scope: 4 MiB allocated and freed (retained idle), then 2 MiB asked
/// for. The idle mapping exceeds the request by 2 MiB, 100% of it: reused under a
/// bound of 100%, not under the default 30%. Returns the reuse hits.
fn reuse_hits_with_waste_percent(percent: u32) -> u64 {
    let mut c = config();
    c.best_fit_max_waste_percent = percent;
    let pool = create(&c);
    // SAFETY: `pool` is live throughout.
    unsafe {
        assert_eq!(
            flare_retention_begin(pool),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        let (st, p) = allocate(pool, 4 * MIB as usize);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!(
            flare_package_free(pool, p),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        let (st, q) = allocate(pool, 2 * MIB as usize);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!(
            flare_package_free(pool, q),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        let hits = snap(pool).reuse_hits;
        assert_eq!(flare_pool_destroy(pool), FlareStatus::FLARE_STATUS_SUCCESS);
        hits
    }
}

#[test]
fn config_best_fit_waste_bound_is_read() {
    assert_eq!(config().best_fit_max_waste_percent, 30);
    assert_eq!(reuse_hits_with_waste_percent(100), 1);
    assert_eq!(reuse_hits_with_waste_percent(99), 0);
    assert_eq!(reuse_hits_with_waste_percent(30), 0);
    // 0: the default (30%), not "no waste at all".
    assert_eq!(reuse_hits_with_waste_percent(0), 0);
}

#[test]
fn request_too_large_is_not_out_of_memory() {
    let mut c = config();
    c.sim_capacity_bytes = 1 << 30;
    let pool = create(&c);
    let before = snap(pool);
    let (st, p) = allocate(pool, (1 << 30) + 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    assert_eq!(p, 0x5e5e as *mut c_void, "no output on failure");
    assert!(
        last_error().contains("request too large"),
        "{}",
        last_error()
    );
    assert_eq!(snap(pool), before, "nothing counted");
    // The whole device is not too large: with 2 MiB live, it is full now.
    let (st, live) = allocate(pool, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    let (st, _) = allocate(pool, 1 << 30);
    assert_eq!(st, FlareStatus::FLARE_STATUS_OUT_OF_MEMORY);
    // SAFETY: `pool` is live, `live` its allocation.
    unsafe {
        assert_eq!(
            flare_package_free(pool, live),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        let (st, whole) = allocate(pool, 1 << 30);
        assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
        assert_eq!(
            flare_package_free(pool, whole),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(flare_pool_destroy(pool), FlareStatus::FLARE_STATUS_SUCCESS);
    }
}

#[test]
fn cuda_backend_with_a_negative_device_is_an_invalid_argument() {
    let mut c = config();
    c.backend = FlareBackend::FLARE_BACKEND_CUDA as u32;
    c.device = -1;
    let mut pool = 0x5e5e as *mut FlarePool;
    // SAFETY: `c` is a valid config, `pool` writable.
    let st = unsafe { flare_pool_create(&c, &mut pool) };
    assert_eq!(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "{}",
        last_error()
    );
    assert!(last_error().contains("device ordinal -1 is negative"));
    assert_eq!(pool, 0x5e5e as *mut FlarePool);
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

/// Segment mode: a live block is held bytes too. Its bytes are the request rounded
/// to 512 B (not to the granularity): 4096 B and 3 MiB + 1 B live are 4096 +
/// (3 MiB + 512) bytes of blocks, in two segments (small: one 2 MiB handle; large:
/// the 3 MiB + 512 need rounded to the granularity, 4 MiB), 6 MiB physical.
#[test]
fn destroy_report_counts_live_blocks_in_segment_mode() {
    let mut c = config();
    c.reuse_policy = FlareReusePolicy::FLARE_REUSE_SEGMENTS as u32;
    let pool = create(&c);
    let sim = snap_sim(pool);
    let (st, a) = allocate(pool, 4096);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    let (st, b) = allocate(pool, 3 * MIB as usize + 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    let s = snap(pool);
    assert_eq!(
        (s.live_mapped_bytes, s.block_live_count, s.block_live_bytes),
        (0, 2, 4096 + 3 * MIB + 512)
    );
    assert_eq!((s.physical_bytes, s.segment_count), (6 * MIB, 2));
    let (st, r) = destroy_report(pool);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    assert_eq!(
        r,
        FlareDestroyReport {
            struct_size: 40,
            scope_was_open: 0,
            live_count: 2,
            live_requested_bytes: 4096 + 3 * MIB + 1,
            live_mapped_bytes: 4096 + 3 * MIB + 512,
            physical_bytes: 6 * MIB,
        }
    );
    assert!(
        last_error().starts_with(
            "flare_pool_destroy_report: released 2 live allocation(s): 3149825 bytes \
             requested, 3150336 bytes ("
        ),
        "{}",
        last_error()
    );
    // Everything given back, the segments' reservations too.
    let d = sim.state();
    assert_eq!((d.handles, d.reservations, d.physical_bytes), (0, 0, 0));
    let _ = (a, b);
}

#[test]
fn destroy_reports_the_live_allocations_it_released() {
    let mut c = config();
    c.release_threshold_bytes = 64 * MIB;
    let pool = create(&c);
    let sim = snap_sim(pool);
    // Two live (1 B and 3 MiB: 2 + 4 MiB mapped), one cached idle (2 MiB).
    let (_, a) = allocate(pool, 1);
    let (_, b) = allocate(pool, 3 * MIB as usize);
    let (_, idle) = allocate(pool, 2 * MIB as usize);
    // SAFETY: `pool` is live, `idle` its allocation; NULL report is refused.
    unsafe {
        assert_eq!(
            flare_package_free(pool, idle),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(
            flare_retention_begin(pool),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        // A NULL report is refused and destroys nothing.
        assert_eq!(
            flare_pool_destroy_report(pool, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT
        );
    }
    let mut bad = FlareDestroyReport {
        struct_size: 4,
        ..FlareDestroyReport::default()
    };
    // SAFETY: `pool` is live; `bad` is writable.
    let st = unsafe { flare_pool_destroy_report(pool, &mut bad) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(snap(pool).live_count, 2, "still usable");
    let (st, r) = destroy_report(pool);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    assert_eq!(
        r,
        FlareDestroyReport {
            struct_size: 40,
            scope_was_open: 1,
            live_count: 2,
            live_requested_bytes: 1 + 3 * MIB,
            live_mapped_bytes: 6 * MIB,
            physical_bytes: 8 * MIB,
        }
    );
    assert_eq!(
        last_error(),
        "flare_pool_destroy_report: released 2 live allocation(s): 3145729 bytes \
         requested, 6291456 bytes (6.0 MiB) mapped"
    );
    let d = sim.state();
    assert_eq!((d.handles, d.reservations, d.physical_bytes), (0, 0, 0));
    let _ = (a, b);
    // NULL pool: success, an all-zero report.
    let (st, r) = destroy_report(ptr::null_mut());
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    assert_eq!((r.live_count, r.physical_bytes, r.struct_size), (0, 0, 40));
    // Plain destroy says it in the message too; nothing live, nothing said.
    let pool = create(&config());
    let (_, _p) = allocate(pool, 5 * MIB as usize);
    destroy(pool);
    assert_eq!(
        last_error(),
        "flare_pool_destroy: released 1 live allocation(s): 5242880 bytes requested, \
         6291456 bytes (6.0 MiB) mapped"
    );
    let (st, _) = allocate(ptr::null_mut(), 1); // sets the message to something else
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    let before = last_error();
    let pool = create(&config());
    destroy(pool);
    assert_eq!(
        last_error(),
        before,
        "a destroy with nothing live says nothing"
    );
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

#[test]
fn a_panic_in_a_call_poisons_the_pool_and_destroy_still_releases() {
    let pool = create(&config());
    let sim = snap_sim(pool);
    let (st, a) = allocate(pool, 3 * MIB as usize);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    // SAFETY: `pool` is live (poisoned pools stay allocated until destroy).
    unsafe {
        assert_eq!(
            flare_sim_inject_panic(pool),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        // The panic fires after the allocation is made, before its pointer is
        // returned.
        let (st, b) = allocate(pool, MIB as usize);
        assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL);
        assert_eq!(b, 0x5e5e as *mut c_void, "no output");
        let msg = last_error();
        assert!(
            msg.starts_with("flare_package_allocate: internal error"),
            "{msg}"
        );
        assert!(msg.contains("injected by flare_sim_inject_panic"), "{msg}");
        assert!(msg.contains("poisoned"), "{msg}");
        // Every later call is refused, and says why.
        let mut s = FlareSnapshot {
            struct_size: size_of::<FlareSnapshot>() as u32,
            ..FlareSnapshot::default()
        };
        let refused = [
            flare_package_free(pool, a),
            flare_package_free(pool, ptr::null_mut()),
            allocate(pool, 1).0,
            flare_retention_begin(pool),
            flare_retention_finish(pool),
            flare_retention_abort(pool),
            flare_pool_trim(pool),
            flare_pool_snapshot(pool, &mut s),
            flare_pool_wake_zeroed(pool, 1, ptr::null_mut()),
            flare_sim_inject_failure(pool, RawDriverCall(0), 1, 2),
            flare_sim_inject_panic(pool),
        ];
        for (i, st) in refused.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_INTERNAL, "call {i}");
        }
        assert_eq!(s.live_count, 0, "the snapshot was not written");
        let msg = last_error();
        assert!(
            msg.starts_with("flare_sim_inject_panic: the pool is poisoned")
                && msg.contains("flare_package_allocate: injected by flare_sim_inject_panic"),
            "{msg}"
        );
        // The driver holds both allocations (the panicking call's too).
        assert_eq!(sim.state().handles, 2);
    }
    // Destroy releases everything the pool holds, and reports both allocations.
    let (st, r) = destroy_report(pool);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS, "{}", last_error());
    assert_eq!((r.live_count, r.live_requested_bytes), (2, 4 * MIB));
    let d = sim.state();
    assert_eq!(
        (d.handles, d.reservations, d.mappings, d.physical_bytes),
        (0, 0, 0, 0),
        "destroy released what the driver held"
    );
    // Another pool is not affected.
    let other = create(&config());
    let (st, p) = allocate(other, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_SUCCESS);
    // SAFETY: `other` is live.
    unsafe {
        assert_eq!(
            flare_package_free(other, p),
            FlareStatus::FLARE_STATUS_SUCCESS
        );
        assert_eq!(flare_pool_destroy(other), FlareStatus::FLARE_STATUS_SUCCESS);
    }
}

#[test]
fn panic_injection_needs_a_pool() {
    // SAFETY: NULL is allowed.
    let st = unsafe { flare_sim_inject_panic(ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------- stream order
//
// Issue 11 through the C functions. The ABI's shape (NULL arguments, statuses,
// outputs written only on success, the simulated controls, NOT_SUPPORTED without the
// simulated driver, the configuration field) is checked first; then the semantics of
// the issue on the simulated backend, each ending with no contract fault.

use crate::driver::sim::SimStreamCall;
use crate::driver::{MemInfo, PhysicalHandle, Reservation};
use crate::{CrossStreamReuse, DevicePtr, Driver, DriverCall, DriverError, Pool, SimDriver};

/// A status that must be success, with the message when it is not.
#[track_caller]
fn ok(status: FlareStatus) {
    assert_eq!(
        status,
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
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

#[test]
fn stream_calls_refuse_null_arguments_and_write_nothing() {
    let pool = create(&config());
    let s = stream_create(pool);
    let live = allocate_on(pool, MIB as usize, s);
    let before = snap(pool);
    let null = ptr::null_mut::<FlarePool>();
    let sentinel = 0x5e5e as *mut c_void;
    let mut out = sentinel;
    let mut stream_out = sentinel;
    let mut valid: std::ffi::c_int = 7;
    let mut n = 77_u64;
    // SAFETY: NULL pools and outputs are refused before anything is read; the
    // non-NULL outputs are writable locals.
    unsafe {
        let refused = [
            flare_package_allocate_async(null, 1, s, &mut out),
            flare_package_free_async(null, live, s),
            flare_package_free_async(null, ptr::null_mut(), s),
            flare_package_record_stream(null, live, s),
            flare_sim_stream_create(null, &mut stream_out),
            flare_sim_launch(null, s, live, 1),
            flare_sim_stream_complete(null, s),
            flare_sim_begin_capture(null, s),
            flare_sim_end_capture(null, s, &mut valid),
            flare_sim_faults(null, &mut n),
        ];
        for (i, st) in refused.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, "call {i}");
        }
        assert!(last_error().contains("flare_sim_faults: invalid argument: pool is NULL"));
        // NULL outputs.
        let st = flare_package_allocate_async(pool, 1, s, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_ptr is NULL"), "{}", last_error());
        let st = flare_sim_stream_create(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_stream is NULL"));
        let st = flare_sim_end_capture(pool, s, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_valid is NULL"));
        let st = flare_sim_faults(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_faults is NULL"));
        // A misaligned output is refused too, not written.
        let mut words = [0xabab_u64; 2];
        let odd = words.as_mut_ptr().cast::<u8>().add(1).cast::<u64>();
        let st = flare_sim_faults(pool, odd);
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("out_faults is misaligned"));
        assert_eq!(words, [0xabab; 2]);
        // NULL pointers to free or record: no-ops, as for flare_package_free.
        ok(flare_package_free_async(pool, ptr::null_mut(), s));
        ok(flare_package_free_async(
            pool,
            ptr::null_mut(),
            ptr::null_mut(),
        ));
        ok(flare_package_record_stream(pool, ptr::null_mut(), s));
        // Sizes: 0 is refused, and so is one beyond the device; nothing written.
        let (st, p) = allocate_async(pool, 0, s);
        assert_eq!(
            (st, p),
            (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, sentinel)
        );
        assert!(last_error().contains("0 bytes"), "{}", last_error());
        let (st, p) = allocate_async(pool, usize::MAX, s);
        assert_eq!(
            (st, p),
            (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, sentinel)
        );
        // Pointers: unknown, interior.
        let interior = live.cast::<u8>().add(4096).cast::<c_void>();
        for bad in [0x1234 as *mut c_void, interior] {
            let st = flare_package_free_async(pool, bad, s);
            assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
            let st = flare_package_record_stream(pool, bad, s);
            assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
        }
        assert!(last_error().starts_with("flare_package_record_stream: unknown pointer"));
    }
    assert_eq!(
        (out, stream_out, valid, n),
        (sentinel, sentinel, 7, 77),
        "outputs only on success"
    );
    assert_eq!(snap(pool), before, "nothing changed");
    // The legacy stream (NULL) is a stream like another for the calls that take one.
    // SAFETY: `pool` is live, `live` its allocation.
    ok(unsafe { flare_package_record_stream(pool, live, ptr::null_mut()) });
    free_on(pool, live, s);
    complete(pool, s);
    complete(pool, ptr::null_mut());
    // A second free is an unknown pointer.
    // SAFETY: `pool` is live.
    let st = unsafe { flare_package_free_async(pool, live, s) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_UNKNOWN_POINTER);
    trim_check_destroy(pool);
}

#[test]
fn simulated_stream_controls_refuse_misuse_with_its_cuda_error() {
    let pool = create(&config());
    let s = stream_create(pool);
    let t = stream_create(pool);
    assert!(!s.is_null() && !t.is_null() && s != t, "two new streams");
    let p = allocate_on(pool, 2 * MIB as usize, s);
    let bogus = 0xdead_0000 as FlareStream;
    let refused = |st: FlareStatus, cuda: &str| {
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        let msg = last_error();
        assert!(msg.contains(cuda), "{msg} lacks {cuda}");
    };
    let mut valid: std::ffi::c_int = 7;
    // SAFETY: `pool` is live; `valid` is writable.
    unsafe {
        refused(
            flare_sim_launch(pool, bogus, p, 1),
            "flare_sim_launch: invalid argument: cuLaunchKernel on stream 0xdead0000: \
             CUDA_ERROR_INVALID_HANDLE (400)",
        );
        // Past the 2 MiB mapping: not mapped (on a GPU the kernel would fault).
        refused(
            flare_sim_launch(pool, s, p, 2 * MIB as usize + 1),
            "CUDA_ERROR_INVALID_VALUE (1)",
        );
        refused(
            flare_sim_stream_complete(pool, bogus),
            "CUDA_ERROR_INVALID_HANDLE",
        );
        // The legacy stream cannot be captured.
        refused(
            flare_sim_begin_capture(pool, ptr::null_mut()),
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)",
        );
        refused(
            flare_sim_begin_capture(pool, bogus),
            "CUDA_ERROR_INVALID_HANDLE",
        );
        // End without a capture.
        refused(
            flare_sim_end_capture(pool, t, &mut valid),
            "CUDA_ERROR_ILLEGAL_STATE (401)",
        );
        assert_eq!(valid, 7, "not written");
        ok(flare_sim_begin_capture(pool, s));
        refused(flare_sim_begin_capture(pool, s), "CUDA_ERROR_ILLEGAL_STATE");
    }
    // A global-mode capture is ended by the thread that began it only.
    let (addr, handle) = (pool as usize, s as usize);
    let other = std::thread::spawn(move || {
        let mut valid: std::ffi::c_int = 7;
        // SAFETY: the pool outlives this thread (joined below); `valid` is writable.
        let st = unsafe {
            flare_sim_end_capture(addr as *mut FlarePool, handle as FlareStream, &mut valid)
        };
        (st, valid, last_error())
    })
    .join()
    .unwrap_or_else(|_| panic!("the thread panicked"));
    assert_eq!(other.0, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(other.1, 7);
    assert!(
        other
            .2
            .contains("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908)"),
        "{}",
        other.2
    );
    // Launches into the capture are graph nodes: nothing queued, nothing to complete.
    launch(pool, s, p, 2 * MIB);
    assert!(end_capture(pool, s), "nothing broke the capture");
    assert_eq!(snap_sim(pool).queued_work().len(), 0);
    // Outside a capture, launches are queued work until their stream completes.
    launch(pool, s, p, MIB);
    launch(pool, ptr::null_mut(), p, 0);
    assert_eq!(snap_sim(pool).queued_work().len(), 2);
    complete(pool, s);
    complete(pool, ptr::null_mut());
    assert_eq!(snap_sim(pool).queued_work().len(), 0);
    assert_eq!(faults(pool), 0);
    free_on(pool, p, s);
    trim_check_destroy(pool);
}

/// `flare_sim_stream_create` makes its stream on the pool's device (the simulated
/// driver creates streams on the calling thread's current device, 0 by default), so
/// that work launched on it may touch the pool's memory, which only the pool's device
/// (and its peers) have access to; the thread's current device is left as it was.
#[test]
fn simulated_streams_are_created_on_the_pool_device() {
    let mut c = config();
    c.sim_device_count = 2;
    c.device = 1;
    let pool = create(&c);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    assert_eq!(sim.ctx_get_device(), 0, "the thread's device is restored");
    let (st, p) = allocate(pool, 2 * MIB as usize);
    ok(st);
    assert_eq!(sim.access_of(p as usize as u64), vec![1]);
    launch(pool, s, p, 2 * MIB);
    complete(pool, s);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_free(pool, p) });
    trim_check_destroy(pool);
}

/// A capture broken by a device synchronize ends invalid (`out_valid` 0, still a
/// success) and the fault is counted: the stream-less free outside a scope
/// synchronizes (issue 11 keeps that path as it was), which CUDA refuses during a
/// capture and which invalidates it (`docs/vmm-semantics.md`, "Stream capture").
#[test]
fn a_capture_broken_by_a_synchronize_ends_invalid_and_counts_a_fault() {
    let pool = create(&config());
    let s = stream_create(pool);
    let (st, p) = allocate(pool, 2 * MIB as usize);
    ok(st);
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_begin_capture(pool, s) });
    assert_eq!(faults(pool), 0);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_free(pool, p) });
    assert_eq!(faults(pool), 1, "the synchronize broke the capture");
    assert_eq!(snap(pool).sync_failures, 1);
    assert!(!end_capture(pool, s), "the capture ended invalidated");
    // The capture is over: a second end is refused.
    let mut valid: std::ffi::c_int = 7;
    // SAFETY: `pool` is live; `valid` is writable.
    let st = unsafe { flare_sim_end_capture(pool, s, &mut valid) };
    assert_eq!((st, valid), (FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, 7));
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    assert_eq!(snap(pool).physical_bytes, 0);
    assert_eq!(faults(pool), 1, "the count stays");
    destroy(pool);
}

/// A driver that is not the simulated one to the pool (it wraps one): what a CUDA
/// pool looks like to the `flare_sim_*` functions, without a GPU.
struct NotSimulated(SimDriver);

impl Driver for NotSimulated {
    fn granularity(&self) -> Result<u64, DriverError> {
        <SimDriver as Driver>::granularity(&self.0)
    }
    fn create(&self, size: u64) -> Result<PhysicalHandle, DriverError> {
        <SimDriver as Driver>::create(&self.0, size)
    }
    fn release(&self, handle: PhysicalHandle) -> Result<(), DriverError> {
        <SimDriver as Driver>::release(&self.0, handle)
    }
    fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        <SimDriver as Driver>::reserve(&self.0, size)
    }
    fn free_reservation(&self, reservation: Reservation) -> Result<(), DriverError> {
        <SimDriver as Driver>::free_reservation(&self.0, reservation)
    }
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DriverError> {
        <SimDriver as Driver>::map(&self.0, ptr, handle)
    }
    fn set_access(&self, ptr: DevicePtr, size: u64, devices: &[i32]) -> Result<(), DriverError> {
        <SimDriver as Driver>::set_access(&self.0, ptr, size, devices)
    }
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DriverError> {
        <SimDriver as Driver>::unmap(&self.0, ptr, size)
    }
    fn synchronize(&self, device: i32) -> Result<(), DriverError> {
        <SimDriver as Driver>::synchronize(&self.0, device)
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        <SimDriver as Driver>::mem_info(&self.0)
    }
}

#[test]
fn simulated_controls_are_not_supported_without_the_simulated_driver() {
    let driver = std::sync::Arc::new(NotSimulated(SimDriver::default()));
    let pool =
        Pool::with_driver(crate::PoolConfig::default(), driver).unwrap_or_else(|e| panic!("{e}"));
    assert!(pool.sim_driver().is_none());
    let pool = Box::into_raw(Box::new(FlarePool::new(pool, 0)));
    let (st, p) = allocate(pool, MIB as usize);
    ok(st);
    let sentinel = 0x5e5e as *mut c_void;
    let mut stream_out = sentinel;
    let mut valid: std::ffi::c_int = 7;
    let mut n = 77_u64;
    let s = 0x1000 as FlareStream;
    // SAFETY: `pool` is live; the outputs are writable locals.
    unsafe {
        let statuses = [
            flare_sim_stream_create(pool, &mut stream_out),
            flare_sim_launch(pool, s, p, 1),
            flare_sim_stream_complete(pool, s),
            flare_sim_begin_capture(pool, s),
            flare_sim_end_capture(pool, s, &mut valid),
            flare_sim_faults(pool, &mut n),
            flare_sim_inject_failure(pool, RawDriverCall(0), 1, 2),
            flare_sim_inject_panic(pool),
        ];
        for (i, st) in statuses.into_iter().enumerate() {
            assert_eq!(st, FlareStatus::FLARE_STATUS_NOT_SUPPORTED, "call {i}");
        }
        assert!(last_error().contains("not supported"), "{}", last_error());
        // A NULL output is an invalid argument before anything else.
        let st = flare_sim_faults(pool, ptr::null_mut());
        assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
        ok(flare_package_free(pool, p));
    }
    assert_eq!((stream_out, valid, n), (sentinel, 7, 77), "nothing written");
    destroy(pool);
}

/// `read_config` of `c` (with `struct_size` as set): the Rust configuration.
fn read(c: &FlarePoolConfig) -> Result<crate::PoolConfig, Error> {
    // SAFETY: `c` is a whole, aligned FlarePoolConfig, its pointers valid.
    let arg = unsafe { super::pool::ConfigArg::new(c) }.unwrap_or_else(|| panic!("NULL"));
    super::pool::read_config(&arg)
}

#[test]
fn config_cross_stream_reuse_is_read_validated_and_versioned() {
    let c = config();
    assert_eq!(c.cross_stream_reuse, 0, "config_init writes WHEN_COMPLETE");
    let mode = |raw: u32| {
        read(&FlarePoolConfig {
            cross_stream_reuse: raw,
            ..c
        })
    };
    assert_eq!(
        mode(0).map(|c| c.cross_stream_reuse),
        Ok(CrossStreamReuse::WhenComplete)
    );
    assert_eq!(
        mode(1).map(|c| c.cross_stream_reuse),
        Ok(CrossStreamReuse::Never)
    );
    assert_eq!(
        mode(2).map(|c| c.cross_stream_reuse),
        Ok(CrossStreamReuse::Wait)
    );
    // An unknown value: refused by create, nothing written.
    let bad = FlarePoolConfig {
        cross_stream_reuse: 3,
        ..c
    };
    let mut pool = 0x5e5e as *mut FlarePool;
    // SAFETY: `bad` is a valid config, `pool` writable.
    let st = unsafe { flare_pool_create(&bad, &mut pool) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(pool, 0x5e5e as *mut FlarePool);
    assert!(
        last_error().contains("cross_stream_reuse 3 is not a FlareCrossStreamReuse (0..2)"),
        "{}",
        last_error()
    );
    // A caller compiled before the field (struct_size 64): the bytes where it would
    // be are not read, the mode is the default, even when they hold a bad value.
    for raw in [2, 3, u32::MAX] {
        let older = FlarePoolConfig {
            struct_size: 64,
            cross_stream_reuse: raw,
            ..c
        };
        assert_eq!(
            read(&older).map(|c| c.cross_stream_reuse),
            Ok(CrossStreamReuse::WhenComplete),
            "raw {raw}"
        );
    }
    // struct_size 68 covers the field: read.
    let exact = FlarePoolConfig {
        struct_size: 68,
        cross_stream_reuse: 2,
        ..c
    };
    assert_eq!(
        read(&exact).map(|c| c.cross_stream_reuse),
        Ok(CrossStreamReuse::Wait)
    );
    // The other fields are read as before.
    let other = read(&FlarePoolConfig {
        release_threshold_bytes: 5 * MIB,
        cross_stream_reuse: 1,
        ..c
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(other.release_threshold_bytes, 5 * MIB);
    assert_eq!(other.best_fit_max_waste_percent, 30);
}

#[test]
fn config_segment_whole_threshold_is_read_and_versioned() {
    let c = config();
    assert_eq!(
        c.segment_whole_threshold_bytes, 0,
        "config_init writes 0 (the default)"
    );
    let threshold = |raw: u64, struct_size: u32| {
        read(&FlarePoolConfig {
            struct_size,
            reuse_policy: FlareReusePolicy::FLARE_REUSE_SEGMENTS as u32,
            segment_whole_threshold_bytes: raw,
            ..c
        })
        .map(|c| (c.reuse_policy, c.segment_whole_threshold_bytes))
    };
    // 0 is the default, no request takes a whole mapping: u64::MAX.
    assert_eq!(threshold(0, 80), Ok((ReusePolicy::Segments, u64::MAX)));
    // Any other value is taken as it is, in bytes.
    assert_eq!(threshold(MIB, 80), Ok((ReusePolicy::Segments, MIB)));
    assert_eq!(threshold(1, 80), Ok((ReusePolicy::Segments, 1)));
    // A caller compiled before the field (sizeof 72, struct_size 72, or anything
    // short of its end at 80): its bytes are not read, the default holds.
    for size in [72, 76, 79] {
        assert_eq!(
            threshold(MIB, size),
            Ok((ReusePolicy::Segments, u64::MAX)),
            "struct_size {size}"
        );
    }
}

/// Issue 13's C fields: `thread_cache_entries` (0: the default, 32;
/// `FLARE_THREAD_CACHE_OFF`: off, the Rust API's 0) and `thread_cache_bytes` (0: the
/// default, 1 GiB), read only when `struct_size` covers them.
#[test]
fn config_thread_cache_fields_are_read_and_versioned() {
    let c = config();
    assert_eq!(
        (c.thread_cache_entries, c.thread_cache_bytes),
        (32, GIB),
        "config_init writes the defaults"
    );
    assert_eq!(FLARE_THREAD_CACHE_OFF, u32::MAX);
    let caches = |entries: u32, bytes: u64, struct_size: u32| {
        read(&FlarePoolConfig {
            struct_size,
            thread_cache_entries: entries,
            thread_cache_bytes: bytes,
            ..c
        })
        .map(|c| (c.thread_cache_entries, c.thread_cache_bytes))
    };
    // 0 is the default in both; OFF turns the caches off (0 entries in Rust).
    assert_eq!(caches(0, 0, 96), Ok((32, GIB)));
    assert_eq!(caches(FLARE_THREAD_CACHE_OFF, 0, 96), Ok((0, GIB)));
    // Any other value is taken as it is: entries, bytes.
    assert_eq!(caches(1, 1, 96), Ok((1, 1)));
    assert_eq!(caches(7, 3 * MIB, 96), Ok((7, 3 * MIB)));
    assert_eq!(
        caches(u32::MAX - 1, u64::MAX, 96),
        Ok((u32::MAX - 1, u64::MAX))
    );
    // A caller compiled before the fields (sizeof 80): neither is read, whatever the
    // bytes where they would be hold.
    for size in [80, 83] {
        assert_eq!(
            caches(FLARE_THREAD_CACHE_OFF, MIB, size),
            Ok((32, GIB)),
            "struct_size {size}"
        );
    }
    // Covering thread_cache_entries, not thread_cache_bytes (which ends at 96).
    for size in [84, 88, 95] {
        assert_eq!(
            caches(FLARE_THREAD_CACHE_OFF, MIB, size),
            Ok((0, GIB)),
            "struct_size {size}"
        );
    }
    // The rest of the configuration is read as before.
    let other = read(&FlarePoolConfig {
        thread_cache_entries: FLARE_THREAD_CACHE_OFF,
        segment_whole_threshold_bytes: MIB,
        ..c
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            other.segment_whole_threshold_bytes,
            other.best_fit_max_waste_percent
        ),
        (MIB, 30)
    );
}

// ---- the semantics (they need the stream-ordered engine of issue 11)

/// Issue 11: "memory whose last free was on S is handed out at once (stream order
/// makes it safe)", and "no host synchronization, ever, on this path", with the
/// default release threshold (0) and work still queued on the memory.
#[test]
fn free_async_then_allocate_async_on_the_same_stream_reuses_at_once() {
    let pool = stream_pool(0, 0);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    let p = allocate_on(pool, 3 * MIB as usize, s);
    launch(pool, s, p, 3 * MIB);
    free_on(pool, p, s);
    let after_free = snap(pool);
    assert_eq!(
        (
            after_free.live_count,
            after_free.idle_bytes,
            after_free.physical_bytes
        ),
        (0, 4 * MIB, 4 * MIB),
        "kept idle, not released, while S's work touches it"
    );
    assert_eq!(
        after_free.event_wait_bytes,
        4 * MIB,
        "S's work up to the free is not complete"
    );
    let q = allocate_on(pool, 3 * MIB as usize, s);
    assert_eq!(q, p, "the same stream gets it back at once");
    let s2 = snap(pool);
    assert_eq!((s2.reuse_hits, s2.cross_stream_hits), (1, 0));
    assert_eq!(faults(pool), 0);
    assert_eq!(sim.queued_work().len(), 1, "the launch is still queued");
    // No host synchronization on these paths: no device, stream or event synchronize.
    assert_eq!(sim.call_count(DriverCall::Synchronize), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::EventSynchronize), 0);
    assert_eq!(sim.stream_call_count(SimStreamCall::StreamSynchronize), 0);
    free_on(pool, q, s);
    complete(pool, s);
    trim_check_destroy(pool);
}

/// Issue 11, `cross_stream_reuse` "when complete" (the default): memory freed on S is
/// handed to another stream T only once S's work up to the free has completed. A
/// release threshold keeps the completed memory cached, so that T can get it.
#[test]
fn another_stream_gets_freed_memory_only_after_the_free_completes() {
    let pool = stream_pool(64 * MIB, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, p, 2 * MIB);
    free_on(pool, p, s);
    let r = allocate_on(pool, 2 * MIB as usize, t);
    assert_ne!(r, p, "T must not get memory S's queued work still touches");
    assert_eq!(faults(pool), 0);
    assert_eq!(snap(pool).cross_stream_hits, 0);
    complete(pool, s);
    let u = allocate_on(pool, 2 * MIB as usize, t);
    assert_eq!(u, p, "S's work completed: T gets it");
    let st = snap(pool);
    assert_eq!((st.cross_stream_hits, st.cross_stream_waits), (1, 0));
    assert_eq!(faults(pool), 0);
    free_on(pool, r, t);
    free_on(pool, u, t);
    trim_check_destroy(pool);
}

/// Issue 11, `cross_stream_reuse` "wait": memory freed on S is handed to T at once,
/// after making T wait on a fence recorded on S (`cuStreamWaitEvent`), so the hand-off
/// is ordered and no fault is seen.
#[test]
fn cross_stream_wait_hands_memory_over_at_once_with_a_wait() {
    let pool = stream_pool(0, CrossStreamReuse::Wait as u32);
    let sim = snap_sim(pool);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, p, 2 * MIB);
    free_on(pool, p, s);
    let r = allocate_on(pool, 2 * MIB as usize, t);
    assert_eq!(r, p, "handed over at once");
    let st = snap(pool);
    assert_eq!((st.cross_stream_hits, st.cross_stream_waits), (1, 1));
    assert!(sim.stream_call_count(SimStreamCall::StreamWaitEvent) >= 1);
    assert_eq!(faults(pool), 0);
    free_on(pool, r, t);
    complete(pool, t); // T's work, and S's work it waits on
    trim_check_destroy(pool);
}

/// Issue 11: "a free never synchronizes, never unmaps and records nothing that breaks
/// the capture; memory freed during the capture is reused only by later allocations
/// on the same capture, and afterwards is kept ... with none open, until trim or
/// destroy". No retention scope anywhere, release threshold 0.
#[test]
fn a_free_async_during_a_capture_leaves_it_valid_without_a_scope() {
    let pool = stream_pool(0, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let before = allocate_on(pool, 2 * MIB as usize, s);
    // SAFETY: `pool` is live.
    ok(unsafe { flare_sim_begin_capture(pool, s) });
    let inside = allocate_on(pool, 2 * MIB as usize, s);
    launch(pool, s, inside, 2 * MIB);
    free_on(pool, inside, s);
    free_on(pool, before, s);
    let again = allocate_on(pool, 2 * MIB as usize, s);
    free_on(pool, again, s);
    assert_eq!(faults(pool), 0, "nothing broke the capture");
    assert!(end_capture(pool, s), "the capture ended valid");
    let st = snap(pool);
    assert_eq!(st.live_count, 0);
    assert!(st.physical_bytes >= 4 * MIB, "{st:?}");
    assert_eq!(
        st.capture_held_bytes, st.physical_bytes,
        "everything freed in the capture is kept for the graph"
    );
    assert!(st.captures_seen >= 1);
    // After the capture, neither another stream nor the capturing one gets it.
    let on_t = allocate_on(pool, 2 * MIB as usize, t);
    let on_s = allocate_on(pool, 2 * MIB as usize, s);
    for p in [on_t, on_s] {
        assert!(
            p != before && p != inside && p != again,
            "memory a graph may replay into was handed out"
        );
    }
    free_on(pool, on_t, t);
    free_on(pool, on_s, s);
    assert_eq!(faults(pool), 0);
    // Trim releases what the capture held (no scope was open).
    trim_check_destroy(pool);
}

/// Issue 11: after `record_stream(p, T)`, a free of p on S waits for T's work too: p
/// is not handed back, even on S, while T's queued work touches it.
#[test]
fn record_stream_keeps_memory_from_reuse_while_the_recorded_stream_uses_it() {
    let pool = stream_pool(64 * MIB, 0);
    let s = stream_create(pool);
    let t = stream_create(pool);
    let p = allocate_on(pool, 2 * MIB as usize, s);
    // SAFETY: `pool` is live, `p` its allocation.
    ok(unsafe { flare_package_record_stream(pool, p, t) });
    launch(pool, t, p, 2 * MIB);
    free_on(pool, p, s);
    let q = allocate_on(pool, 2 * MIB as usize, s);
    assert_ne!(q, p, "T's queued work still touches p");
    assert_eq!(faults(pool), 0);
    complete(pool, t);
    free_on(pool, q, s);
    trim_check_destroy(pool);
}
