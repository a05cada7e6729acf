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

use std::fmt;

// A text argument is quoted as the trace parser quotes a token: its first 40
// characters and its length when it is longer (a 1 MB line is a one-line message).
use flare_package::trace::Excerpt;

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

/// The decoder's state.
struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run (for messages).
    op_at: usize,
    objs: Vec<Obj>,
    stack: Vec<ObjId>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    /// The memo: index -> object (sparse for `PUT`/`BINPUT` with gaps).
    memo: Vec<Option<ObjId>>,
}

/// Reads the pickle at the start of `input` (bytes after its `STOP` are ignored, as
/// Python's `pickle.load` does).
///
/// Errors: [`PickleError::Truncated`] when `input` ends before the `STOP` opcode;
/// [`PickleError::Unsupported`] for an opcode that is not plain data;
/// [`PickleError::Invalid`] when the opcodes do not make a pickle.
pub fn read(input: &[u8]) -> Result<Pickle, PickleError> {
    let mut m = Machine {
        input,
        pos: 0,
        op_at: 0,
        objs: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
    };
    loop {
        m.op_at = m.pos;
        let op = m.byte()?;
        if op == b'.' {
            let root = m.pop()?;
            return Ok(Pickle { objs: m.objs, root });
        }
        m.step(op)?;
    }
}

