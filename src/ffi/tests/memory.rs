#![cfg(not(flare_loom))]
//! The exported functions called from Rust as C calls them, one contract clause at a
//! time (issue 16: the bodies behind the C shells are mutated, and these catch the
//! mutants): NULL pools and outputs, misaligned outputs, `struct_size` versioning,
//! zero and overflowing sizes, unknown pointers, the counters after an allocate and
//! free, scopes, tags, fault injection, the last error's copy-out. Every expected
//! value comes from the function's documented contract (the header's comments) and
//! the simulated driver's defaults (2 MiB granularity, 140 GiB, one device).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::size_of;
use std::ptr;

use super::tests::{config, destroy_report, last_error};
use super::*;

const MIB: u64 = 1 << 20;
/// The simulated driver's default granularity.
const GRANULARITY: u64 = 2 * MIB;
const NULL_POOL: *mut FlarePool = ptr::null_mut();
const SENTINEL: *mut c_void = 0x5e5e as *mut c_void;

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

#[test]
fn every_call_on_a_pool_refuses_a_null_pool() {
    let mut out = SENTINEL;
    let mut s = FlareSnapshot {
        struct_size: size_of::<FlareSnapshot>() as u32,
        ..FlareSnapshot::default()
    };
    let mut c = FlareTagCensus {
        struct_size: size_of::<FlareTagCensus>() as u32,
        ..FlareTagCensus::default()
    };
    // SAFETY: NULL pools are refused before anything else is read; the outputs are
    // writable locals.
    let calls: [(&str, FlareStatus); 13] = unsafe {
        [
            (
                "flare_package_allocate",
                flare_package_allocate(NULL_POOL, 1, &mut out),
            ),
            (
                "flare_package_free",
                flare_package_free(NULL_POOL, SENTINEL),
            ),
            ("flare_retention_begin", flare_retention_begin(NULL_POOL)),
            ("flare_retention_finish", flare_retention_finish(NULL_POOL)),
            ("flare_retention_abort", flare_retention_abort(NULL_POOL)),
            ("flare_pool_trim", flare_pool_trim(NULL_POOL)),
            (
                "flare_pool_snapshot",
                flare_pool_snapshot(NULL_POOL, &mut s),
            ),
            (
                "flare_package_allocate_tagged",
                flare_package_allocate_tagged(NULL_POOL, 1, ptr::null_mut(), 1, &mut out),
            ),
            (
                "flare_pool_sleep",
                flare_pool_sleep(NULL_POOL, 1, RawSleepMode(0)),
            ),
            ("flare_pool_wake", flare_pool_wake(NULL_POOL, 1)),
            (
                "flare_pool_wake_zeroed",
                flare_pool_wake_zeroed(NULL_POOL, 1, ptr::null_mut()),
            ),
            (
                "flare_pool_tag_census",
                flare_pool_tag_census(NULL_POOL, 1, &mut c),
            ),
            (
                "flare_sim_inject_failure",
                flare_sim_inject_failure(NULL_POOL, RawDriverCall(0), 1, 999),
            ),
        ]
    };
    for (name, status) in calls {
        assert_eq!(status, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT, "{name}");
    }
    // Each call replaced the message; the last one's is exact.
    assert_eq!(
        last_error(),
        "flare_sim_inject_failure: invalid argument: pool is NULL"
    );
    // Nothing was written.
    assert_eq!(out, SENTINEL);
    assert_eq!(s.granularity_bytes, 0);
    assert_eq!(c.live_count, 0);
    // One at a time, each names itself.
    // SAFETY: as above.
    unsafe {
        refused(
            flare_pool_trim(NULL_POOL),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_trim",
            "pool is NULL",
        );
        refused(
            flare_pool_snapshot(NULL_POOL, &mut s),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_snapshot",
            "pool is NULL",
        );
        refused(
            flare_package_free(NULL_POOL, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_package_free",
            "pool is NULL",
        );
    }
}

#[test]
fn allocate_refuses_bad_outputs_and_sizes_and_writes_nothing() {
    let pool = create(&config());
    // NULL output.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_package_allocate(pool, 1, ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_package_allocate: invalid argument: out_ptr is NULL"
    );
    // A misaligned output: refused, not written.
    let mut words = [0x1111_u64; 3];
    let misaligned = words
        .as_mut_ptr()
        .cast::<u8>()
        .wrapping_add(1)
        .cast::<*mut c_void>();
    // SAFETY: `pool` is live; a misaligned output is refused before any write.
    let st = unsafe { flare_package_allocate(pool, 1, misaligned) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_package_allocate: invalid argument: out_ptr is misaligned"
    );
    assert_eq!(words, [0x1111; 3]);
    // A size of 0, and one whose rounding to the granularity overflows.
    for size in [0, usize::MAX] {
        let (st, p) = allocate(pool, size);
        refused(
            st,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_package_allocate",
            "invalid argument",
        );
        assert_eq!(p, SENTINEL, "size {size}: nothing written");
    }
    // The refusals changed nothing, and no mapping was made.
    let s = snap(pool);
    assert_eq!(
        (
            s.allocations,
            s.live_count,
            s.physical_bytes,
            s.mappings_created
        ),
        (0, 0, 0, 0)
    );
    // A NULL output is checked before the pool is asked: no allocation is leaked.
    assert_eq!(snap(pool).allocations, 0);
    destroy(pool);
}

