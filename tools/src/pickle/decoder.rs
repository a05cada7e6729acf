//! The decoder: the pickle machine that runs the opcodes of plain data into a
//! [`Pickle`]'s arena, and refuses any opcode that would import or call.

use super::{Obj, ObjId, Pickle, PickleError, MAX_PROTOCOL};

// A text argument is quoted as the trace parser quotes a token: its first 40
// characters and its length when it is longer (a 1 MB line is a one-line message).
use flare_package::trace::Excerpt;

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
