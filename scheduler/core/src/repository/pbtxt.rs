//! Protocol-buffer text format, as Triton's `config.pbtxt` uses it, into a
//! generic tree (no schema here: [`super::config`] gives the fields their
//! meaning).
//!
//! Grammar accepted: `field: scalar`, `field { ... }`, `field: { ... }`,
//! `field < ... >`, lists `field: [a, b]` and `field [ {..}, {..} ]`,
//! optional `,` or `;` between fields, `#` comments to the end of the line,
//! double- or single-quoted strings with C escapes (adjacent strings
//! concatenate), numbers, identifiers (enum values, `true`). Repeated fields
//! simply appear several times. Input is untrusted: every failure is a
//! [`PbtxtError`] with its line and column, nesting is bounded by
//! [`MAX_DEPTH`] and the input by [`MAX_INPUT`], nothing panics.

use std::fmt;

/// Deepest nesting of messages and lists accepted.
pub const MAX_DEPTH: usize = 32;
/// Longest input accepted (bytes): a model config is a few KiB.
pub const MAX_INPUT: usize = 1 << 20;

/// A scalar as written: string literals are unescaped, anything else is the
/// token text (numbers and identifiers alike).
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// A quoted string (unescaped).
    Str(String),
    /// A bare token: a number, an enum identifier, `true`/`false`.
    Token(String),
}

/// A field's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar.
    Scalar(Scalar),
    /// A nested message.
    Message(Message),
}

/// A message: its fields in file order (repeated fields repeat).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message {
    /// `(name, value, line)` in order.
    pub fields: Vec<Field>,
}

/// One field occurrence.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Field name.
    pub name: String,
    /// Its value.
    pub value: Value,
    /// 1-based line where the value starts.
    pub line: u32,
}

impl Message {
    /// Every value of field `name`, in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Field> + 'a {
        self.fields.iter().filter(move |f| f.name == name)
    }
    /// The last value of field `name` (protobuf: the last one wins).
    pub fn last(&self, name: &str) -> Option<&Field> {
        self.fields.iter().rev().find(|f| f.name == name)
    }
}

/// A syntax error at a position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PbtxtError {
    /// 1-based line.
    pub line: u32,
    /// 1-based column (bytes).
    pub col: u32,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for PbtxtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.col, self.what)
    }
}

impl std::error::Error for PbtxtError {}

/// Parses a whole document (the top-level message's fields).
pub fn parse(text: &str) -> Result<Message, PbtxtError> {
    if text.len() > MAX_INPUT {
        return Err(PbtxtError {
            line: 1,
            col: 1,
            what: format!("file longer than {MAX_INPUT} bytes"),
        });
    }
    let mut p = Parser {
        s: text.as_bytes(),
        pos: 0,
        line: 1,
        line_start: 0,
    };
    let msg = p.fields(None, 0)?;
    Ok(msg)
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    line: u32,
    line_start: usize,
}