#[test]
fn an_allocate_and_free_pair_moves_the_counters_as_the_contract_says() {
    // Defaults: best fit, release threshold 0 (a free outside a scope releases).
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    assert!(!p.is_null() && p != SENTINEL);
    assert_eq!(p as u64 % GRANULARITY, 0, "aligned to the granularity");
    // One byte is rounded up to the granularity: one 2 MiB mapping.
    let s = snap(pool);
    assert_eq!(s.struct_size, size_of::<FlareSnapshot>() as u32);
    assert_eq!(s.scope_open, 0);
    assert_eq!(s.granularity_bytes, GRANULARITY);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (1, 1, GRANULARITY)
    );
    assert_eq!(
        (s.physical_bytes, s.reserved_bytes, s.peak_physical_bytes),
        (GRANULARITY, GRANULARITY, GRANULARITY)
    );
    assert_eq!(
        (s.allocations, s.frees, s.mappings_created, s.reuse_hits),
        (1, 0, 1, 0)
    );
    assert_eq!((s.idle_count, s.idle_bytes, s.pending_count), (0, 0, 0));
    // A second allocation of 3 MiB + 1 maps 4 MiB.
    let (st, q) = allocate(pool, 3 * MIB as usize + 1);
    ok(st);
    assert_ne!(p, q);
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (2, 3 * MIB + 2, 3 * GRANULARITY)
    );
    assert_eq!(s.peak_live_mapped_bytes, 3 * GRANULARITY);
    // Free the first: released at once (threshold 0), the peaks stay.
    ok(free(pool, p));
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.live_requested_bytes, s.live_mapped_bytes),
        (1, 3 * MIB + 1, 2 * GRANULARITY)
    );
    assert_eq!((s.idle_count, s.idle_bytes), (0, 0));
    assert_eq!(s.physical_bytes, 2 * GRANULARITY);
    assert_eq!(s.peak_physical_bytes, 3 * GRANULARITY);
    assert_eq!((s.allocations, s.frees, s.mappings_released), (2, 1, 1));
    // The invariant the snapshot documents.
    assert_eq!(
        s.physical_bytes,
        s.live_mapped_bytes + s.idle_bytes + s.pending_bytes + s.segment_mapped_bytes
    );
    assert_eq!(s.allocations, s.frees + s.live_count);
    // A second free of `p`, an interior pointer of `q`, an address never handed
    // out: unknown, nothing changes.
    for bad in [
        p,
        q.cast::<u8>().wrapping_add(4096).cast::<c_void>(),
        0x7f00_0000_0000_usize as *mut c_void,
    ] {
        refused(
            free(pool, bad),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_free",
            "",
        );
    }
    // SAFETY: `pool` is live; the pointers are only compared.
    unsafe {
        refused(
            flare_package_free_async(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_free_async",
            "",
        );
        refused(
            flare_package_record_stream(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_UNKNOWN_POINTER,
            "flare_package_record_stream",
            "",
        );
    }
    // NULL: success, nothing happens.
    ok(free(pool, ptr::null_mut()));
    let after = snap(pool);
    assert_eq!(
        after, s,
        "the refused frees and the NULL free changed nothing"
    );
    ok(free(pool, q));
    let s = snap(pool);
    assert_eq!(
        (s.live_count, s.physical_bytes, s.reserved_bytes, s.frees),
        (0, 0, 0, 2)
    );
    destroy(pool);
}

#[test]
fn out_of_memory_is_its_own_status_and_writes_nothing() {
    // A 4 MiB device: a second 2 MiB mapping after 4 MiB does not fit now, but is
    // not larger than the device (so not REQUEST_TOO_LARGE).
    let mut c = config();
    c.sim_capacity_bytes = 4 * MIB;
    let pool = create(&c);
    let (st, p) = allocate(pool, 4 * MIB as usize);
    ok(st);
    let (st, q) = allocate(pool, 1);
    refused(
        st,
        FlareStatus::FLARE_STATUS_OUT_OF_MEMORY,
        "flare_package_allocate",
        "",
    );
    assert_eq!(q, SENTINEL);
    let (st, _) = allocate(pool, 4 * MIB as usize + 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE);
    let s = snap(pool);
    assert_eq!((s.live_count, s.physical_bytes), (1, 4 * MIB));
    ok(free(pool, p));
    // Released: the device has room again.
    let (st, q) = allocate(pool, 1);
    ok(st);
    ok(free(pool, q));
    destroy(pool);
}

#[test]
fn snapshot_refuses_bad_outputs_and_writes_only_inside_struct_size() {
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    // NULL and misaligned outputs.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_pool_snapshot(pool, ptr::null_mut()) };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_pool_snapshot: invalid argument: out is NULL"
    );
    let mut b = Buf::with_struct_size(size_of::<FlareSnapshot>() as u32);
    // SAFETY: `pool` is live; `b` has 512 writable bytes; the output is misaligned.
    let st = unsafe {
        flare_pool_snapshot(
            pool,
            b.0.as_mut_ptr().wrapping_add(4).cast::<FlareSnapshot>(),
        )
    };
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "flare_pool_snapshot: invalid argument: out is misaligned"
    );
    assert!(b.untouched_from(4));
    // struct_size below the two first fields, or above 4096: refused, nothing
    // written, the message names it.
    for bad in [0_u32, 4, 7, 4097, u32::MAX] {
        let mut b = Buf::with_struct_size(bad);
        // SAFETY: `pool` is live; `b` has 512 writable bytes, aligned.
        let st = unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) };
        refused(
            st,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_snapshot",
            &format!("snapshot.struct_size is {bad}"),
        );
        assert_eq!(b.u32_at(0), bad);
        assert!(b.untouched_from(4), "struct_size {bad}: nothing written");
    }
    // Layout: struct_size 0..4, scope_open 4..8, granularity_bytes 8..16,
    // live_count 16..24, live_requested_bytes 24..32.
    // 8: scope_open only.
    let mut b = Buf::with_struct_size(8);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u32_at(4)), (8, 0));
    assert!(b.untouched_from(8));
    // 20: up to granularity_bytes (live_count does not fit whole).
    let mut b = Buf::with_struct_size(20);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u64_at(8)), (20, GRANULARITY));
    assert!(b.untouched_from(16));
    // 32: through live_requested_bytes.
    let mut b = Buf::with_struct_size(32);
    // SAFETY: as above.
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u64_at(16), b.u64_at(24)), (1, 1));
    assert!(b.untouched_from(32));
    // A newer caller's larger struct: this library's fields, the rest untouched,
    // struct_size the caller's.
    let mut b = Buf::with_struct_size(512);
    // SAFETY: as above (512 bytes).
    ok(unsafe { flare_pool_snapshot(pool, b.0.as_mut_ptr().cast()) });
    assert_eq!(b.u32_at(0), 512);
    assert_eq!(b.u64_at(8), GRANULARITY);
    assert!(b.untouched_from(size_of::<FlareSnapshot>()));
    ok(free(pool, p));
    destroy(pool);
}

