//! One call from the input ([`step`]): which function, its arguments, and the
//! checks of its status and outputs.

use super::*;

/// The fields of a versioned struct of `size` bytes written for `struct_size`: the
/// ends of those lying wholly inside both.
pub(crate) fn written_end(struct_size: u32, size: usize) -> usize {
    (struct_size as usize).min(size)
}

pub(crate) fn snapshot(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>) {
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

pub(crate) fn census(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>) {
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

/// An allocation call (0: synchronous, 1: stream-ordered, 2: tagged).
pub(crate) fn allocate(run: &mut Run, input: &mut Input<'_>, slot: Option<usize>, kind: u8) {
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
pub(crate) fn step(run: &mut Run, input: &mut Input<'_>) -> bool {
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
