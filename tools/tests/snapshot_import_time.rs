//! Importing a PyTorch snapshot takes time linear in the pickle's size (issue 34,
//! item 4): a pickle shares objects through its memo, so a few bytes can name a
//! large list or dict again and again; an importer that walks the shared object at
//! each reference does quadratic work. The two shapes of the issue, generated here
//! (a 280 KB pickle whose 70,000 devices share one event list, a 780 KB one whose
//! events share one dict of 130,000 keys), took 11 to 18 s each. Any input under
//! 1 MB must be imported or refused in under 1 s (release build).
#![cfg(not(flare_loom))] // the loom build runs tests/loom/ alone

use std::time::{Duration, Instant};

use flare_tools::torch_snapshot::{import, Level, Options, SnapshotError};

/// The budget for an input under 1 MB: the bound, 1 s, in a release build;
/// 10 s in a debug build (unoptimised, still far below the quadratic importer's
/// 11 to 135 s in release).
const BUDGET: Duration = Duration::from_secs(if cfg!(debug_assertions) { 10 } else { 1 });

/// Pickle opcodes (CPython's `Lib/pickle.py`).
const PROTO: u8 = 0x80;
const EMPTY_DICT: u8 = b'}';
const EMPTY_LIST: u8 = b']';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINPUT: u8 = b'q';
const BINGET: u8 = b'h';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const NONE: u8 = b'N';
const STOP: u8 = b'.';

fn short_str(out: &mut Vec<u8>, s: &str) {
    out.push(SHORT_BINUNICODE);
    out.push(u8::try_from(s.len()).unwrap());
    out.extend_from_slice(s.as_bytes());
}

/// The shortest int opcode for `i` (0 <= i < 2^31).
fn int(out: &mut Vec<u8>, i: u32) {
    if let Ok(b) = u8::try_from(i) {
        out.extend_from_slice(&[BININT1, b]);
    } else if let Ok(h) = u16::try_from(i) {
        out.push(BININT2);
        out.extend_from_slice(&h.to_le_bytes());
    } else {
        out.push(BININT);
        out.extend_from_slice(&i.to_le_bytes());
    }
}

/// `{'device_traces': [L, L, ...]}` with `devices` entries that are all the one list
/// `L` of `events` references to the one event `{'action': ACTION}` (memo 0 is `L`,
/// memo 1 the event): 2 bytes per device and per event.
fn shared_event_list(devices: usize, events: usize, action: &str) -> Vec<u8> {
    let mut p = vec![PROTO, 4, EMPTY_DICT];
    short_str(&mut p, "device_traces");
    p.extend_from_slice(&[EMPTY_LIST, MARK]);
    // device 0: the list, memo 0
    p.extend_from_slice(&[EMPTY_LIST, BINPUT, 0, MARK]);
    // its first event, memo 1
    p.extend_from_slice(&[EMPTY_DICT, BINPUT, 1]);
    short_str(&mut p, "action");
    short_str(&mut p, action);
    p.push(SETITEM);
    for _ in 1..events {
        p.extend_from_slice(&[BINGET, 1]);
    }
    p.push(APPENDS);
    for _ in 1..devices {
        p.extend_from_slice(&[BINGET, 0]);
    }
    p.extend_from_slice(&[APPENDS, SETITEM, STOP]);
    p
}

/// `{'device_traces': [[E, E, ...]]}`: one device of `events` references to one
/// event `E` (memo 0), a `free_requested` of address 4096 with `keys` more int keys
/// after its own (`{'action': ..., 'addr': 4096, 0: None, 1: None, ...}`).
fn event_of_many_keys(events: usize, keys: u32) -> Vec<u8> {
    let mut p = vec![PROTO, 4, EMPTY_DICT];
    short_str(&mut p, "device_traces");
    p.extend_from_slice(&[EMPTY_LIST, EMPTY_LIST, MARK]);
    p.extend_from_slice(&[EMPTY_DICT, BINPUT, 0, MARK]);
    short_str(&mut p, "action");
    short_str(&mut p, "free_requested");
    short_str(&mut p, "addr");
    int(&mut p, 4096);
    for k in 0..keys {
        int(&mut p, k);
        p.push(NONE);
    }
    p.push(SETITEMS);
    for _ in 1..events {
        p.extend_from_slice(&[BINGET, 0]);
    }
    // the device's list, then device_traces' one item
    p.extend_from_slice(&[APPENDS, b'a', SETITEM, STOP]);
    p
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(
        took < BUDGET,
        "{what}: {took:?}, more than the {BUDGET:?} an input under 1 MB may take"
    );
    out
}