#[test]
fn the_retention_scope_opens_once_and_retains_until_it_closes() {
    let pool = create(&config());
    // SAFETY: `pool` is live throughout.
    unsafe {
        // No scope: finish and abort are refused.
        refused(
            flare_retention_finish(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_finish",
            "",
        );
        refused(
            flare_retention_abort(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_abort",
            "",
        );
        ok(flare_retention_begin(pool));
        assert_eq!(snap(pool).scope_open, 1);
        refused(
            flare_retention_begin(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_retention_begin",
            "",
        );
        refused(
            flare_pool_trim(pool),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_pool_trim",
            "",
        );
        // Freed inside the scope: retained idle, still mapped.
        let (st, p) = allocate(pool, 1);
        ok(st);
        ok(free(pool, p));
        let s = snap(pool);
        assert_eq!(
            (s.live_count, s.idle_count, s.idle_bytes, s.physical_bytes),
            (0, 1, GRANULARITY, GRANULARITY)
        );
        // Reused with no new mapping.
        let (st, q) = allocate(pool, 1);
        ok(st);
        assert_eq!(q, p, "the idle mapping is handed out again");
        let s = snap(pool);
        assert_eq!(
            (s.reuse_hits, s.reuse_exact_hits, s.mappings_created),
            (1, 1, 1)
        );
        ok(free(pool, q));
        // Finish releases what is idle.
        ok(flare_retention_finish(pool));
        let s = snap(pool);
        assert_eq!(
            (
                s.scope_open,
                s.idle_count,
                s.physical_bytes,
                s.scopes_finished
            ),
            (0, 0, 0, 1)
        );
        // Abort is counted apart.
        ok(flare_retention_begin(pool));
        ok(flare_retention_abort(pool));
        let s = snap(pool);
        assert_eq!((s.scopes_finished, s.scopes_aborted), (1, 1));
    }
    destroy(pool);
}

#[test]
fn trim_releases_what_the_threshold_cached() {
    let mut c = config();
    c.release_threshold_bytes = 64 * MIB;
    let pool = create(&c);
    let (st, p) = allocate(pool, 1);
    ok(st);
    ok(free(pool, p));
    // Under the threshold: cached idle.
    let s = snap(pool);
    assert_eq!(
        (
            s.idle_count,
            s.idle_bytes,
            s.physical_bytes,
            s.mappings_released
        ),
        (1, GRANULARITY, GRANULARITY, 0)
    );
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    let s = snap(pool);
    assert_eq!(
        (
            s.idle_count,
            s.idle_bytes,
            s.physical_bytes,
            s.reserved_bytes
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(s.mappings_released, 1);
    // Nothing left: trim again succeeds and changes nothing.
    // SAFETY: `pool` is live.
    ok(unsafe { flare_pool_trim(pool) });
    assert_eq!(snap(pool), s);
    destroy(pool);
}

/// A change to a configuration.
type SetField = fn(&mut FlarePoolConfig);

#[test]
fn create_refuses_bad_arguments_and_writes_no_pool() {
    let sentinel = 0x5e5e as *mut FlarePool;
    let good = config();
    let try_create = |c: *const FlarePoolConfig| {
        let mut out = sentinel;
        // SAFETY: `c` is NULL or a whole config (or a refused misaligned pointer
        // into one); `out` is writable.
        let st = unsafe { flare_pool_create(c, &mut out) };
        assert_eq!(out, sentinel, "nothing written on failure");
        st
    };
    refused(
        try_create(ptr::null()),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "config is NULL",
    );
    // NULL config and NULL output: the config is named first.
    // SAFETY: both NULL, refused.
    let st = unsafe { flare_pool_create(ptr::null(), ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "config is NULL",
    );
    // SAFETY: `good` is a whole config; a NULL output is refused.
    let st = unsafe { flare_pool_create(&good, ptr::null_mut()) };
    assert_eq!(
        (st, last_error()),
        (
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_create: invalid argument: out_pool is NULL".to_string()
        )
    );
    // A misaligned output.
    let mut words = [7_u64; 3];
    let misaligned = words
        .as_mut_ptr()
        .cast::<u8>()
        .wrapping_add(4)
        .cast::<*mut FlarePool>();
    // SAFETY: `good` is whole; the misaligned output is refused before any write.
    let st = unsafe { flare_pool_create(&good, misaligned) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "out_pool is misaligned",
    );
    assert_eq!(words, [7; 3]);
    // A misaligned config.
    let mut bytes = Buf([0; 512]);
    // SAFETY: `good` is a whole config, `bytes` has room for it at offset 4.
    unsafe {
        ptr::copy_nonoverlapping(
            ptr::addr_of!(good).cast::<u8>(),
            bytes.0.as_mut_ptr().add(4),
            size_of::<FlarePoolConfig>(),
        )
    };
    refused(
        try_create(bytes.0.as_ptr().wrapping_add(4).cast()),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "config is misaligned",
    );
    // Field values the contract refuses.
    let bad_values: [(&str, SetField); 7] = [
        ("config.struct_size is 0", |c| c.struct_size = 0),
        ("config.struct_size is 4097", |c| c.struct_size = 4097),
        ("backend", |c| c.backend = 7),
        ("reuse_policy", |c| c.reuse_policy = 99),
        ("cross_stream_reuse", |c| c.cross_stream_reuse = 99),
        ("peer_devices (with peer_device_count > 0) is NULL", |c| {
            c.peer_device_count = 1
        }),
        ("peer_device_count 1025 is above 1024", |c| {
            c.peer_device_count = 1025
        }),
    ];
    for (detail, set) in bad_values {
        let mut c = good;
        set(&mut c);
        refused(
            try_create(&c),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_create",
            detail,
        );
    }
    // An empty recording path is refused.
    let empty = CString::default();
    let mut c = good;
    c.record_path = empty.as_ptr();
    refused(
        try_create(&c),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "record_path is empty",
    );
    // Peer devices are read: a negative ordinal is refused, device 0 (the pool's
    // own) is not.
    let negative = [0_i32, -1];
    let mut c = good;
    c.peer_devices = negative.as_ptr();
    c.peer_device_count = 2;
    refused(
        try_create(&c),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_create",
        "peer device ordinal -1 is negative",
    );
    c.peer_device_count = 1;
    let pool = create(&c);
    destroy(pool);
    // At most 1024 peers: 1024 is read (every one device 0).
    let many = [0_i32; 1024];
    c.peer_devices = many.as_ptr();
    c.peer_device_count = 1024;
    let pool = create(&c);
    destroy(pool);
    // The simulated fields are read: a 6 MiB device with a 4 MiB granularity.
    let mut c = good;
    c.sim_capacity_bytes = 6 * MIB;
    c.sim_granularity_bytes = 4 * MIB;
    let pool = create(&c);
    assert_eq!(snap(pool).granularity_bytes, 4 * MIB);
    let (st, p) = allocate(pool, 1);
    ok(st);
    assert_eq!(snap(pool).physical_bytes, 4 * MIB);
    let (st, _) = allocate(pool, 4 * MIB as usize + 1);
    assert_eq!(
        st,
        FlareStatus::FLARE_STATUS_REQUEST_TOO_LARGE,
        "8 MiB > 6 MiB"
    );
    ok(free(pool, p));
    destroy(pool);
    // NULL destroy: success, nothing happens.
    // SAFETY: NULL is allowed.
    ok(unsafe { flare_pool_destroy(ptr::null_mut()) });
}

#[test]
fn tags_sleep_and_wake_with_their_statuses_and_census() {
    let pool = create(&config());
    const TAG: u32 = 3;
    // A tag never used reads all zeros.
    let zero = census(pool, TAG);
    assert_eq!(
        zero,
        FlareTagCensus {
            struct_size: size_of::<FlareTagCensus>() as u32,
            ..FlareTagCensus::default()
        }
    );
    // NULL census output, and a struct_size below its two first fields.
    // SAFETY: `pool` is live; a NULL output is refused.
    let st = unsafe { flare_pool_tag_census(pool, TAG, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_tag_census",
        "out is NULL",
    );
    let mut b = Buf::with_struct_size(4);
    // SAFETY: `pool` is live; `b` has 512 writable bytes.
    let st = unsafe { flare_pool_tag_census(pool, TAG, b.0.as_mut_ptr().cast()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_tag_census",
        "tag census.struct_size is 4",
    );
    assert!(b.untouched_from(4));
    // A NULL output for the tagged allocation.
    // SAFETY: `pool` is live; the NULL output is refused.
    let st =
        unsafe { flare_package_allocate_tagged(pool, 1, ptr::null_mut(), TAG, ptr::null_mut()) };
    refused(
        st,
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_package_allocate_tagged",
        "out_ptr is NULL",
    );
    // One byte for the tag: a whole 2 MiB mapping of its own.
    let (st, p) = allocate_tagged(pool, 1, TAG);
    ok(st);
    assert!(!p.is_null() && p != SENTINEL);
    let c = census(pool, TAG);
    assert_eq!(
        (c.sleeping, c.live_count, c.live_bytes, c.peak_live_bytes),
        (0, 1, GRANULARITY, GRANULARITY)
    );
    assert_eq!(
        (c.idle_bytes, c.physical_bytes, c.offloaded_bytes),
        (0, GRANULARITY, 0)
    );
    // A partial census: struct_size 8 writes `sleeping` only.
    let mut b = Buf::with_struct_size(8);
    // SAFETY: as above.
    ok(unsafe { flare_pool_tag_census(pool, TAG, b.0.as_mut_ptr().cast()) });
    assert_eq!((b.u32_at(0), b.u32_at(4)), (8, 0));
    assert!(b.untouched_from(8));
    // SAFETY: `pool` is live throughout.
    unsafe {
        // An unknown mode, and waking a tag that does not sleep.
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(2)),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_pool_sleep",
            "mode",
        );
        refused(
            flare_pool_wake(pool, TAG),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake",
            "",
        );
        // No sleep inside a retention scope.
        ok(flare_retention_begin(pool));
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(1)),
            FlareStatus::FLARE_STATUS_SCOPE_STATE,
            "flare_pool_sleep",
            "",
        );
        ok(flare_retention_finish(pool));
        // Offload: the physical bytes go, the requested byte is kept on the host.
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(1)));
        let c = census(pool, TAG);
        assert_eq!(
            (
                c.sleeping,
                c.live_count,
                c.physical_bytes,
                c.offloaded_bytes
            ),
            (1, 1, 0, 1)
        );
        assert_eq!(snap(pool).physical_bytes, 0);
        // While it sleeps: a second sleep, an allocation, a record_stream of its
        // allocation are refused.
        refused(
            flare_pool_sleep(pool, TAG, RawSleepMode(0)),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_sleep",
            "",
        );
        let (st, q) = allocate_tagged(pool, 1, TAG);
        refused(
            st,
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_package_allocate_tagged",
            "",
        );
        assert_eq!(q, SENTINEL);
        refused(
            flare_package_record_stream(pool, p, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_package_record_stream",
            "",
        );
        // Other tags are untouched.
        let (st, other) = allocate_tagged(pool, 1, TAG + 1);
        ok(st);
        assert_eq!(census(pool, TAG + 1).physical_bytes, GRANULARITY);
        ok(free(pool, other));
        // Wake: mapped again at the same address, the host copy freed.
        ok(flare_pool_wake(pool, TAG));
        let c = census(pool, TAG);
        assert_eq!(
            (
                c.sleeping,
                c.live_count,
                c.physical_bytes,
                c.offloaded_bytes
            ),
            (0, 1, GRANULARITY, 0)
        );
        refused(
            flare_pool_wake(pool, TAG),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake",
            "",
        );
    }
    ok(free(pool, p));
    let c = census(pool, TAG);
    assert_eq!((c.live_count, c.live_bytes, c.physical_bytes), (0, 0, 0));
    destroy(pool);
}

/// `flare_pool_wake_zeroed`'s documented statuses, each naming the function: a tag
/// never used and a tag awake are `FLARE_STATUS_TAG_STATE`, a stream that is not live
/// `FLARE_STATUS_DRIVER_ERROR` (the tag still asleep, its census unchanged); after a
/// discard sleep it wakes the tag and the census counts the requested bytes (1000,
/// not the 2 MiB mapped) and one memset. A panic inside the call is
/// `FLARE_STATUS_INTERNAL`, never an unwind into C: the wake it made stands (the tag
/// awake, zeroed) and the pool is poisoned.
#[test]
fn wake_zeroed_statuses_and_a_panic_inside_it() {
    let pool = create(&config());
    const TAG: u32 = 6;
    let bad_stream = 0xdead_0000usize as FlareStream;
    // SAFETY: `pool` is live throughout; streams are only passed to the driver.
    unsafe {
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake_zeroed",
            "tag 6",
        );
        let (st, p) = allocate_tagged(pool, 1000, TAG);
        ok(st);
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "flare_pool_wake_zeroed",
            "does not sleep",
        );
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(0)));
        let asleep = census(pool, TAG);
        refused(
            flare_pool_wake_zeroed(pool, TAG, bad_stream),
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_pool_wake_zeroed",
            "cuStreamGetCaptureInfo",
        );
        assert_eq!(census(pool, TAG), asleep);
        assert_eq!(asleep.sleeping, 1);
        ok(flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()));
        let c = census(pool, TAG);
        assert_eq!(
            (c.sleeping, c.physical_bytes, c.zeroed_bytes, c.zero_memsets),
            (0, GRANULARITY, 1000, 1)
        );
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(0)));
        ok(flare_sim_inject_panic(pool));
        refused(
            flare_pool_wake_zeroed(pool, TAG, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INTERNAL,
            "flare_pool_wake_zeroed",
            "injected by flare_sim_inject_panic",
        );
        let mut c = FlareTagCensus {
            struct_size: size_of::<FlareTagCensus>() as u32,
            ..FlareTagCensus::default()
        };
        assert_eq!(
            flare_pool_tag_census(pool, TAG, &mut c),
            FlareStatus::FLARE_STATUS_INTERNAL,
            "poisoned"
        );
        let _ = p;
    }
    let (st, r) = destroy_report(pool);
    ok(st);
    assert_eq!((r.live_count, r.live_requested_bytes), (1, 1000));
    assert_eq!(
        r.physical_bytes, GRANULARITY,
        "awake: its handle was mapped again"
    );
}

