//! A reader of Python pickles that hold plain data (what
//! `torch.cuda.memory._dump_snapshot` writes): `None`, bools, ints, floats, str,
//! bytes, lists, tuples, dicts and sets, in the binary opcodes of protocols 1 to 5
//! (and the text `PUT`/`GET` of protocol 0). It never imports or calls anything: an
//! opcode that would (`GLOBAL`, `REDUCE`, `BUILD`, ...) is an error.
//!
//! Why not a crate: serde-pickle 1.2.0, the maintained one, fails on real PyTorch
//! snapshots ("recursive structure found": its memo keeps reference counts that go
//! wrong when a shared object holds other shared objects, as the stack frames of a
//! snapshot do), and its `replace_recursive_structures` option replaces the values it
//! loses with `None` (hundreds of event fields of `tests/data/torch/*.pickle`).
//! Here, as in CPython, every object lives once in an arena and the memo, the stack
//! and the containers hold its index: a shared object is shared, never copied.
#![forbid(unsafe_code)]

mod decoder;

use std::fmt;

pub use decoder::read;

/// The highest pickle protocol this reader takes (Python 3.8's and later's
/// highest; `PROTO` names 2 to 5).
pub const MAX_PROTOCOL: u8 = 5;

/// The index of an object in a [`Pickle`]'s arena.
pub type ObjId = usize;

/// One Python object.
#[derive(Clone, Debug, PartialEq)]
pub enum Obj {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An int that fits in an `i128`.
    Int(i128),
    /// An int too large for an `i128` (its encoding is dropped: nothing a snapshot
    /// importer reads is that large).
    BigInt,
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// A bytes, bytearray or Python 2 str.
    Bytes(Vec<u8>),
    /// A list's items.
    List(Vec<ObjId>),
    /// A tuple's items.
    Tuple(Vec<ObjId>),
    /// A dict's (key, value) pairs in the order they were set (a key set twice is
    /// there twice: [`Pickle::get`] finds the last value, as Python's dict keeps).
    Dict(Vec<(ObjId, ObjId)>),
    /// A set's or frozenset's items.
    Set(Vec<ObjId>),
}

impl Obj {
    /// Python's name of the object's type (`dict`, `list`, `int`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Obj::None => "None",
            Obj::Bool(_) => "bool",
            Obj::Int(_) | Obj::BigInt => "int",
            Obj::Float(_) => "float",
            Obj::Str(_) => "str",
            Obj::Bytes(_) => "bytes",
            Obj::List(_) => "list",
            Obj::Tuple(_) => "tuple",
            Obj::Dict(_) => "dict",
            Obj::Set(_) => "set",
        }
    }
}

/// Why a pickle could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickleError {
    /// The input ends before the pickle's `STOP` opcode: the byte offset where the
    /// input ran out (its length).
    Truncated(usize),
    /// An opcode this reader does not take (one that would import or call
    /// something, or an unknown byte): the opcode and its byte offset.
    Unsupported {
        /// The opcode byte.
        opcode: u8,
        /// Its offset in the input, bytes.
        at: usize,
    },
    /// The opcodes do not make a valid pickle (an empty stack, a memo index that
    /// was never set, a str that is not UTF-8, ...): what and where.
    Invalid {
        /// What is wrong.
        what: String,
        /// The offset of the opcode, bytes.
        at: usize,
    },
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleError::Truncated(at) => write!(
                f,
                "truncated pickle: the input ends at byte {at}, before the pickle's end"
            ),
            PickleError::Unsupported { opcode, at } => write!(
                f,
                "unsupported pickle opcode {opcode:#04x} ({:?}) at byte {at}: only plain data \
                 (None, bool, int, float, str, bytes, list, tuple, dict, set) is read",
                char::from(*opcode)
            ),
            PickleError::Invalid { what, at } => {
                write!(f, "invalid pickle at byte {at}: {what}")
            }
        }
    }
}

impl std::error::Error for PickleError {}

/// A decoded pickle: its objects and the one the pickle returns.
#[derive(Clone, Debug, PartialEq)]
pub struct Pickle {
    objs: Vec<Obj>,
    root: ObjId,
}

