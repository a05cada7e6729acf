//! Tests of the C ABI called from Rust, as C calls it: statuses and messages, the
//! configuration's versioning, the panic boundary and poisoning, destroy reports.

use std::ffi::{c_char, c_void, CStr};
use std::mem::size_of;
use std::ptr;

use super::boundary::{boundary, pool_ref};
use super::*;
use crate::Error;

const MIB: u64 = 1 << 20;

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn config() -> FlarePoolConfig {
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
    let table: [(u32, &str); 13] = [
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
        (10, "FLARE_STATUS_UNRECOGNIZED"),
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
    assert_eq!(FlareStatus::ALL.len(), 10);
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
    // 56..60, best_fit_max_waste_percent 60..64.
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
    // This header's struct, and a newer caller's larger one: 64 bytes written,
    // struct_size says 64, the rest untouched.
    for size in [64, 100, 128] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), 64, "size {size}");
        assert_eq!(u32_at(&b, 12), 0, "best fit");
        assert_eq!(u32_at(&b, 60), 30, "the default waste bound");
        assert!(b.0[64..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // NULL is a no-op.
    // SAFETY: NULL is allowed.
    unsafe { flare_pool_config_init(ptr::null_mut(), 64) };
    // What an older caller initialised creates a pool with the defaults.
    let b = init_into(40);
    let mut older = FlarePoolConfig::default_for_layout();
    // SAFETY: both are 64 bytes; every byte pattern is a valid FlarePoolConfig.
    unsafe { ptr::copy_nonoverlapping(b.0.as_ptr(), ptr::addr_of_mut!(older).cast::<u8>(), 64) };
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

fn destroy_report(pool: *mut FlarePool) -> (FlareStatus, FlareDestroyReport) {
    let mut r = FlareDestroyReport {
        struct_size: size_of::<FlareDestroyReport>() as u32,
        ..FlareDestroyReport::default()
    };
    // SAFETY: `pool` is NULL or live; `r` is a whole report.
    let st = unsafe { flare_pool_destroy_report(pool, &mut r) };
    (st, r)
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
    let pool = unsafe { pool_ref(pool) }.unwrap_or_else(|e| panic!("{e}"));
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
