//! Creating and destroying a pool through the C ABI (`src/ffi/pool.rs`): the
//! arguments `flare_pool_create` refuses, and what `flare_pool_destroy_report`
//! counts and says.

use std::ffi::CString;

use super::*;

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