#[test]
fn injected_driver_failures_are_driver_errors_that_leak_nothing() {
    let pool = create(&config());
    // SAFETY: `pool` is live throughout.
    unsafe {
        // What the injection refuses.
        refused(
            flare_sim_inject_failure(pool, RawDriverCall(999), 1, 999),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_inject_failure",
            "call",
        );
        refused(
            flare_sim_inject_failure(pool, RawDriverCall(0), 0, 999),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_inject_failure",
            "nth is 0",
        );
        for bad in [0, -1, i32::MIN] {
            refused(
                flare_sim_inject_failure(pool, RawDriverCall(0), 1, bad),
                FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
                "flare_sim_inject_failure",
                &format!("cuda_error {bad} is not a failure CUresult"),
            );
        }
        // The next cuMemCreate fails with CUDA_ERROR_UNKNOWN (999).
        ok(flare_sim_inject_failure(pool, RawDriverCall(0), 1, 999));
        let (st, p) = allocate(pool, 1);
        refused(
            st,
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_package_allocate",
            "cuMemCreate",
        );
        assert_eq!(p, SENTINEL);
        let s = snap(pool);
        assert_eq!(
            (
                s.create_failures,
                s.live_count,
                s.physical_bytes,
                s.reserved_bytes
            ),
            (1, 0, 0, 0)
        );
        // The second cuMemMap from now fails: the first allocation maps, the second
        // is refused and gives back its handle and reservation.
        ok(flare_sim_inject_failure(pool, RawDriverCall(4), 2, 999));
        let (st, p) = allocate(pool, 1);
        ok(st);
        let (st, q) = allocate(pool, 1);
        refused(
            st,
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "flare_package_allocate",
            "cuMemMap",
        );
        assert_eq!(q, SENTINEL);
        let s = snap(pool);
        assert_eq!(
            (
                s.map_failures,
                s.live_count,
                s.physical_bytes,
                s.reserved_bytes
            ),
            (1, 1, GRANULARITY, GRANULARITY)
        );
        // The injection is spent: the pool stays usable.
        let (st, q) = allocate(pool, 1);
        ok(st);
        ok(free(pool, p));
        ok(free(pool, q));
    }
    destroy(pool);
}

