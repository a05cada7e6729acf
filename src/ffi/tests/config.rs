//! The configuration through the C ABI (`src/ffi/pool.rs`): what
//! `flare_pool_config_init` writes for each `struct_size`, and how `flare_pool_create`
//! reads each field, validated and versioned.

use crate::{CrossStreamReuse, Error, ReusePolicy};

use super::*;

/// A buffer a config is initialised into, aligned like the struct.
#[repr(C, align(8))]
struct ConfigBuf([u8; 128]);

fn init_into(config_size: usize) -> ConfigBuf {
    let mut buf = ConfigBuf([0xcd; 128]);
    // SAFETY: `buf` has 128 >= config_size writable bytes, aligned to 8.
    unsafe { flare_pool_config_init(buf.0.as_mut_ptr().cast(), config_size) };
    buf
}

fn u32_at(b: &ConfigBuf, at: usize) -> u32 {
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
    // record_path 96..104, history_events 104..112; no tail padding.
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
    // A caller compiled before history_events (sizeof 104): its 104 bytes.
    for size in [104, 111] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), size as u32, "size {size}");
        assert!(b.0[96..104].iter().all(|&x| x == 0), "record_path NULL");
        assert!(b.0[104..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // This header's struct, and a newer caller's larger one: 112 bytes written (the
    // padding before segment_whole_threshold_bytes and before thread_cache_bytes
    // zeroed, record_path NULL, history_events 0), struct_size says 112, the rest
    // untouched.
    for size in [112, 128] {
        let b = init_into(size);
        assert_eq!(u32_at(&b, 0), 112, "size {size}");
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
        assert!(b.0[104..112].iter().all(|&x| x == 0), "history_events 0");
        assert!(b.0[112..].iter().all(|&x| x == 0xcd), "size {size}");
    }
    // NULL is a no-op.
    // SAFETY: NULL is allowed.
    unsafe { flare_pool_config_init(ptr::null_mut(), size_of::<FlarePoolConfig>()) };
    // What an older caller initialised creates a pool with the defaults.
    let b = init_into(40);
    let mut older = FlarePoolConfig::default_for_layout();
    // SAFETY: `b` has 128 bytes, `older` is a whole FlarePoolConfig (112 bytes);
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

/// `read_config` of `c` (with `struct_size` as set): the Rust configuration.
fn read(c: &FlarePoolConfig) -> Result<crate::PoolConfig, Error> {
    // SAFETY: `c` is a whole, aligned FlarePoolConfig, its pointers valid.
    let arg = unsafe { crate::ffi::pool::ConfigArg::new(c) }.unwrap_or_else(|| panic!("NULL"));
    crate::ffi::pool::read_config(&arg)
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
