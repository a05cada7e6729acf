//! A snapshot's event dicts as the importer reads them (each dict's keys looked up
//! once), and the short excerpts of values and keys that messages quote.

use std::collections::HashMap;

use flare_package::trace::Excerpt;

use super::SnapshotError;
use crate::pickle::{Obj, ObjId, Pickle};

/// The most bytes [`some_keys`] spends on quoted keys: a message stays one short
/// line whatever the keys hold (an excerpt of escaped control characters is up to
/// about 250 bytes; 8 of them made a message of 1.9 KB, a fuzz finding).
const SOME_KEYS_BYTES: usize = 400;

/// Up to 8 of a dict's str keys, for a message (`its keys: "a", "b"`), no more of
/// them than [`SOME_KEYS_BYTES`] hold (at least one).
pub(super) fn some_keys(p: &Pickle, dict: ObjId) -> String {
    let keys = p.str_keys(dict);
    let mut names: Vec<String> = Vec::new();
    let mut used = 0;
    for k in keys.iter().take(8) {
        let name = Excerpt::new(k).to_string();
        if !names.is_empty() && used + name.len() > SOME_KEYS_BYTES {
            break;
        }
        used += name.len() + 2;
        names.push(name);
    }
    if keys.len() > names.len() {
        names.push(format!("... ({} keys)", keys.len()));
    }
    if names.is_empty() {
        "the dict has no str keys".to_string()
    } else {
        format!("its keys: {}", names.join(", "))
    }
}

/// The keys of an event dict the importer reads: their values, if present.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct EventKeys {
    pub(super) action: Option<ObjId>,
    pub(super) addr: Option<ObjId>,
    pub(super) size: Option<ObjId>,
}

/// [`EventKeys`] of each event dict, looked up once per dict ([`Pickle::get_all`])
/// however many times the pickle's memo shares it.
pub(super) struct EventKeysCache<'a> {
    p: &'a Pickle,
    seen: HashMap<ObjId, EventKeys>,
}

impl<'a> EventKeysCache<'a> {
    pub(super) fn new(p: &'a Pickle) -> Self {
        EventKeysCache {
            p,
            seen: HashMap::new(),
        }
    }

    /// The keys of the dict at `event` (all `None` when it is not a dict).
    pub(super) fn get(&mut self, event: ObjId) -> EventKeys {
        let p = self.p;
        *self.seen.entry(event).or_insert_with(|| {
            let [action, addr, size] = p.get_all(event, ["action", "addr", "size"]);
            EventKeys { action, addr, size }
        })
    }
}

/// An int key of an event that the importer reads.
#[derive(Clone, Copy, Debug)]
pub(super) enum Field {
    /// `addr`.
    Addr,
    /// `size`.
    Size,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Addr => "addr",
            Field::Size => "size",
        }
    }
}

/// One event as the importer needs it.
pub(super) struct Ev<'a> {
    pub(super) p: &'a Pickle,
    /// Index in the device's list.
    pub(super) index: usize,
    pub(super) keys: EventKeys,
    pub(super) action: &'a str,
    pub(super) device: usize,
}

/// The largest address or size an event may carry (see `Ev::uint`).
const MAX_EVENT_INT: u64 = 1 << 62;

impl Ev<'_> {
    /// The event's non-negative int key `key` (an address or a size, bytes), at most
    /// 2^62: an address plus a size (rounded up to 512 bytes) never overflows, and a
    /// size stays within the flare-trace limit of 2^63 (real addresses and sizes are
    /// far below: 57-bit virtual addresses, devices of a few hundred GiB).
    pub(super) fn uint(&self, field: Field) -> Result<u64, SnapshotError> {
        let key = field.name();
        let v = match field {
            Field::Addr => self.keys.addr,
            Field::Size => self.keys.size,
        };
        let v = v.ok_or_else(|| {
            SnapshotError::Layout(format!(
                "event {} of device {} (`{}`) has no `{key}` (device_traces[{}][{}])",
                self.index, self.device, self.action, self.device, self.index
            ))
        })?;
        self.p
            .int(v)
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&u| u <= MAX_EVENT_INT)
            .ok_or_else(|| {
                SnapshotError::Layout(format!(
                    "event {} of device {} (`{}`): `{key}` is {} {}, not an int from 0 to \
                     2^62 (device_traces[{}][{}])",
                    self.index,
                    self.device,
                    self.action,
                    self.p.type_name(v),
                    short(self.p, v),
                    self.device,
                    self.index
                ))
            })
    }

    /// Where the event is, for messages.
    pub(super) fn at(&self) -> String {
        format!(
            "event {} of device {} (`{}`, device_traces[{}][{}])",
            self.index, self.device, self.action, self.device, self.index
        )
    }
}

/// A value, shortly, for a message: a scalar as Python writes it, a container as
/// `(a list)`.
fn short(p: &Pickle, v: ObjId) -> String {
    match p.obj(v) {
        Some(Obj::Int(i)) => i.to_string(),
        Some(Obj::Float(f)) => f.to_string(),
        Some(Obj::Bool(b)) => if *b { "True" } else { "False" }.to_string(),
        Some(Obj::None) => "None".to_string(),
        Some(Obj::Str(s)) => Excerpt::new(s).to_string(),
        Some(o) => format!("(a {})", o.type_name()),
        None => String::new(),
    }
}