#[test]
fn the_last_error_is_copied_truncated_with_its_full_length() {
    // A failure whose message is known exactly.
    let (st, _) = allocate(NULL_POOL, 1);
    assert_eq!(st, FlareStatus::FLARE_STATUS_INVALID_ARGUMENT);
    let message = "flare_package_allocate: invalid argument: pool is NULL";
    let len = message.len();
    // SAFETY: NULL with any length writes nothing.
    let (n0, n64) = unsafe {
        (
            flare_last_error_message(ptr::null_mut(), 0),
            flare_last_error_message(ptr::null_mut(), 64),
        )
    };
    assert_eq!((n0, n64), (len, len));
    // A zero length writes nothing, even to a real buffer.
    let mut buf = [0x55 as c_char; 80];
    // SAFETY: `buf` has 80 writable bytes.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 0) };
    assert_eq!(n, len);
    assert!(buf.iter().all(|&b| b == 0x55));
    // A 1-byte buffer gets the NUL alone.
    // SAFETY: as above.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 1) };
    assert_eq!(n, len);
    assert_eq!((buf[0], buf[1]), (0, 0x55));
    // 8 bytes: the first 7 and the NUL, nothing past.
    let mut buf = [0x55 as c_char; 80];
    // SAFETY: as above.
    let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), 8) };
    assert_eq!(n, len);
    // SAFETY: NUL-terminated within the buffer.
    let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
    assert_eq!(got.to_bytes(), &message.as_bytes()[..7]);
    assert!(buf[8..].iter().all(|&b| b == 0x55));
    // Exactly len bytes: truncated by one; len + 1: whole.
    for (size, want) in [(len, &message[..len - 1]), (len + 1, message)] {
        let mut buf = [0x55 as c_char; 80];
        // SAFETY: as above.
        let n = unsafe { flare_last_error_message(buf.as_mut_ptr(), size) };
        assert_eq!(n, len);
        // SAFETY: NUL-terminated within the buffer.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(got.to_str().ok(), Some(want), "size {size}");
        assert!(buf[size..].iter().all(|&b| b == 0x55), "size {size}");
    }
    // A success leaves the message as it is.
    let pool = create(&config());
    let (st, p) = allocate(pool, 1);
    ok(st);
    assert_eq!(last_error(), message);
    ok(free(pool, p));
    destroy(pool);
    // Each thread has its own: a new thread starts empty.
    let other = std::thread::spawn(|| {
        // SAFETY: NULL writes nothing.
        unsafe { flare_last_error_message(ptr::null_mut(), 0) }
    })
    .join()
    .unwrap_or(usize::MAX);
    assert_eq!(other, 0);
}