impl Machine<'_> {
    fn invalid<T>(&self, what: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError::Invalid {
            what: what.into(),
            at: self.op_at,
        })
    }

    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.input.len())
            .ok_or(PickleError::Truncated(self.input.len()))?;
        let bytes = &self.input[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A length of `n` little-endian bytes, as a `usize`.
    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let v = self.le(n)?;
        usize::try_from(v).or_else(|_| self.invalid(format!("length {v} is too large")))
    }

    /// A text line (protocol 0 arguments), without its `\n`.
    fn line(&mut self) -> Result<&str, PickleError> {
        let rest = &self.input[self.pos..];
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            return Err(PickleError::Truncated(self.input.len()));
        };
        self.pos += nl + 1;
        std::str::from_utf8(&rest[..nl]).or_else(|_| self.invalid("a text argument is not UTF-8"))
    }

    fn new_obj(&mut self, o: Obj) -> ObjId {
        self.objs.push(o);
        self.objs.len() - 1
    }

    fn push(&mut self, o: Obj) {
        let id = self.new_obj(o);
        self.stack.push(id);
    }

    fn pop(&mut self) -> Result<ObjId, PickleError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return self.invalid("the stack is empty above the mark");
        }
        match self.stack.pop() {
            Some(id) => Ok(id),
            None => self.invalid("the stack is empty"),
        }
    }

    fn top(&self) -> Result<ObjId, PickleError> {
        match self.stack.last() {
            Some(&id) => Ok(id),
            None => self.invalid("the stack is empty"),
        }
    }

    /// The items above the last mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<ObjId>, PickleError> {
        let Some(mark) = self.marks.pop() else {
            return self.invalid("no mark on the stack");
        };
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn str_obj(&mut self, bytes_len: usize) -> Result<(), PickleError> {
        let bytes = self.take(bytes_len)?.to_vec();
        match String::from_utf8(bytes) {
            Ok(s) => {
                self.push(Obj::Str(s));
                Ok(())
            }
            Err(_) => self.invalid("a str is not UTF-8"),
        }
    }

    fn bytes_obj(&mut self, len: usize) -> Result<(), PickleError> {
        let bytes = self.take(len)?.to_vec();
        self.push(Obj::Bytes(bytes));
        Ok(())
    }

    /// A signed little-endian int of `len` bytes (LONG1, LONG4).
    fn long(&mut self, len: usize) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        let obj = if bytes.is_empty() {
            Obj::Int(0)
        } else if bytes.len() <= 16 {
            let negative = bytes[bytes.len() - 1] & 0x80 != 0;
            let mut buf = [if negative { 0xff } else { 0 }; 16];
            buf[..bytes.len()].copy_from_slice(bytes);
            Obj::Int(i128::from_le_bytes(buf))
        } else {
            Obj::BigInt
        };
        self.push(obj);
        Ok(())
    }

    fn memo_put(&mut self, index: usize) -> Result<(), PickleError> {
        let top = self.top()?;
        if index >= self.memo.len() {
            if index > self.objs.len().saturating_add(1 << 20) {
                return self.invalid(format!("memo index {index} is out of range"));
            }
            self.memo.resize(index + 1, None);
        }
        self.memo[index] = Some(top);
        Ok(())
    }

    fn memo_get(&mut self, index: usize) -> Result<(), PickleError> {
        match self.memo.get(index).copied().flatten() {
            Some(id) => {
                self.stack.push(id);
                Ok(())
            }
            None => self.invalid(format!("memo index {index} was never set")),
        }
    }

    /// Appends `items` to the list (or set) at `target`.
    fn extend(&mut self, target: ObjId, items: Vec<ObjId>) -> Result<(), PickleError> {
        match self.objs.get_mut(target) {
            Some(Obj::List(l) | Obj::Set(l)) => {
                l.extend(items);
                Ok(())
            }
            _ => self.invalid("appending to an object that is not a list or a set"),
        }
    }

    /// Adds the pairs of `kv` (key, value, key, value, ...) to the dict at `target`.
    fn set_items(&mut self, target: ObjId, kv: Vec<ObjId>) -> Result<(), PickleError> {
        if !kv.len().is_multiple_of(2) {
            return self.invalid("a dict item without its value");
        }
        match self.objs.get_mut(target) {
            Some(Obj::Dict(pairs)) => {
                pairs.extend(kv.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            _ => self.invalid("setting an item of an object that is not a dict"),
        }
    }

    fn step(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            // PROTO (2 to 5, what Python 3 writes; a later protocol may add opcodes
            // this reader would misread), FRAME
            0x80 => {
                let protocol = self.byte()?;
                if !(2..=MAX_PROTOCOL).contains(&protocol) {
                    return self.invalid(format!(
                        "pickle protocol {protocol} (this reader takes 2 to {MAX_PROTOCOL})"
                    ));
                }
            }
            0x95 => {
                self.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.marks.last().is_some_and(|&m| m == self.stack.len()) {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?;
                self.stack.push(top);
            }
            b'N' => self.push(Obj::None),
            0x88 => self.push(Obj::Bool(true)),
            0x89 => self.push(Obj::Bool(false)),
            b'J' => {
                let v = self.le(4)? as u32 as i32;
                self.push(Obj::Int(i128::from(v)));
            }
            b'K' => {
                let v = self.le(1)?;
                self.push(Obj::Int(i128::from(v)));
            }
            b'M' => {
                let v = self.le(2)?;
                self.push(Obj::Int(i128::from(v)));
            }
            0x8a => {
                let n = self.len(1)?;
                self.long(n)?;
            }
            0x8b => {
                let n = self.len(4)?;
                self.long(n)?;
            }
            b'I' | b'L' => {
                let text = self.line()?.trim_end_matches('L').to_string();
                let obj = match text.as_str() {
                    "00" if op == b'I' => Obj::Bool(false),
                    "01" if op == b'I' => Obj::Bool(true),
                    t => match t.parse::<i128>() {
                        Ok(i) => Obj::Int(i),
                        Err(_)
                            if !t.is_empty()
                                && t.trim_start_matches('-')
                                    .bytes()
                                    .all(|b| b.is_ascii_digit()) =>
                        {
                            Obj::BigInt
                        }
                        Err(_) => {
                            return self.invalid(format!("{} is not an int", Excerpt::new(t)))
                        }
                    },
                };
                self.push(obj);
            }
            b'G' => {
                let bytes = self.take(8)?;
                let mut buf = [0u8; 8];
                buf.copy_from_slice(bytes);
                self.push(Obj::Float(f64::from_be_bytes(buf)));
            }
            b'F' => {
                let text = self.line()?.to_string();
                match text.parse::<f64>() {
                    Ok(f) => self.push(Obj::Float(f)),
                    Err(_) => {
                        return self.invalid(format!("{} is not a float", Excerpt::new(&text)))
                    }
                }
            }
            0x8c => {
                let n = self.len(1)?;
                self.str_obj(n)?;
            }
            b'X' => {
                let n = self.len(4)?;
                self.str_obj(n)?;
            }
            0x8d => {
                let n = self.len(8)?;
                self.str_obj(n)?;
            }
            b'C' | b'U' => {
                let n = self.len(1)?;
                self.bytes_obj(n)?;
            }
            b'B' | b'T' => {
                let n = self.len(4)?;
                self.bytes_obj(n)?;
            }
            0x8e | 0x96 => {
                let n = self.len(8)?;
                self.bytes_obj(n)?;
            }
            b']' => self.push(Obj::List(Vec::new())),
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Obj::List(items));
            }
            b'a' => {
                let item = self.pop()?;
                let list = self.top()?;
                self.extend(list, vec![item])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.top()?;
                self.extend(list, items)?;
            }
            b')' => self.push(Obj::Tuple(Vec::new())),
            b't' => {
                let items = self.pop_mark()?;
                self.push(Obj::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < n
                    || self.marks.last().is_some_and(|&m| m > self.stack.len() - n)
                {
                    return self.invalid("too few items on the stack for a tuple");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Obj::Tuple(items));
            }
            b'}' => self.push(Obj::Dict(Vec::new())),
            b'd' => {
                let kv = self.pop_mark()?;
                let dict = self.new_obj(Obj::Dict(Vec::new()));
                self.set_items(dict, kv)?;
                self.stack.push(dict);
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let dict = self.top()?;
                self.set_items(dict, vec![k, v])?;
            }
            b'u' => {
                let kv = self.pop_mark()?;
                let dict = self.top()?;
                self.set_items(dict, kv)?;
            }
            0x8f => self.push(Obj::Set(Vec::new())),
            0x90 => {
                let items = self.pop_mark()?;
                let set = self.top()?;
                self.extend(set, items)?;
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Obj::Set(items));
            }
            0x94 => {
                let index = self.memo.len();
                self.memo_put(index)?;
            }
            b'q' => {
                let i = self.len(1)?;
                self.memo_put(i)?;
            }
            b'r' => {
                let i = self.len(4)?;
                self.memo_put(i)?;
            }
            b'h' => {
                let i = self.len(1)?;
                self.memo_get(i)?;
            }
            b'j' => {
                let i = self.len(4)?;
                self.memo_get(i)?;
            }
            b'p' | b'g' => {
                let text = self.line()?.to_string();
                let Ok(i) = text.parse::<usize>() else {
                    return self.invalid(format!(
                        "memo index {} is not a number",
                        Excerpt::new(&text)
                    ));
                };
                if op == b'p' {
                    self.memo_put(i)?;
                } else {
                    self.memo_get(i)?;
                }
            }
            _ => {
                return Err(PickleError::Unsupported {
                    opcode: op,
                    at: self.op_at,
                })
            }
        }
        Ok(())
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
