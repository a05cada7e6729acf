//! A pool's configuration from the input (arbitrary bytes and `struct_size` over
//! `flare_pool_config_init`'s defaults), its creation and its destroy.

use super::*;

/// A caller's configuration: `flare_pool_config_init` with an arbitrary size, then
/// fields overwritten with arbitrary values. Owns what its pointers point to.
pub(crate) struct Config {
    pub(crate) buf: Box<Buf>,
    pub(crate) peers: Box<[i32; 1024]>,
}

/// Record paths a configuration may name: none is a file the target writes (an
/// empty path is refused; a missing directory stops the recording at once).
pub(crate) const RECORD_PATHS: [&CStr; 2] = [c"", c"/nonexistent-flare-fuzz-dir/recorded.trace"];

pub(crate) fn config(input: &mut Input<'_>) -> Config {
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
    // A simulated device of at most 256 MiB (0, the default, would be 140 GiB): the
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

/// Destroys the pool in `slot` with a report of an arbitrary `struct_size` (or
/// with `flare_pool_destroy`), checking what it says was released.
pub(crate) fn destroy(run: &mut Run, input: &mut Input<'_>, slot: usize, plain: bool) {
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

pub(crate) fn create(run: &mut Run, input: &mut Input<'_>) {
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