#[test]
fn config_init_is_a_no_op_for_null_and_misaligned_pointers() {
    // Misaligned: nothing written.
    let mut b = Buf([0xcd; 512]);
    // SAFETY: `b` has 512 writable bytes; the pointer is misaligned, so nothing is.
    unsafe {
        flare_pool_config_init(
            b.0.as_mut_ptr().wrapping_add(4).cast(),
            size_of::<FlarePoolConfig>(),
        )
    };
    assert!(b.untouched_from(0));
    // Aligned, whole: struct_size is sizeof, the documented defaults.
    // SAFETY: `b` has 512 writable bytes, aligned to 8.
    unsafe { flare_pool_config_init(b.0.as_mut_ptr().cast(), 512) };
    assert_eq!(b.u32_at(0) as usize, size_of::<FlarePoolConfig>());
    assert!(b.untouched_from(size_of::<FlarePoolConfig>()));
    let c = config();
    assert_eq!(c.struct_size as usize, size_of::<FlarePoolConfig>());
    assert_eq!(c.backend, FlareBackend::FLARE_BACKEND_SIMULATED as u32);
    assert_eq!((c.device, c.release_threshold_bytes), (0, 0));
    assert_eq!(
        c.reuse_policy,
        FlareReusePolicy::FLARE_REUSE_BEST_FIT as u32
    );
    assert!(c.peer_devices.is_null() && c.record_path.is_null());
    assert_eq!(c.peer_device_count, 0);
    assert_eq!(c.best_fit_max_waste_percent, 30);
    assert_eq!(
        c.cross_stream_reuse,
        FlareCrossStreamReuse::FLARE_CROSS_STREAM_WHEN_COMPLETE as u32
    );
    assert_eq!(
        (c.thread_cache_entries, c.thread_cache_bytes),
        (32, 1 << 30)
    );
}