#[test]
fn devices_sharing_one_event_list_are_read_once() {
    let bytes = shared_event_list(70_000, 70_000, "snapshot");
    assert!(
        (270_000..1_000_000).contains(&bytes.len()),
        "{}",
        bytes.len()
    );
    let result = timed("70,000 devices sharing one list of 70,000 events", || {
        import("shared.pickle", &bytes, &Options::default())
    });
    // Every event of every device is a `snapshot` marker: no device allocated.
    match result {
        Err(SnapshotError::Device(m)) => {
            assert!(m.contains("no device has allocator events"), "{m}");
            assert!(m.contains("70000 entries"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    // Asked for one device, its 70,000 markers are read and nothing is written.
    let options = Options {
        level: Level::Tensor,
        device: Some(69_999),
    };
    let imported = timed("device 69999 of 70,000 sharing one list", || {
        import("shared.pickle", &bytes, &options)
    })
    .unwrap();
    assert_eq!(imported.summary.devices, 70_000);
    assert_eq!(imported.summary.events, 70_000);
    assert_eq!(imported.summary.actions.get("snapshot"), Some(&70_000));
    assert_eq!(imported.summary.allocations, 0);
}

#[test]
fn many_devices_with_events_are_refused_in_a_short_message() {
    // Every device's list is the one list of 70,000 `segment_free` events: every
    // device allocated, none was chosen.
    let bytes = shared_event_list(70_000, 70_000, "segment_free");
    let result = timed("70,000 devices with events", || {
        import("devices.pickle", &bytes, &Options::default())
    });
    match result {
        Err(SnapshotError::Device(m)) => {
            assert!(
                m.starts_with("devices 0, 1, 2, 3, 4, 5, 6, 7, ... (70000 devices) have events"),
                "{m}"
            );
            assert!(m.ends_with("choose one with --device"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn events_sharing_one_dict_of_many_keys_are_read_once() {
    let bytes = event_of_many_keys(65_000, 130_000);
    assert!(
        (700_000..1_000_000).contains(&bytes.len()),
        "{}",
        bytes.len()
    );
    for level in [Level::Tensor, Level::Segment] {
        let options = Options {
            level,
            device: None,
        };
        let imported = timed(&format!("65,000 events of 130,000 keys, {level:?}"), || {
            import("keys.pickle", &bytes, &options)
        })
        .unwrap();
        assert_eq!(imported.summary.events, 65_000);
        assert_eq!(
            imported.summary.actions.get("free_requested"),
            Some(&65_000)
        );
        assert_eq!(imported.summary.allocations, 0);
        // Address 4096 was never allocated: every free is skipped at the tensor
        // level; the segment level ignores `free_requested`.
        let skipped = if level == Level::Tensor { 65_000 } else { 0 };
        assert_eq!(imported.summary.skipped_frees, skipped);
    }
}

/// A refusal's message stays short whatever the pickle's text: a dict without
/// `device_traces` whose keys are 9 strings of 50 control characters (each escaped
/// to 6 bytes in a message) is refused in at most 1,024 bytes, one line (a fuzz
/// finding: 8 quoted keys of escaped bytes made a message of about 2 KB).
#[test]
fn a_refusal_naming_keys_of_escaped_text_is_short() {
    let mut p = vec![PROTO, 4, EMPTY_DICT, MARK];
    for k in 0..9u8 {
        let mut key = "\u{1}".repeat(49);
        key.push(char::from(b'a' + k));
        short_str(&mut p, &key);
        p.push(NONE);
    }
    p.extend_from_slice(&[SETITEMS, STOP]);
    let options = Options {
        level: Level::Tensor,
        device: None,
    };
    let message = match import("keys.pickle", &p, &options) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a dict without device_traces was imported"),
    };
    assert!(message.contains("device_traces"), "{message}");
    assert!(!message.contains('\n'), "{message:?}");
    assert!(
        message.len() <= 1024,
        "{} bytes: {message:?}",
        message.len()
    );
}
