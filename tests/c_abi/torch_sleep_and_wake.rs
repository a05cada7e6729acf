//! Sleep, wake (zeroing included) and census of a device's tensor pool through the
//! Python package's entry points (`flare_torch_sleep`, `flare_torch_wake`,
//! `flare_torch_census`, `flare_torch_sim_write`, `flare_torch_sim_read`), called from
//! Rust as ctypes calls them, on the simulated backend; and their refusals of bad
//! arguments (a status, the thread's last error, nothing changed; never a crash).
//!
//! One test: the entry points share one allocator per process, made by the first
//! call (`flare_torch_use_simulated`), so this test runs in a process of its own
//! (`crate::common::own_process`) and its steps run in order. Expected values come from the entry points' contracts and the
//! simulated device (new memory holds `SIM_STALE_BYTE`).

use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use flare_package::driver::sim::SIM_STALE_BYTE;
use flare_package::ffi::{
    flare_last_error_message, flare_torch_alloc, flare_torch_census, flare_torch_free,
    flare_torch_sim_read, flare_torch_sim_write, flare_torch_sleep, flare_torch_use_simulated,
    flare_torch_wake, FlareStatus, RawSleepMode,
};

const MIB: usize = 1 << 20;

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn status(got: FlareStatus, want: FlareStatus, detail: &str) {
    assert_eq!(got, want, "{}", last_error());
    if want != FlareStatus::FLARE_STATUS_SUCCESS {
        let e = last_error();
        assert!(e.contains(detail), "{e:?} lacks {detail:?}");
    }
}

#[track_caller]
fn ok(got: FlareStatus) {
    status(got, FlareStatus::FLARE_STATUS_SUCCESS, "");
}

fn census(device: i32) -> String {
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: `buf` has that many writable bytes.
    let n = unsafe { flare_torch_census(device, buf.as_mut_ptr(), buf.len()) };
    assert!(n > 0 && n < buf.len());
    // SAFETY: NUL-terminated by flare_torch_census.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The number after `"name":` in `json`.
#[track_caller]
fn number(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("{name} in {json}"))
        + key.len();
    json[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .expect("a number")
}

fn read(device: i32, ptr: *mut c_void, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    // SAFETY: `out` has `n` writable bytes; `ptr` is a device address.
    ok(unsafe { flare_torch_sim_read(device, ptr, out.as_mut_ptr().cast(), n) });
    out
}

#[test]
fn tensor_memory_sleeps_and_wakes_zeroed() {
    crate::common::own_process::run(
        module_path!(),
        "tensor_memory_sleeps_and_wakes_zeroed",
        steps,
    );
}

/// The steps of [`tensor_memory_sleeps_and_wakes_zeroed`], in its own process.
fn steps() {
    ok(flare_torch_use_simulated(64 * MIB as u64, 2));
    let (discard, offload) = (RawSleepMode(0), RawSleepMode(1));
    // A device never used: nothing sleeps; its census says so.
    assert_eq!(census(1), "{\"device\":1,\"created\":false}");
    status(
        flare_torch_sleep(1, discard),
        FlareStatus::FLARE_STATUS_TAG_STATE,
        "never used",
    );
    let n = 3 * MIB + 100;
    // SAFETY: NULL is the legacy stream.
    let p = unsafe { flare_torch_alloc(n, 1, ptr::null_mut()) };
    assert!(!p.is_null(), "{}", last_error());
    let pattern: Vec<u8> = (0..n).map(|i| (i % 250) as u8 + 1).collect();
    // SAFETY: `pattern` has `n` readable bytes.
    ok(unsafe { flare_torch_sim_write(1, p, pattern.as_ptr().cast(), n) });
    // Bad arguments: a status, the message, nothing changed.
    status(
        flare_torch_sleep(1, RawSleepMode(2)),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "mode",
    );
    status(
        flare_torch_sleep(5, discard),
        FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
        "device 5",
    );
    // SAFETY: streams are only passed to the driver.
    unsafe {
        status(
            flare_torch_wake(1, 1, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_TAG_STATE,
            "does not sleep",
        );
        status(
            flare_torch_wake(-1, 0, ptr::null_mut()),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "device ordinal -1",
        );
        status(
            flare_torch_sim_write(1, p, ptr::null(), 4),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "src is NULL",
        );
        status(
            flare_torch_sim_read(1, p, ptr::null_mut(), 4),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "dst is NULL",
        );
        status(
            flare_torch_sim_read(1, 0x1000 as *mut c_void, [0u8; 4].as_mut_ptr().cast(), 4),
            FlareStatus::FLARE_STATUS_INVALID_ARGUMENT,
            "not mapped",
        );
    }
    assert!(census(5).starts_with("{\"error\":"));
    assert!(read(1, p, n) == pattern, "unchanged");
    let before = census(1);
    assert!(before.contains("\"sleeping\":false"), "{before}");
    assert_eq!(number(&before, "live_count"), 1);
    // Discard sleep, zeroing wake on the legacy stream: every requested byte zero.
    ok(flare_torch_sleep(1, discard));
    let asleep = census(1);
    assert!(asleep.contains("\"sleeping\":true"), "{asleep}");
    assert_eq!(number(&asleep, "physical_bytes"), 0);
    // SAFETY: a stream that is not live is refused by the driver, never read.
    unsafe {
        status(
            flare_torch_wake(1, 1, 0xdead_0000usize as *mut c_void),
            FlareStatus::FLARE_STATUS_DRIVER_ERROR,
            "cuStreamGetCaptureInfo",
        );
    }
    assert_eq!(census(1), asleep, "nothing changed");
    // SAFETY: NULL is the legacy stream.
    ok(unsafe { flare_torch_wake(1, 1, ptr::null_mut()) });
    assert!(read(1, p, n) == vec![0; n], "zeroed");
    let woken = census(1);
    assert!(woken.contains("\"sleeping\":false"), "{woken}");
    assert_eq!(number(&woken, "zeroed_bytes"), n as u64);
    assert_eq!(number(&woken, "zero_memsets"), 1);
    // A plain wake after a discard sleep: the new memory's stale bytes.
    ok(flare_torch_sleep(1, discard));
    // SAFETY: `stream` is ignored without zeroing.
    ok(unsafe { flare_torch_wake(1, 0, 0xdead_0000usize as *mut c_void) });
    assert!(read(1, p, n) == vec![SIM_STALE_BYTE; n]);
    // Offload: restored; zeroing does nothing.
    // SAFETY: as above.
    ok(unsafe { flare_torch_sim_write(1, p, pattern.as_ptr().cast(), n) });
    ok(flare_torch_sleep(1, offload));
    // SAFETY: NULL is the legacy stream.
    ok(unsafe { flare_torch_wake(1, 1, ptr::null_mut()) });
    assert!(read(1, p, n) == pattern, "restored");
    assert_eq!(number(&census(1), "zeroed_bytes"), n as u64);
    // SAFETY: `p` is a live allocation of device 1.
    unsafe { flare_torch_free(p, n, 1, ptr::null_mut()) };
    assert_eq!(number(&census(1), "live_count"), 0);
}