#[test]
fn torch_outputs_and_nulls_are_checked_before_the_allocator() {
    // These return before the process-wide allocator is made (it is made from the
    // environment on first use; these tests leave it alone).
    let before = flare_torch_hook_failures();
    // SAFETY: NULL outputs are refused; NULL pointers are no-ops; nothing is read.
    unsafe {
        refused(
            flare_torch_sim_stream_create(0, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_stream_create",
            "out_stream is NULL",
        );
        refused(
            flare_torch_sim_end_capture(0, ptr::null_mut(), ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_end_capture",
            "out_valid is NULL",
        );
        let mut words = [3_u64; 2];
        let misaligned = words
            .as_mut_ptr()
            .cast::<u8>()
            .wrapping_add(1)
            .cast::<c_int>();
        refused(
            flare_torch_sim_end_capture(0, ptr::null_mut(), misaligned),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_end_capture",
            "out_valid is misaligned",
        );
        refused(
            flare_torch_sim_faults(0, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_torch_sim_faults",
            "out_faults is NULL",
        );
        assert_eq!(words, [3; 2]);
        // 0 bytes: NULL, no error, no allocator.
        assert!(flare_torch_alloc(0, 0, ptr::null_mut()).is_null());
        // NULL frees and record_stream: nothing, no failure counted.
        flare_torch_free(ptr::null_mut(), 0, 0, ptr::null_mut());
        flare_torch_pool_free(ptr::null_mut(), 0, 0, ptr::null_mut());
        flare_torch_record_stream(ptr::null_mut(), ptr::null_mut());
    }
    assert_eq!(flare_torch_hook_failures(), before);
}

/// The recording's C calls: a flush of a pool that records writes its lines; an
/// unwritable path never fails a call, and `flare_pool_record_error` says why (0
/// for a pool that works, one that does not record, and NULL).
#[test]
#[allow(clippy::unwrap_used)] // a test: a failed step is its failure
fn record_flush_and_record_error() {
    let dir = std::env::temp_dir().join(format!("flare-abi-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let error_of = |pool: *const FlarePool| -> (usize, String) {
        let mut buf = [0 as c_char; 512];
        // SAFETY: `pool` is NULL or live; `buf` has 512 writable bytes.
        let n = unsafe { flare_pool_record_error(pool, buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated by the call (or still all zeros).
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        (n, text)
    };
    // A pool that records into a file that can be written.
    let good = CString::new(dir.join("good.trace").to_str().unwrap()).unwrap();
    let mut c = config();
    c.record_path = good.as_ptr();
    let pool = create(&c);
    let (status, p) = allocate(pool, 4096);
    ok(status);
    ok(free(pool, p));
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    let text = std::fs::read_to_string(dir.join("good.trace")).unwrap();
    assert!(text.starts_with("# flare-trace v1\n"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("a ")).count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("f ")).count(),
        1,
        "{text}"
    );
    assert_eq!(error_of(pool), (0, String::new()));
    destroy(pool);
    // A path in a directory that does not exist: calls succeed, the error is kept.
    let bad = CString::new(dir.join("missing").join("x.trace").to_str().unwrap()).unwrap();
    c.record_path = bad.as_ptr();
    let pool = create(&c);
    let (status, p) = allocate(pool, 4096);
    ok(status);
    ok(free(pool, p));
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    let (n, text) = error_of(pool);
    assert!(n > 0 && n == text.len(), "{n} {text:?}");
    assert!(text.contains("x.trace"), "{text}");
    // Truncated to the buffer, the full length returned; no buffer: the length.
    let mut small = [0x55 as c_char; 8];
    // SAFETY: a live pool; `small` has 8 writable bytes.
    let m = unsafe { flare_pool_record_error(pool, small.as_mut_ptr(), small.len()) };
    assert_eq!(m, n);
    assert_eq!(small[7], 0);
    // SAFETY: a live pool; NULL buffer.
    let m = unsafe { flare_pool_record_error(pool, ptr::null_mut(), 0) };
    assert_eq!(m, n);
    destroy(pool);
    // A pool that does not record, and NULL.
    let pool = create(&config());
    // SAFETY: a live pool.
    ok(unsafe { flare_pool_record_flush(pool) });
    assert_eq!(error_of(pool).0, 0);
    destroy(pool);
    assert_eq!(error_of(ptr::null()).0, 0);
    // SAFETY: NULL is refused.
    refused(
        unsafe { flare_pool_record_flush(ptr::null()) },
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "flare_pool_record_flush",
        "NULL",
    );
}

/// `flare_pool_record_error` with no error to copy (a pool whose recording works,
/// one that does not record, NULL) still leaves `buf` a C string: the empty one,
/// its NUL in `buf[0]`, nothing after it written (found by the `c_abi` fuzz target:
/// the buffer was left as it was, so a caller printing it read what was there).
#[test]
#[allow(clippy::unwrap_used)] // a test: a failed step is its failure
fn record_error_without_an_error_writes_the_empty_string() {
    let path =
        std::env::temp_dir().join(format!("flare-abi-record-ok-{}.trace", std::process::id()));
    let path_c = CString::new(path.to_str().unwrap()).unwrap();
    let mut recording = config();
    recording.record_path = path_c.as_ptr();
    let recording = create(&recording);
    let plain = create(&config());
    for pool in [recording.cast_const(), plain.cast_const(), ptr::null()] {
        let mut buf = [0x55 as c_char; 16];
        // SAFETY: `pool` is NULL or live; `buf` has 16 writable bytes.
        let n = unsafe { flare_pool_record_error(pool, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 0);
        assert_eq!(buf[0], 0, "the empty string");
        assert!(buf[1..].iter().all(|&b| b == 0x55), "{buf:?}");
        // `len` 0: nothing written.
        let mut untouched = [0x55 as c_char; 4];
        // SAFETY: as above; `len` 0.
        let n = unsafe { flare_pool_record_error(pool, untouched.as_mut_ptr(), 0) };
        assert_eq!((n, untouched), (0, [0x55 as c_char; 4]));
    }
    destroy(recording);
    destroy(plain);
    let _ = std::fs::remove_file(&path);
}

/// A sleep whose `cuMemRelease` the driver refuses keeps the handle (the tag's
/// allocation sleeps with its physical memory held, `sleeping_held_bytes`): the
/// destroy report still counts that allocation's bytes among the live bytes it
/// released, mapped or not (the header's `FlareDestroyReport` contract), and the
/// held handle among the physical bytes.
#[test]
fn destroy_report_counts_a_sleeping_allocation_whose_handle_was_kept() {
    let pool = create(&config());
    const TAG: u32 = 5;
    let (st, _p) = allocate_tagged(pool, 3 * MIB as usize, TAG);
    ok(st);
    // SAFETY: `pool` is live; 1 is cuMemRelease, 2 CUDA_ERROR_OUT_OF_MEMORY.
    unsafe {
        ok(flare_sim_inject_failure(
            pool,
            RawDriverCall(FlareDriverCall::FLARE_CALL_RELEASE as u32),
            1,
            2,
        ));
        ok(flare_pool_sleep(pool, TAG, RawSleepMode(0)));
    }
    let s = snap(pool);
    assert_eq!(
        (s.sleeping_count, s.sleeping_bytes, s.sleeping_held_bytes),
        (1, 0, 4 * MIB),
        "the 3 MiB request's 4 MiB mapping sleeps with its handle kept"
    );
    assert_eq!((s.live_mapped_bytes, s.physical_bytes), (0, 4 * MIB));
    // `pool` is not used again.
    let (st, r) = destroy_report(pool);
    ok(st);
    assert_eq!(
        r,
        FlareDestroyReport {
            struct_size: size_of::<FlareDestroyReport>() as u32,
            scope_was_open: 0,
            live_count: 1,
            live_requested_bytes: 3 * MIB,
            live_mapped_bytes: 4 * MIB,
            physical_bytes: 4 * MIB,
        }
    );
}

/// A tag sleeping in discard mode (no fault): its allocation's bytes are
/// `sleeping_bytes`, no longer physical; the destroy report counts them among the
/// live bytes it released all the same ("mapped or not").
#[test]
fn destroy_report_counts_a_discarded_sleeping_allocation() {
    let pool = create(&config());
    const TAG: u32 = 6;
    let (st, _p) = allocate_tagged(pool, 3 * MIB as usize, TAG);
    ok(st);
    // SAFETY: `pool` is live; mode 0 is FLARE_SLEEP_DISCARD.
    ok(unsafe { flare_pool_sleep(pool, TAG, RawSleepMode(0)) });
    let s = snap(pool);
    assert_eq!(
        (s.sleeping_count, s.sleeping_bytes, s.sleeping_held_bytes),
        (1, 4 * MIB, 0)
    );
    assert_eq!((s.live_mapped_bytes, s.physical_bytes), (0, 0));
    // `pool` is not used again.
    let (st, r) = destroy_report(pool);
    ok(st);
    assert_eq!(
        (
            r.live_count,
            r.live_requested_bytes,
            r.live_mapped_bytes,
            r.physical_bytes
        ),
        (1, 3 * MIB, 4 * MIB, 0)
    );
}

/// A destroy the driver refuses (cuMemRelease fails, and fails again at the retry
/// `Pool::destroy` makes): `FLARE_STATUS_DRIVER_ERROR`, and the report is written
/// all the same (its contract: "written whenever the pool was destroyed: on
/// FLARE_STATUS_SUCCESS and on FLARE_STATUS_DRIVER_ERROR"),
/// counting the live allocation it released; the last error keeps the driver's
/// failure first and appends what was live.
#[test]
fn a_destroy_the_driver_refuses_still_writes_its_report() {
    let pool = create(&config());
    let (st, _p) = allocate(pool, 3 * MIB as usize);
    ok(st);
    let release = RawDriverCall(FlareDriverCall::FLARE_CALL_RELEASE as u32);
    // SAFETY: `pool` is live; 999 is CUDA_ERROR_UNKNOWN.
    unsafe {
        ok(flare_sim_inject_failure(pool, release, 1, 999));
        ok(flare_sim_inject_failure(pool, release, 2, 999));
    }
    // `pool` is not used again.
    let (st, r) = destroy_report(pool);
    assert_eq!(
        st,
        FlareStatus::FLARE_STATUS_DRIVER_ERROR,
        "{}",
        last_error()
    );
    assert_eq!(
        (
            r.live_count,
            r.live_requested_bytes,
            r.live_mapped_bytes,
            r.physical_bytes
        ),
        (1, 3 * MIB, 4 * MIB, 4 * MIB)
    );
    let message = last_error();
    assert!(
        message.starts_with("flare_pool_destroy_report: ")
            && message.contains("cuMemRelease")
            && message.ends_with(
                "; released 1 live allocation(s): 3145728 bytes requested, \
                 4194304 bytes (4.0 MiB) mapped"
            ),
        "{message}"
    );
}

/// Every refusal of the simulated stream controls the C ABI can provoke names the
/// call, the stream and what the code means there (`refused` in sim.rs; the codes
/// are the simulated driver's, rows of docs/vmm-semantics.md): a handle that is no
/// stream, a launch on memory not mapped, an end of a capture never begun, a capture
/// of the legacy stream, a launch into a capture a device synchronize invalidated, an
/// end of a global-mode capture from another thread. (The two codes only events or
/// blocking streams produce, `STREAM_CAPTURE_UNMATCHED` and `_IMPLICIT`, cannot
/// reach it through the C ABI: it makes neither.)
#[test]
fn each_refusal_of_the_simulated_stream_controls_says_what_it_means() {
    let pool = create(&config());
    let mut s = ptr::null_mut();
    // SAFETY: `pool` is live; `s` is writable.
    ok(unsafe { flare_sim_stream_create(pool, &mut s) });
    let bogus = 0xdead as FlareStream;
    let invalid = FlareStatus::FLARE_STATUS_INVALID_ARGUMENT;
    let mut valid: c_int = -1;
    // SAFETY: `pool` is live throughout; outputs are writable; pointers given to the
    // simulated launch are only compared with its mappings.
    unsafe {
        refused(
            flare_sim_launch(pool, bogus, ptr::null(), 0),
            invalid,
            "flare_sim_launch",
            "cuLaunchKernel on stream 0xdead: CUDA_ERROR_INVALID_HANDLE (400): not a live \
             stream of this pool's simulated driver",
        );
        refused(
            flare_sim_launch(pool, s, 0x1000 as *const c_void, 4096),
            invalid,
            "flare_sim_launch",
            "a byte of the range is not mapped with access for the stream's device",
        );
        refused(
            flare_sim_end_capture(pool, s, &mut valid),
            invalid,
            "flare_sim_end_capture",
            "the stream is not in a capture state that allows it",
        );
        refused(
            flare_sim_begin_capture(pool, ptr::null_mut()),
            invalid,
            "flare_sim_begin_capture",
            "the legacy stream cannot be captured",
        );
        assert_eq!(valid, -1, "nothing written on a refusal");
        // A tag sleeping while `s` (a stream the pool never saw) is captured: the
        // pool's device synchronize breaks the capture (and fails the sleep).
        let (st, _p) = allocate_tagged(pool, 1, 9);
        ok(st);
        ok(flare_sim_begin_capture(pool, s));
        assert_eq!(
            flare_pool_sleep(pool, 9, RawSleepMode(0)),
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "{}",
            last_error()
        );
        refused(
            flare_sim_launch(pool, s, ptr::null(), 0),
            invalid,
            "flare_sim_launch",
            "the stream's capture was invalidated: end it",
        );
        ok(flare_sim_end_capture(pool, s, &mut valid));
        assert_eq!(valid, 0, "the capture ended invalidated");
        // A global-mode capture (the mode flare_sim_begin_capture uses) ended from
        // another thread.
        ok(flare_sim_begin_capture(pool, s));
    }
    let (p, st) = (pool as usize, s as usize);
    let other = std::thread::spawn(move || {
        let mut valid: c_int = -1;
        // SAFETY: the pool and stream are live; `valid` is writable.
        let status =
            unsafe { flare_sim_end_capture(p as *mut FlarePool, st as FlareStream, &mut valid) };
        refused(
            status,
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "flare_sim_end_capture",
            "the capture was begun on another thread",
        );
    });
    if let Err(panic) = other.join() {
        std::panic::resume_unwind(panic);
    }
    // SAFETY: `pool` is live; `valid` is writable.
    ok(unsafe { flare_sim_end_capture(pool, s, &mut valid) });
    assert_eq!(valid, 1);
    destroy(pool);
}