impl Pickle {
    /// The object the pickle returns (its `STOP` value).
    pub fn root(&self) -> ObjId {
        self.root
    }

    /// The object at `id` (`None` when `id` is not an object of this pickle).
    pub fn obj(&self, id: ObjId) -> Option<&Obj> {
        self.objs.get(id)
    }

    /// Python's type name of the object at `id` (`?` when there is none).
    pub fn type_name(&self, id: ObjId) -> &'static str {
        self.obj(id).map_or("?", Obj::type_name)
    }

    /// The value of the str key `key` of the dict at `id` (its last value, if it was
    /// set twice); `None` when `id` is not a dict or has no such key.
    pub fn get(&self, id: ObjId, key: &str) -> Option<ObjId> {
        let Some(Obj::Dict(pairs)) = self.obj(id) else {
            return None;
        };
        pairs
            .iter()
            .rev()
            .find(|&&(k, _)| matches!(self.obj(k), Some(Obj::Str(s)) if s == key))
            .map(|&(_, v)| v)
    }

    /// The values of the str keys `keys` of the dict at `id`, each its last value
    /// (as [`Pickle::get`]), found in one pass over the dict's pairs: `N` lookups
    /// in one dict cost one walk of it, not `N`. All `None` when `id` is not a dict.
    pub fn get_all<const N: usize>(&self, id: ObjId, keys: [&str; N]) -> [Option<ObjId>; N] {
        let mut found = [None; N];
        let Some(Obj::Dict(pairs)) = self.obj(id) else {
            return found;
        };
        for &(k, v) in pairs {
            if let Some(Obj::Str(s)) = self.obj(k) {
                if let Some(i) = keys.iter().position(|&key| key == s) {
                    found[i] = Some(v);
                }
            }
        }
        found
    }

    /// The items of the list or tuple at `id`; `None` for any other object.
    pub fn items(&self, id: ObjId) -> Option<&[ObjId]> {
        match self.obj(id) {
            Some(Obj::List(items) | Obj::Tuple(items)) => Some(items),
            _ => None,
        }
    }

    /// The dict at `id`'s keys that are str (in insertion order); empty when `id` is
    /// not a dict.
    pub fn str_keys(&self, id: ObjId) -> Vec<&str> {
        let Some(Obj::Dict(pairs)) = self.obj(id) else {
            return Vec::new();
        };
        pairs
            .iter()
            .filter_map(|&(k, _)| match self.obj(k) {
                Some(Obj::Str(s)) => Some(s.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The int at `id` (a bool is not taken as an int); `None` otherwise.
    pub fn int(&self, id: ObjId) -> Option<i128> {
        match self.obj(id) {
            Some(Obj::Int(i)) => Some(*i),
            _ => None,
        }
    }

    /// The str at `id`; `None` otherwise.
    pub fn str(&self, id: ObjId) -> Option<&str> {
        match self.obj(id) {
            Some(Obj::Str(s)) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made with Python 3: `pickle.dumps(VALUE, PROTOCOL)`.
    #[test]
    fn reads_what_python_writes() {
        // {'a': [1, -2, 2**40, 2**70], 'b': (None, True, 1.5), 'c': b'x'}, protocol 4
        let p4: &[u8] = b"\x80\x04\x95@\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00@e\x8c\x01b\x94N\x88G?\xf8\x00\x00\x00\x00\x00\x00\x87\x94\x8c\x01c\x94C\x01x\x94u.";
        let p = read(p4).unwrap();
        let root = p.root();
        let a = p.items(p.get(root, "a").unwrap()).unwrap().to_vec();
        let ints: Vec<Option<i128>> = a.iter().map(|&i| p.int(i)).collect();
        assert_eq!(ints, [Some(1), Some(-2), Some(1 << 40), Some(1 << 70)]);
        let b = p.items(p.get(root, "b").unwrap()).unwrap().to_vec();
        assert_eq!(p.obj(b[0]), Some(&Obj::None));
        assert_eq!(p.obj(b[1]), Some(&Obj::Bool(true)));
        assert_eq!(p.obj(b[2]), Some(&Obj::Float(1.5)));
        assert_eq!(
            p.obj(p.get(root, "c").unwrap()),
            Some(&Obj::Bytes(b"x".to_vec()))
        );
        assert_eq!(p.str_keys(root), ["a", "b", "c"]);
        // every proper prefix is truncated
        for cut in 0..p4.len() {
            assert!(
                matches!(read(&p4[..cut]), Err(PickleError::Truncated(_))),
                "{cut}"
            );
        }
    }

    #[test]
    fn shared_objects_are_shared() {
        // x = {'k': 'v'}; [x, x, {'k': 'w'}], protocol 5
        let p5: &[u8] = b"\x80\x05\x95\x1b\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94\x8c\x01k\x94\x8c\x01v\x94sh\x01}\x94h\x02\x8c\x01w\x94se.";
        let p = read(p5).unwrap();
        let items = p.items(p.root()).unwrap().to_vec();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0], items[1]);
        let v: Vec<Option<&str>> = items
            .iter()
            .map(|&d| p.get(d, "k").and_then(|v| p.str(v)))
            .collect();
        assert_eq!(v, [Some("v"), Some("v"), Some("w")]);
    }

    #[test]
    fn get_all_finds_the_last_value_of_each_key() {
        // {'a': 1, 'b': 2, 7: None, 'a': 3} as a pickle can write it (SETITEMS
        // with 'a' twice): 'a' is 3 and 'b' 2, as Python's dict keeps.
        let bytes: &[u8] = b"\x80\x04}(\x8c\x01aK\x01\x8c\x01bK\x02K\x07N\x8c\x01aK\x03u.";
        let p = read(bytes).unwrap();
        let [a, b, c] = p.get_all(p.root(), ["a", "b", "c"]);
        assert_eq!(a.and_then(|v| p.int(v)), Some(3));
        assert_eq!(b.and_then(|v| p.int(v)), Some(2));
        assert_eq!(c, None);
        assert_eq!([a, b], [p.get(p.root(), "a"), p.get(p.root(), "b")]);
        // not a dict: nothing
        let list = read(b"\x80\x04].").unwrap();
        assert_eq!(list.get_all(list.root(), ["a"]), [None]);
    }

    #[test]
    fn protocols_2_to_5_only() {
        // pickle.dumps(None, P) for P in 2..=5 is b'\x80' P b'N.' (protocol 4 and 5
        // add a FRAME only for larger pickles).
        for protocol in 2..=5u8 {
            let bytes = [0x80, protocol, b'N', b'.'];
            assert_eq!(
                read(&bytes).map(|p| p.obj(p.root()).cloned()),
                Ok(Some(Obj::None))
            );
        }
        for protocol in [0u8, 1, 6, 9, 255] {
            let bytes = [0x80, protocol, b'N', b'.'];
            match read(&bytes) {
                Err(PickleError::Invalid { what, at: 0 }) => {
                    assert!(what.contains(&format!("protocol {protocol}")), "{what}")
                }
                other => panic!("protocol {protocol}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_long_text_argument_is_quoted_shortly() {
        // PROTO 2, then INT, FLOAT and PUT with a text argument of 5000 bytes that is
        // not what the opcode takes: the message quotes its start and its length.
        for (op, what) in [(b'I', "an int"), (b'F', "a float"), (b'p', "a number")] {
            let mut bytes = vec![0x80, 2, b'N', op];
            bytes.extend(std::iter::repeat_n(b'x', 5000));
            bytes.extend_from_slice(b"\n.");
            let Err(e @ PickleError::Invalid { at: 3, .. }) = read(&bytes) else {
                panic!("{}: {:?}", char::from(op), read(&bytes));
            };
            let message = e.to_string();
            let start = &message[..message.len().min(100)];
            assert!(message.len() < 200, "{} bytes: {start}...", message.len());
            assert!(message.contains("(5000 bytes)"), "{message}");
            assert!(message.contains(what), "{message}");
        }
    }

    #[test]
    fn code_is_never_run() {
        // pickle.dumps(collections.OrderedDict(), 2) starts with a GLOBAL
        let p2: &[u8] = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.";
        assert_eq!(
            read(p2),
            Err(PickleError::Unsupported {
                opcode: b'c',
                at: 2
            })
        );
    }
}