impl Parser<'_> {
    fn err(&self, what: impl Into<String>) -> PbtxtError {
        PbtxtError {
            line: self.line,
            col: (self.pos - self.line_start + 1).min(u32::MAX as usize) as u32,
            what: what.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    /// Skips whitespace and comments.
    fn skip(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                b'\n' => {
                    self.pos += 1;
                    self.line = self.line.saturating_add(1);
                    self.line_start = self.pos;
                }
                b' ' | b'\t' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// Fields until `close` (or the end of input when `None`).
    fn fields(&mut self, close: Option<u8>, depth: usize) -> Result<Message, PbtxtError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("nested deeper than {MAX_DEPTH}")));
        }
        let mut msg = Message::default();
        loop {
            self.skip();
            match (self.peek(), close) {
                (None, None) => return Ok(msg),
                (None, Some(c)) => return Err(self.err(format!("missing '{}'", c as char))),
                (Some(c), Some(want)) if c == want => {
                    self.pos += 1;
                    return Ok(msg);
                }
                _ => {}
            }
            let name = self.ident().ok_or_else(|| self.err("expected a field name"))?;
            self.skip();
            let colon = self.peek() == Some(b':');
            if colon {
                self.pos += 1;
                self.skip();
            }
            match self.peek() {
                Some(b'[') => {
                    self.pos += 1;
                    self.list(&name, &mut msg, depth + 1)?;
                }
                Some(b'{') | Some(b'<') => {
                    let line = self.line;
                    let m = self.message(depth + 1)?;
                    msg.fields.push(Field {
                        name,
                        value: Value::Message(m),
                        line,
                    });
                }
                _ if colon => {
                    let line = self.line;
                    let v = self.scalar()?;
                    msg.fields.push(Field {
                        name,
                        value: Value::Scalar(v),
                        line,
                    });
                }
                _ => return Err(self.err(format!("expected ':' or '{{' after '{name}'"))),
            }
            self.skip();
            if matches!(self.peek(), Some(b',') | Some(b';')) {
                self.pos += 1;
            }
        }
    }

    fn message(&mut self, depth: usize) -> Result<Message, PbtxtError> {
        let close = match self.peek() {
            Some(b'{') => b'}',
            Some(b'<') => b'>',
            _ => return Err(self.err("expected '{'")),
        };
        self.pos += 1;
        self.fields(Some(close), depth)
    }

    /// After `[`: values (scalars or messages) separated by commas, to `]`.
    fn list(&mut self, name: &str, msg: &mut Message, depth: usize) -> Result<(), PbtxtError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("nested deeper than {MAX_DEPTH}")));
        }
        self.skip();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip();
            let line = self.line;
            let value = match self.peek() {
                Some(b'{') | Some(b'<') => Value::Message(self.message(depth + 1)?),
                _ => Value::Scalar(self.scalar()?),
            };
            msg.fields.push(Field {
                name: name.to_string(),
                value,
                line,
            });
            self.skip();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.err(format!("expected ',' or ']' in the list '{name}'"))),
            }
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        {
            self.pos += 1;
        }
        let first = *self.s.get(start)?;
        if self.pos == start || first.is_ascii_digit() {
            self.pos = start;
            return None;
        }
        // ASCII only, so always valid UTF-8.
        std::str::from_utf8(&self.s[start..self.pos])
            .ok()
            .map(str::to_string)
    }

    fn scalar(&mut self) -> Result<Scalar, PbtxtError> {
        match self.peek() {
            Some(b'"') | Some(b'\'') => {
                let mut out = Vec::new();
                // Adjacent string literals concatenate.
                while let Some(q @ (b'"' | b'\'')) = self.peek() {
                    self.string(q, &mut out)?;
                    self.skip();
                }
                String::from_utf8(out)
                    .map(Scalar::Str)
                    .map_err(|_| self.err("string is not UTF-8"))
            }
            Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'+' || c == b'.' || c == b'_' => {
                let start = self.pos;
                while self.peek().is_some_and(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.' | b'_')
                }) {
                    self.pos += 1;
                }
                std::str::from_utf8(&self.s[start..self.pos])
                    .map(|t| Scalar::Token(t.to_string()))
                    .map_err(|_| self.err("bad token"))
            }
            Some(_) => Err(self.err("expected a value")),
            None => Err(self.err("expected a value, found the end of the file")),
        }
    }

    /// One quoted literal starting at `quote`, appended (unescaped) to `out`.
    fn string(&mut self, quote: u8, out: &mut Vec<u8>) -> Result<(), PbtxtError> {
        self.pos += 1;
        loop {
            let Some(c) = self.peek() else {
                return Err(self.err("unterminated string"));
            };
            self.pos += 1;
            match c {
                b'\n' => return Err(self.err("newline in a string")),
                c if c == quote => return Ok(()),
                b'\\' => {
                    let Some(e) = self.peek() else {
                        return Err(self.err("unterminated string"));
                    };
                    self.pos += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'0'..=b'7' => {
                            let mut v = u32::from(e - b'0');
                            for _ in 0..2 {
                                match self.peek() {
                                    Some(d @ b'0'..=b'7') => {
                                        v = v * 8 + u32::from(d - b'0');
                                        self.pos += 1;
                                    }
                                    _ => break,
                                }
                            }
                            out.push((v & 0xff) as u8);
                        }
                        b'x' => {
                            let mut v = 0u32;
                            let mut n = 0;
                            while n < 2 {
                                match self.peek().and_then(|d| (d as char).to_digit(16)) {
                                    Some(d) => {
                                        v = v * 16 + d;
                                        self.pos += 1;
                                        n += 1;
                                    }
                                    None => break,
                                }
                            }
                            if n == 0 {
                                return Err(self.err("bad \\x escape"));
                            }
                            out.push(v as u8);
                        }
                        other => out.push(other),
                    }
                }
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_triton_config() {
        let text = r#"
name: "ppocr_cls"  # comment
platform: "onnxruntime_onnx"
max_batch_size: 32
input [
  { name: "x", data_type: TYPE_FP32, dims: [ 3, 48, 192 ] }
]
output [{ name: "y" data_type: TYPE_FP32 dims: [2] reshape { shape: [ 1, 2 ] } }]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "slo_ms" value { string_value: "5" "0" } }
"#;
        let m = parse(text).unwrap();
        assert_eq!(m.all("input").count(), 1);
        let Value::Message(inp) = &m.last("input").unwrap().value else { panic!() };
        assert_eq!(inp.all("dims").count(), 3);
        let Value::Message(p) = &m.last("parameters").unwrap().value else { panic!() };
        let Value::Message(v) = &p.last("value").unwrap().value else { panic!() };
        assert_eq!(
            v.last("string_value").unwrap().value,
            Value::Scalar(Scalar::Str("50".into()))
        );
        assert_eq!(m.last("dynamic_batching").unwrap().line, 9);
    }

    #[test]
    fn errors_carry_positions() {
        let e = parse("name: \"x\"\nmax_batch_size 4\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 16));
        assert!(parse("a { b: 1").unwrap_err().what.contains("missing '}'"));
        assert!(parse("a: \"x").is_err());
        assert!(parse(&"a {".repeat(100)).unwrap_err().what.contains("nested"));
        assert!(parse("a: [1, 2").is_err());
    }
}
