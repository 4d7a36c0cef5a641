//! Canonical JSON (SPEC §1): strict parser, printer byte-identical to Python's json.dumps(sort_keys, ensure_ascii, compact), fingerprints.
//!
//! The canonical form of a value is exactly what Python produces with
//!
//! ```text
//! json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
//! ```
//!
//! and its [`Fingerprint`] is the SHA-256 of those ASCII bytes.
//!
//! The parser is deliberately stricter than Python's `json.loads`: anything
//! that cannot be represented faithfully (duplicate keys, lone surrogates,
//! `NaN`/`Infinity`, integers outside `[-2^63, 2^64-1]`, overflowing doubles,
//! nesting deeper than [`MAX_DEPTH`]) is rejected instead of being silently
//! changed. Unicode is never normalised.

use std::fmt::{self, Write as _};

use sha2::{Digest, Sha256};

/// Maximum number of nested containers (arrays/objects) accepted by the parser.
pub const MAX_DEPTH: usize = 64;

/// A parsed JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    Object(Object),
}

/// A JSON number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A number written without `.`, `e` or `E`; always within `[-2^63, 2^64-1]`.
    Int(i128),
    /// Any other number; always finite.
    Float(f64),
}

/// Object members sorted by key (code-point order == UTF-8 byte order), keys unique.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object {
    members: Vec<(String, Value)>,
}

impl Object {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.members.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    /// The value stored under `key` (binary search).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.position(key).ok().map(|i| &self.members[i].1)
    }

    /// Mutable access to the value stored under `key`.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        self.position(key).ok().map(|i| &mut self.members[i].1)
    }

    /// Inserts `value` under `key`, keeping the members sorted. Returns the
    /// previous value if the key was already present (it is replaced).
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        let key = key.into();
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.members[i].1, value)),
            Err(i) => {
                self.members.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes and returns the value stored under `key`.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.position(key).ok().map(|i| self.members.remove(i).1)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True if the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members in sorted key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.members.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in sorted order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|(k, _)| k.as_str())
    }
}

impl FromIterator<(String, Value)> for Object {
    /// Later duplicates replace earlier ones.
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        let mut members: Vec<(String, Value)> = iter.into_iter().collect();
        // Stable sort keeps equal keys in input order; `dedup_by` keeps the
        // first of a run, so move each later value into the kept slot.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                std::mem::swap(&mut later.1, &mut kept.1);
                true
            } else {
                false
            }
        });
        Object { members }
    }
}

/// Why an input was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    InvalidJson,
    InvalidUtf8,
    DuplicateKey,
    LoneSurrogate,
    NumberOutOfRange,
    TooDeep,
}

impl ErrorKind {
    /// The stable kebab-case name used in vectors and CLI output.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::InvalidJson => "invalid-json",
            ErrorKind::InvalidUtf8 => "invalid-utf8",
            ErrorKind::DuplicateKey => "duplicate-key",
            ErrorKind::LoneSurrogate => "lone-surrogate",
            ErrorKind::NumberOutOfRange => "number-out-of-range",
            ErrorKind::TooDeep => "too-deep",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected input: the kind, the byte offset of the offending token and a
/// short lowercase description (never echoing more than ~40 chars of input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {offset}: {detail}")]
pub struct CanonicalError {
    pub kind: ErrorKind,
    pub offset: usize,
    pub detail: String,
}

impl CanonicalError {
    fn new(kind: ErrorKind, offset: usize, detail: impl Into<String>) -> Self {
        CanonicalError {
            kind,
            offset,
            detail: detail.into(),
        }
    }
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

/// Parses one JSON text from UTF-8 bytes (strictly; see module docs).
pub fn parse(input: &[u8]) -> Result<Value, CanonicalError> {
    match std::str::from_utf8(input) {
        Ok(s) => parse_str(s),
        Err(e) => Err(CanonicalError::new(
            ErrorKind::InvalidUtf8,
            e.valid_up_to(),
            "invalid utf-8 sequence",
        )),
    }
}

/// Parses one JSON text (strictly; see module docs).
pub fn parse_str(input: &str) -> Result<Value, CanonicalError> {
    let mut p = Parser::new(input);
    p.skip_ws();
    let value = p.parse_value().map_err(|e| *e)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(*p.invalid(p.pos, "trailing characters after json value"));
    }
    Ok(value)
}

/// Parses and prints in canonical form.
pub fn canonicalize(input: &[u8]) -> Result<String, CanonicalError> {
    parse(input).map(|v| to_canonical(&v))
}

/// Parser results: the error is boxed so the hot `Ok` path moves small
/// values (errors are rare and leave through [`parse_str`] unboxed).
type ParseResult<T> = Result<T, Box<CanonicalError>>;

struct Parser<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser {
            src,
            bytes: src.as_bytes(),
            pos: 0,
            depth: 0,
        }
    }

    fn invalid(&self, offset: usize, detail: &'static str) -> Box<CanonicalError> {
        Box::new(CanonicalError::new(ErrorKind::InvalidJson, offset, detail))
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Parses a value starting at `self.pos` (whitespace already skipped).
    ///
    /// Inlined into the container loops so scalars are built in place;
    /// only containers recurse through an out-of-line call.
    #[inline(always)]
    fn parse_value(&mut self) -> ParseResult<Value> {
        match self.peek() {
            None => Err(self.invalid(self.pos, "unexpected end of input")),
            Some(b'{') => self.parse_object(),
            Some(b'[') => self.parse_array(),
            Some(b'"') => self.parse_string().map(Value::String),
            Some(b't') => self.parse_literal(b"true", Value::Bool(true)),
            Some(b'f') => self.parse_literal(b"false", Value::Bool(false)),
            Some(b'n') => self.parse_literal(b"null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.parse_number().map(Value::Number),
            Some(_) => Err(self.invalid(self.pos, "expected a json value")),
        }
    }

    fn parse_literal(&mut self, literal: &'static [u8], value: Value) -> ParseResult<Value> {
        if self.bytes[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            Ok(value)
        } else {
            Err(self.invalid(self.pos, "invalid literal"))
        }
    }

    fn enter(&mut self) -> ParseResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Box::new(CanonicalError::new(
                ErrorKind::TooDeep,
                self.pos,
                "more than 64 nested containers",
            )));
        }
        Ok(())
    }

    #[inline(never)]
    fn parse_array(&mut self) -> ParseResult<Value> {
        self.enter()?;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                items.push(self.parse_value()?);
                self.skip_ws();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.skip_ws();
                    }
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.invalid(self.pos, "expected ',' or ']'")),
                }
            }
        }
        self.depth -= 1;
        Ok(Value::Array(items))
    }

    #[inline(never)]
    fn parse_object(&mut self) -> ParseResult<Value> {
        let start = self.pos;
        self.enter()?;
        self.pos += 1; // '{'
        let mut members: Vec<(String, Value)> = Vec::new();
        // While keys arrive strictly increasing, a duplicate can only equal the
        // previous key, so it is reported right where it occurs. Otherwise the
        // members are sorted at the end and adjacent keys compared.
        let mut sorted = true;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                let key_pos = self.pos;
                if self.peek() != Some(b'"') {
                    return Err(self.invalid(self.pos, "expected string key"));
                }
                let key = self.parse_string()?;
                if sorted && let Some((prev, _)) = members.last() {
                    match key_order(prev, &key) {
                        std::cmp::Ordering::Less => {}
                        std::cmp::Ordering::Equal => return Err(duplicate_error(key_pos, &key)),
                        std::cmp::Ordering::Greater => sorted = false,
                    }
                }
                self.skip_ws();
                if self.peek() != Some(b':') {
                    return Err(self.invalid(self.pos, "expected ':'"));
                }
                self.pos += 1;
                self.skip_ws();
                let value = self.parse_value()?;
                members.push((key, value));
                self.skip_ws();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.skip_ws();
                    }
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.invalid(self.pos, "expected ',' or '}'")),
                }
            }
        }
        if !sorted {
            members.sort_by(|a, b| key_order(&a.0, &b.0));
            if members.windows(2).any(|w| w[0].0 == w[1].0) {
                return Err(self.locate_duplicate(start));
            }
        }
        self.depth -= 1;
        Ok(Value::Object(Object { members }))
    }

    /// Error path only: re-scans the (otherwise valid) object starting at
    /// `start` to report the first key, in document order, that repeats.
    fn locate_duplicate(&self, start: usize) -> Box<CanonicalError> {
        let mut p = Parser {
            src: self.src,
            bytes: self.bytes,
            pos: start + 1,
            depth: 0,
        };
        let mut seen = std::collections::BTreeSet::new();
        let found = (|| -> ParseResult<Option<(usize, String)>> {
            loop {
                p.skip_ws();
                let key_pos = p.pos;
                if p.peek() != Some(b'"') {
                    return Ok(None);
                }
                let key = p.parse_string()?;
                if seen.contains(&key) {
                    return Ok(Some((key_pos, key)));
                }
                p.skip_ws();
                p.pos += 1; // ':'
                p.skip_ws();
                p.parse_value()?;
                seen.insert(key);
                p.skip_ws();
                if p.peek() != Some(b',') {
                    return Ok(None);
                }
                p.pos += 1;
            }
        })();
        match found {
            Ok(Some((pos, key))) => duplicate_error(pos, &key),
            _ => Box::new(CanonicalError::new(
                ErrorKind::DuplicateKey,
                start,
                "duplicate key in object",
            )),
        }
    }

    /// Parses a string literal starting at the opening quote.
    ///
    /// The common case (no escapes) is inlined so the `String` comes back in
    /// registers; escapes and errors take the out-of-line path.
    #[inline(always)]
    fn parse_string(&mut self) -> ParseResult<String> {
        let run_start = self.pos + 1;
        if let Some(n) = find_string_special(&self.bytes[run_start..]) {
            let end = run_start + n;
            if self.bytes[end] == b'"' {
                // Both ends sit next to ASCII bytes: char boundaries.
                let text = self.src[run_start..end].to_owned();
                self.pos = end + 1;
                return Ok(text);
            }
        }
        self.parse_string_slow()
    }

    /// [`Self::parse_string`] for strings with escapes (or errors).
    #[inline(never)]
    fn parse_string_slow(&mut self) -> ParseResult<String> {
        let open = self.pos;
        self.pos += 1;
        let mut run_start = self.pos;
        let mut out = String::new();
        loop {
            let Some(n) = find_string_special(&self.bytes[self.pos..]) else {
                return Err(self.invalid(open, "unterminated string"));
            };
            self.pos += n;
            if out.capacity() == 0 {
                out.reserve(n + 16);
            }
            // `run_start` and `self.pos` both sit next to ASCII bytes, hence
            // on char boundaries of the (already validated) UTF-8 source.
            out.push_str(&self.src[run_start..self.pos]);
            match self.bytes[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.parse_escape(&mut out)?;
                    run_start = self.pos;
                }
                _ => return Err(self.invalid(self.pos, "control character in string")),
            }
        }
    }

    /// Decodes the escape at `self.pos` (a backslash) into `out`.
    fn parse_escape(&mut self, out: &mut String) -> ParseResult<()> {
        let at = self.pos;
        let Some(&c) = self.bytes.get(at + 1) else {
            return Err(self.invalid(at, "unterminated escape"));
        };
        self.pos = at + 2;
        let ch = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4(at)?;
                let code = match unit {
                    0xD800..=0xDBFF => {
                        if self.bytes.get(self.pos) == Some(&b'\\')
                            && self.bytes.get(self.pos + 1) == Some(&b'u')
                        {
                            let low_at = self.pos;
                            self.pos += 2;
                            let low = self.hex4(low_at)?;
                            if !(0xDC00..=0xDFFF).contains(&low) {
                                return Err(lone_surrogate(at));
                            }
                            0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                        } else {
                            return Err(lone_surrogate(at));
                        }
                    }
                    0xDC00..=0xDFFF => return Err(lone_surrogate(at)),
                    _ => unit,
                };
                char::from_u32(code).ok_or_else(|| lone_surrogate(at))?
            }
            _ => return Err(self.invalid(at, "invalid escape")),
        };
        out.push(ch);
        Ok(())
    }

    /// Reads four hex digits at `self.pos`; `esc` is the escape's offset.
    fn hex4(&mut self, esc: usize) -> ParseResult<u32> {
        let Some(digits) = self.bytes.get(self.pos..self.pos + 4) else {
            return Err(self.invalid(esc, "invalid \\u escape"));
        };
        let mut v = 0u32;
        for &d in digits {
            let x = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.invalid(esc, "invalid \\u escape")),
            };
            v = (v << 4) | u32::from(x);
        }
        self.pos += 4;
        Ok(v)
    }

    fn skip_digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn parse_number(&mut self) -> ParseResult<Number> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.invalid(start, "leading zero in number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.skip_digits();
            }
            _ => return Err(self.invalid(self.pos, "expected digit")),
        }
        let int_end = self.pos;
        let mut is_float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.skip_digits() == 0 {
                return Err(self.invalid(self.pos, "expected digit after '.'"));
            }
            is_float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.skip_digits() == 0 {
                return Err(self.invalid(self.pos, "expected digit in exponent"));
            }
            is_float = true;
        }
        let out_of_range = |detail: &'static str| {
            Box::new(CanonicalError::new(
                ErrorKind::NumberOutOfRange,
                start,
                detail,
            ))
        };
        if is_float {
            let f: f64 = self.src[start..self.pos]
                .parse()
                .map_err(|_| self.invalid(start, "invalid number"))?;
            if !f.is_finite() {
                return Err(out_of_range("number overflows a double"));
            }
            return Ok(Number::Float(f));
        }
        let int_digits = &self.bytes[int_start..int_end];
        // Up to 18 digits always fits (and stays inside the range): no
        // overflow checks and no 128-bit multiplies.
        if int_digits.len() <= 18 {
            let magnitude = int_digits
                .iter()
                .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
            let v = i128::from(magnitude);
            return Ok(Number::Int(if negative { -v } else { v }));
        }
        let mut magnitude: u128 = 0;
        for &d in int_digits {
            magnitude = magnitude
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(d - b'0')))
                .ok_or_else(|| out_of_range("integer outside [-2^63, 2^64-1]"))?;
        }
        let limit = if negative {
            1u128 << 63
        } else {
            u128::from(u64::MAX)
        };
        if magnitude > limit {
            return Err(out_of_range("integer outside [-2^63, 2^64-1]"));
        }
        let v = i128::try_from(magnitude)
            .map_err(|_| out_of_range("integer outside [-2^63, 2^64-1]"))?;
        Ok(Number::Int(if negative { -v } else { v }))
    }
}

/// Code-point order of two keys (== byte order). Keys mostly differ in
/// their first byte, which is decided here without a `memcmp` call.
#[inline]
fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.as_bytes().first(), b.as_bytes().first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ => a.cmp(b),
    }
}

/// Offset of the first `"`, `\\` or control byte (< 0x20) in `bytes`.
#[inline]
fn find_string_special(bytes: &[u8]) -> Option<usize> {
    first_flagged::<false>(bytes)
}

/// Offset of the first `"`, `\\` or control byte (< 0x20) in `bytes`, and
/// with `NON_ASCII` of the first byte >= 0x7f too (the first byte that is
/// not [`is_plain`]).
///
/// Scans eight bytes per step (SWAR): for each word, the classic
/// "has zero byte" bit trick flags bytes equal to `"`, `\\` (or 0x7f) and
/// bytes below 0x20 (the word's own high bits flag bytes >= 0x80). The
/// lowest flagged byte is always exact (borrows only propagate upwards, past
/// a true match), so it is the answer.
#[inline]
fn first_flagged<const NON_ASCII: bool>(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let equal = |word: u64, byte: u8| {
        let diff = word ^ (ONES * u64::from(byte));
        diff.wrapping_sub(ONES) & !diff
    };
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let mut flags =
            equal(word, b'"') | equal(word, b'\\') | (word.wrapping_sub(ONES * 0x20) & !word);
        if NON_ASCII {
            flags |= equal(word, 0x7f) | word;
        }
        let flags = flags & HIGHS;
        if flags != 0 {
            return Some(offset + (flags.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| {
            if NON_ASCII {
                !is_plain(b)
            } else {
                b == b'"' || b == b'\\' || b < 0x20
            }
        })
        .map(|n| offset + n)
}

fn lone_surrogate(offset: usize) -> Box<CanonicalError> {
    Box::new(CanonicalError::new(
        ErrorKind::LoneSurrogate,
        offset,
        "lone utf-16 surrogate",
    ))
}

fn duplicate_error(offset: usize, key: &str) -> Box<CanonicalError> {
    const MAX: usize = 40;
    let mut quoted = String::new();
    write_string(key, &mut quoted);
    if quoted.len() > MAX {
        // Escaped output is pure ASCII, so any byte index is a char boundary.
        quoted.truncate(MAX - 3);
        quoted.push_str("...");
    }
    Box::new(CanonicalError::new(
        ErrorKind::DuplicateKey,
        offset,
        format!("duplicate key {quoted}"),
    ))
}

// ---------------------------------------------------------------------------
// Printer
// ---------------------------------------------------------------------------

/// Destination of canonical output: a `String` or a streaming hasher.
trait Sink {
    fn put(&mut self, s: &str);

    /// One ASCII byte (punctuation such as `{`, `,`, `:`).
    fn put_ascii(&mut self, b: u8);
}

impl Sink for String {
    #[inline]
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }

    #[inline]
    fn put_ascii(&mut self, b: u8) {
        self.push(char::from(b));
    }
}

/// Bytes collected before one `Sha256::update`: a multiple of the 64-byte
/// block, so full buffers compress without further copying in the hasher.
const HASH_BUF_LEN: usize = 256;

/// Streams canonical text into SHA-256 through a stack buffer: the printer
/// emits many tiny pieces, and batching them costs one copy instead of one
/// `update` call (with its own buffering logic) per piece.
struct HashSink {
    hasher: Sha256,
    buf: [u8; HASH_BUF_LEN],
    len: usize,
}

impl HashSink {
    fn new() -> Self {
        HashSink {
            hasher: Sha256::new(),
            buf: [0; HASH_BUF_LEN],
            len: 0,
        }
    }

    #[inline]
    fn put_bytes(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(room) = self.buf.get_mut(self.len..end) {
            copy_short(room, bytes);
            self.len = end;
        } else {
            self.spill(bytes);
        }
    }

    /// Flushes the buffer and takes `bytes`, which did not fit.
    #[cold]
    fn spill(&mut self, bytes: &[u8]) {
        self.hasher.update(&self.buf[..self.len]);
        self.len = 0;
        if bytes.len() >= HASH_BUF_LEN {
            self.hasher.update(bytes);
        } else {
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        }
    }

    fn finish(mut self) -> Fingerprint {
        self.hasher.update(&self.buf[..self.len]);
        Fingerprint(self.hasher.finalize().into())
    }
}

/// `dst.copy_from_slice(src)` for the short pieces the printer emits, with
/// fixed-size (overlapping) moves instead of a `memcpy` call.
#[inline]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(n, dst.len());
    match n {
        0 => {}
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..].copy_from_slice(&src[n - 4..]);
        }
        8..=16 => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        }
        _ => dst.copy_from_slice(src),
    }
}

impl Sink for HashSink {
    #[inline]
    fn put(&mut self, s: &str) {
        self.put_bytes(s.as_bytes());
    }

    #[inline]
    fn put_ascii(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        } else {
            self.spill(&[b]);
        }
    }
}

/// Appends the canonical form of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut String) {
    write_value(value, out);
}

/// The canonical form of `value`.
pub fn to_canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value<S: Sink>(value: &Value, out: &mut S) {
    match value {
        Value::Null => out.put("null"),
        Value::Bool(true) => out.put("true"),
        Value::Bool(false) => out.put("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.put_ascii(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put_ascii(b',');
                }
                write_value(item, out);
            }
            out.put_ascii(b']');
        }
        Value::Object(obj) => write_object(obj, out),
    }
}

fn write_object<S: Sink>(obj: &Object, out: &mut S) {
    out.put_ascii(b'{');
    for (i, (k, v)) in obj.members.iter().enumerate() {
        if i > 0 {
            out.put_ascii(b',');
        }
        write_string(k, out);
        out.put_ascii(b':');
        write_value(v, out);
    }
    out.put_ascii(b'}');
}

/// `true` for bytes printed verbatim inside a canonical string.
#[inline]
fn is_plain(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

fn write_string<S: Sink>(s: &str, out: &mut S) {
    out.put_ascii(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    loop {
        let i = run + plain_prefix_len(&bytes[run..]);
        let Some(&b) = bytes.get(i) else {
            break;
        };
        // `run` and `i` are char boundaries: plain bytes are ASCII and
        // non-ASCII chars are skipped whole below.
        out.put(&s[run..i]);
        if b < 0x80 {
            match b {
                b'"' => out.put("\\\""),
                b'\\' => out.put("\\\\"),
                b'\n' => out.put("\\n"),
                b'\r' => out.put("\\r"),
                b'\t' => out.put("\\t"),
                0x08 => out.put("\\b"),
                0x0c => out.put("\\f"),
                _ => put_unit(u32::from(b), out),
            }
            run = i + 1;
        } else {
            let Some(ch) = s[i..].chars().next() else {
                break;
            };
            let c = u32::from(ch);
            if c >= 0x10000 {
                let v = c - 0x10000;
                put_unit(0xD800 + (v >> 10), out);
                put_unit(0xDC00 + (v & 0x3FF), out);
            } else {
                put_unit(c, out);
            }
            run = i + ch.len_utf8();
        }
    }
    out.put(&s[run..]);
    out.put_ascii(b'"');
}

/// Length of the leading run of [`is_plain`] bytes.
#[inline]
fn plain_prefix_len(bytes: &[u8]) -> usize {
    first_flagged::<true>(bytes).unwrap_or(bytes.len())
}

/// Writes `\uXXXX` with lowercase hex for a UTF-16 code unit.
fn put_unit<S: Sink>(unit: u32, out: &mut S) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let nib = |shift: u32| HEX[((unit >> shift) & 0xF) as usize];
    let buf = [b'\\', b'u', nib(12), nib(8), nib(4), nib(0)];
    if let Ok(s) = std::str::from_utf8(&buf) {
        out.put(s);
    }
}

/// Small fixed-capacity text buffer so number formatting never allocates.
struct StackBuf {
    buf: [u8; 48],
    len: usize,
}

impl StackBuf {
    fn new() -> Self {
        StackBuf {
            buf: [0; 48],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }

    fn push(&mut self, b: u8) {
        if self.len < self.buf.len() {
            self.buf[self.len] = b;
            self.len += 1;
        }
    }

    fn extend(&mut self, bytes: &[u8]) {
        // Like pushing byte by byte: whatever does not fit is dropped.
        let take = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + take].copy_from_slice(&bytes[..take]);
        self.len += take;
    }
}

impl fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn write_number<S: Sink>(n: &Number, out: &mut S) {
    let mut buf = StackBuf::new();
    match *n {
        Number::Int(i) => match u64::try_from(i.unsigned_abs()) {
            Ok(magnitude) => {
                if i < 0 {
                    buf.push(b'-');
                }
                push_decimal(magnitude, &mut buf);
            }
            // Outside the parser's range (hand-built value). An i128 needs
            // at most 40 bytes; cannot fail.
            Err(_) => {
                let _ = write!(buf, "{i}");
            }
        },
        Number::Float(f) => format_float(f, &mut buf),
    }
    out.put(buf.as_str());
}

/// Appends the decimal digits of `value` (no `fmt` machinery).
fn push_decimal(mut value: u64, out: &mut StackBuf) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend(&digits[start..]);
}

/// Lays out `f` exactly like Python's `repr(float)`: shortest round-trip
/// digits; fixed notation when the decimal exponent is in -4..=15 (with `.0`
/// when integral), otherwise `d[.ddd]e±XX`.
fn format_float(f: f64, out: &mut StackBuf) {
    if !f.is_finite() {
        // Unreachable for parsed values; keep output valid-ish for hand-built ones.
        out.extend(if f.is_nan() {
            b"NaN"
        } else if f > 0.0 {
            b"Infinity"
        } else {
            b"-Infinity"
        });
        return;
    }
    // `{:e}` yields the shortest round-trip digits, e.g. "-1.2345e-7", "0e0".
    let mut sci = StackBuf::new();
    if write!(sci, "{f:e}").is_err() {
        return;
    }
    let text = &sci.buf[..sci.len];
    let mut digits = [0u8; 24];
    let mut n = 0;
    let mut exp: i32 = 0;
    let mut exp_negative = false;
    let mut in_exp = false;
    for &b in text {
        match b {
            b'e' => in_exp = true,
            b'-' if in_exp => exp_negative = true,
            b'0'..=b'9' if in_exp => exp = exp * 10 + i32::from(b - b'0'),
            b'0'..=b'9' if n < digits.len() => {
                digits[n] = b;
                n += 1;
            }
            _ => {} // sign of the mantissa, '.', (impossible) excess digits
        }
    }
    if exp_negative {
        exp = -exp;
    }
    let n = break_tie_to_even(f, &mut digits, n, exp);
    let digits = &digits[..n];
    if f.is_sign_negative() {
        out.push(b'-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.extend(digits);
                for _ in digits.len()..int_len {
                    out.push(b'0');
                }
                out.extend(b".0");
            } else {
                out.extend(&digits[..int_len]);
                out.push(b'.');
                out.extend(&digits[int_len..]);
            }
        } else {
            out.extend(b"0.");
            for _ in 0..(-exp - 1) {
                out.push(b'0');
            }
            out.extend(digits);
        }
    } else {
        out.extend(&digits[..1]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push(b'0');
        }
        let _ = write!(out, "{e}");
    }
}

/// Python's `repr` (David Gay's dtoa, mode 0) breaks exact ties between two
/// equally short, equally close digit strings to the even one; Rust's shortest
/// formatter rounds such ties up (e.g. 111275153569243.125: Python `...243.12`,
/// Rust `...243.13`). Detects that case exactly and switches to the even
/// neighbour when it also round-trips. Returns the (possibly new) digit count.
fn break_tie_to_even(f: f64, digits: &mut [u8; 24], n: usize, exp: i32) -> usize {
    if n == 0 || n > 17 || (digits[n - 1] - b'0').is_multiple_of(2) {
        return n;
    }
    // |f| = m * 2^k exactly, with m odd.
    let bits = f.abs().to_bits();
    let biased = i32::try_from(bits >> 52).unwrap_or(0);
    let fraction = bits & ((1u64 << 52) - 1);
    let (mut m, mut k) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1u64 << 52), biased - 1075)
    };
    if m == 0 {
        return n;
    }
    let tz = m.trailing_zeros();
    m >>= tz;
    k += tz as i32;
    // A tie needs the exact value to have n+1 <= 18 significant digits ending
    // in 5, i.e. |f| = N * 10^k with N = m * 5^-k odd; only -25 <= k < 0 can
    // give that. The last digit of `digits` has place value 10^(exp-n+1).
    if !(-30..0).contains(&k) || k != exp - n as i32 {
        return n;
    }
    let exact = u128::from(m) * 5u128.pow(k.unsigned_abs());
    let shown = digits[..n]
        .iter()
        .fold(0u128, |acc, &d| acc * 10 + u128::from(d - b'0'));
    let alternative = if exact + 5 == shown * 10 {
        shown - 1
    } else if exact == shown * 10 + 5 {
        shown + 1
    } else {
        return n;
    };
    let mut text = StackBuf::new();
    if write!(text, "{alternative}e{}", exp - n as i32 + 1).is_err() {
        return n;
    }
    let alt_len = text.as_str().find('e').unwrap_or(0);
    let alt_digits = &text.buf[..alt_len];
    if alt_digits.len() != n || text.as_str().parse::<f64>() != Ok(f.abs()) {
        return n;
    }
    digits[..n].copy_from_slice(alt_digits);
    let mut n = n;
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    n
}

// ---------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------

/// SHA-256 of the canonical form, streamed into the hasher (no intermediate String).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Lowercase hex (64 chars).
    pub fn to_hex(&self) -> String {
        self.hex_buf().as_str().to_owned()
    }

    /// Lowercase hex in a stack buffer: no allocation, one `write_str`.
    fn hex_buf(&self) -> HexBuf {
        let mut digits = [0u8; 64];
        for (pair, byte) in digits.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX_DIGITS[usize::from(byte >> 4)];
            pair[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
        }
        HexBuf(digits)
    }

    /// SHA-256 of arbitrary bytes (e.g. an already canonical text).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// Parses exactly 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Fingerprint(out))
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

struct HexBuf([u8; 64]);

impl HexBuf {
    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex_buf().as_str())
    }
}

/// Fingerprints an object whose members the caller supplies one by one, in
/// sorted key order, without building it: the canonical text goes straight
/// into the hasher. Used for the proposal envelope on every call.
pub struct ObjectHasher {
    sink: HashSink,
    members: usize,
    #[cfg(debug_assertions)]
    last_key: String,
}

impl Default for ObjectHasher {
    fn default() -> Self {
        ObjectHasher::new()
    }
}

impl ObjectHasher {
    pub fn new() -> Self {
        let mut sink = HashSink::new();
        sink.put_ascii(b'{');
        ObjectHasher {
            sink,
            members: 0,
            #[cfg(debug_assertions)]
            last_key: String::new(),
        }
    }

    fn key(&mut self, key: &str) {
        #[cfg(debug_assertions)]
        {
            debug_assert!(
                self.members == 0 || self.last_key.as_str() < key,
                "members must come in sorted key order"
            );
            self.last_key = key.to_string();
        }
        if self.members > 0 {
            self.sink.put_ascii(b',');
        }
        self.members += 1;
        write_string(key, &mut self.sink);
        self.sink.put_ascii(b':');
    }

    pub fn member(&mut self, key: &str, value: &Value) {
        self.key(key);
        write_value(value, &mut self.sink);
    }

    pub fn member_object(&mut self, key: &str, object: &Object) {
        self.key(key);
        write_object(object, &mut self.sink);
    }

    pub fn member_str(&mut self, key: &str, text: &str) {
        self.key(key);
        write_string(text, &mut self.sink);
    }

    pub fn member_u64(&mut self, key: &str, number: u64) {
        self.key(key);
        write_number(&Number::Int(i128::from(number)), &mut self.sink);
    }

    pub fn finish(mut self) -> Fingerprint {
        self.sink.put_ascii(b'}');
        self.sink.finish()
    }
}

/// SHA-256 of the canonical form of `value`.
pub fn fingerprint(value: &Value) -> Fingerprint {
    let mut sink = HashSink::new();
    write_value(value, &mut sink);
    sink.finish()
}

// ---------------------------------------------------------------------------
// Conveniences
// ---------------------------------------------------------------------------

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Any number as a double (large integers are rounded).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(Number::Int(i)) => Some(*i as f64),
            Value::Number(Number::Float(f)) => Some(*f),
            _ => None,
        }
    }

    /// An integer (not a float) that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(Number::Int(i)) => i64::try_from(*i).ok(),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// JSON type name: "null", "boolean", "number", "string", "array", "object".
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Number(Number::Int(i128::from(i)))
    }
}

impl From<u64> for Value {
    fn from(u: u64) -> Self {
        Value::Number(Number::Int(i128::from(u)))
    }
}

impl From<Object> for Value {
    fn from(o: Object) -> Self {
        Value::Object(o)
    }
}

impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Self {
        Value::Array(items)
    }
}

/// An object as a serde_json object (for JSON Schema validation), without
/// cloning it into a `Value` first.
pub fn object_to_serde_json(object: &Object) -> serde_json::Value {
    serde_json::Value::Object(
        object
            .members
            .iter()
            .map(|(key, value)| (key.clone(), to_serde_json(value)))
            .collect(),
    )
}

/// For JSON Schema validation by another crate: exact conversion (Int -> serde_json integer, Float -> f64 number).
pub fn to_serde_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Number(Number::Int(i)) => {
            if let Ok(v) = i64::try_from(*i) {
                J::from(v)
            } else if let Ok(v) = u64::try_from(*i) {
                J::from(v)
            } else {
                // Outside the documented invariant (hand-built value).
                serde_json::Number::from_f64(*i as f64).map_or(J::Null, J::Number)
            }
        }
        Value::Number(Number::Float(f)) => {
            serde_json::Number::from_f64(*f).map_or(J::Null, J::Number)
        }
        Value::String(s) => J::String(s.clone()),
        Value::Array(items) => J::Array(items.iter().map(to_serde_json).collect()),
        Value::Object(obj) => J::Object(
            obj.iter()
                .map(|(k, v)| (k.to_owned(), to_serde_json(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        match canonicalize(s.as_bytes()) {
            Ok(c) => c,
            Err(e) => panic!("{s:?} rejected: {e}"),
        }
    }

    fn err(s: &[u8]) -> (ErrorKind, usize) {
        match parse(s) {
            Ok(v) => panic!("{s:?} accepted as {v:?}"),
            Err(e) => (e.kind, e.offset),
        }
    }

    fn float(f: f64) -> String {
        to_canonical(&Value::Number(Number::Float(f)))
    }

    #[test]
    fn scalars() {
        assert_eq!(canon("null"), "null");
        assert_eq!(canon(" true "), "true");
        assert_eq!(canon("\t\r\nfalse\n"), "false");
        assert_eq!(canon("-0"), "0");
        assert_eq!(canon("-7"), "-7");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
        assert_eq!(canon("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(parse_str("-0").ok(), Some(Value::Number(Number::Int(0))));
        let neg_zero = parse_str("-0.0").ok().and_then(|v| v.as_f64());
        assert!(neg_zero.is_some_and(|f| f == 0.0 && f.is_sign_negative()));
    }

    #[test]
    fn float_layout() {
        let cases: &[(f64, &str)] = &[
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.00012345, "0.00012345"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            (123456789.0, "123456789.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1e22, "1e+22"),
            (9007199254740992.0, "9007199254740992.0"),
            (2f64.powi(60), "1.152921504606847e+18"),
            (15000.0, "15000.0"),
            (1.5e-7, "1.5e-07"),
            (-1.5e300, "-1.5e+300"),
            (0.1, "0.1"),
            (0.30000000000000004, "0.30000000000000004"),
            (1234567890123456.8, "1234567890123456.8"),
            (2.5, "2.5"),
            (1e100, "1e+100"),
            (1e23, "1e+23"),
            (-1e-100, "-1e-100"),
        ];
        for &(f, want) in cases {
            assert_eq!(float(f), want, "{f:e}");
        }
        // Exact ties between two equally short candidates: Python picks the
        // even one, Rust's `{:e}` rounds up.
        assert_eq!(canon("111275153569243.125"), "111275153569243.12");
        assert_eq!(canon("111275153569243.375"), "111275153569243.38");
        assert_eq!(canon("111275153569243.625"), "111275153569243.62");
        assert_eq!(canon("-1997107851181081.25"), "-1997107851181081.2");
        assert_eq!(canon("1997107851181081.75"), "1997107851181081.8");
        assert_eq!(canon("9007199254740993.0"), "9007199254740992.0");
        assert_eq!(canon("1e2"), "100.0");
        assert_eq!(canon("1E+2"), "100.0");
        assert_eq!(canon("100.0e-2"), "1.0");
        assert_eq!(canon("1e-400"), "0.0");
        assert_eq!(canon("-1e-400"), "-0.0");
    }

    #[test]
    fn strings() {
        assert_eq!(canon(r#""a/b\/c""#), r#""a/b/c""#);
        assert_eq!(canon(r#""\n\r\t\b\f\"\\""#), r#""\n\r\t\b\f\"\\""#);
        assert_eq!(canon(r#""\u0000\u001F\u007f""#), r#""\u0000\u001f\u007f""#);
        assert_eq!(canon("\"caf\u{e9}\""), r#""caf\u00e9""#);
        assert_eq!(canon("\"\u{1F600}\""), r#""\ud83d\ude00""#);
        assert_eq!(canon(r#""\uD83D\uDE00""#), r#""\ud83d\ude00""#);
        assert_eq!(canon("\"e\u{301}\""), r#""e\u0301""#);
        assert_eq!(canon("\"\u{7f}\u{80}\u{ffff}\""), r#""\u007f\u0080\uffff""#);
        assert_eq!(canon("\"\u{10FFFF}\""), r#""\udbff\udfff""#);
        assert_eq!(canon(r#""""#), r#""""#);
        let v = parse_str(r#""x\u00e9\ud83d\ude00y""#).ok();
        assert_eq!(
            v.as_ref().and_then(Value::as_str),
            Some("x\u{e9}\u{1F600}y")
        );
    }

    #[test]
    fn containers_sorted() {
        assert_eq!(canon(r#"{"b":1,"a":2}"#), r#"{"a":2,"b":1}"#);
        assert_eq!(
            canon("{\"\u{e9}\":1,\"e\":2,\"z\":3,\"Z\":4}"),
            r#"{"Z":4,"e":2,"z":3,"\u00e9":1}"#
        );
        // Code-point order, not UTF-16 order: U+FFFF sorts before U+1F600.
        assert_eq!(
            canon("{\"\u{1F600}\":2,\"\u{ffff}\":1}"),
            r#"{"\uffff":1,"\ud83d\ude00":2}"#
        );
        assert_eq!(canon(" [ 1 , [ ] , { } ] "), "[1,[],{}]");
        assert_eq!(canon(r#"{"":0," ":1}"#), r#"{"":0," ":1}"#);
    }

    #[test]
    fn error_kinds_and_offsets() {
        use ErrorKind::*;
        assert_eq!(err(b""), (InvalidJson, 0));
        assert_eq!(err(b"   "), (InvalidJson, 3));
        assert_eq!(err(b"NaN"), (InvalidJson, 0));
        assert_eq!(err(b"Infinity"), (InvalidJson, 0));
        assert_eq!(err(b"-Infinity"), (InvalidJson, 1));
        assert_eq!(err(b"[1,]"), (InvalidJson, 3));
        assert_eq!(err(br#"{"a":1,}"#), (InvalidJson, 7));
        assert_eq!(err(b"{'a':1}"), (InvalidJson, 1));
        assert_eq!(err(br#"{"a":1} x"#), (InvalidJson, 8));
        assert_eq!(err(b"01"), (InvalidJson, 0));
        assert_eq!(err(b"-01"), (InvalidJson, 0));
        assert_eq!(err(b"1."), (InvalidJson, 2));
        assert_eq!(err(b".5"), (InvalidJson, 0));
        assert_eq!(err(b"+1"), (InvalidJson, 0));
        assert_eq!(err(b"1e"), (InvalidJson, 2));
        assert_eq!(err(b"1e+"), (InvalidJson, 3));
        assert_eq!(err(b"tru"), (InvalidJson, 0));
        assert_eq!(err(b"nulll"), (InvalidJson, 4));
        assert_eq!(err(b"[1 2]"), (InvalidJson, 3));
        assert_eq!(err(br#"{"a" 1}"#), (InvalidJson, 5));
        assert_eq!(err(b"\"a\x01\""), (InvalidJson, 2));
        assert_eq!(err(b"\"a\nb\""), (InvalidJson, 2));
        assert_eq!(err(br#""\x""#), (InvalidJson, 1));
        assert_eq!(err(br#""\u12G4""#), (InvalidJson, 1));
        assert_eq!(err(br#""abc"#), (InvalidJson, 0));
        assert_eq!(err(b"\"\\"), (InvalidJson, 1));
        assert_eq!(err(b"[1,\x0c2]"), (InvalidJson, 3));
        assert_eq!(err("\u{a0}1".as_bytes()), (InvalidJson, 0));
        assert_eq!(err(b"\"\xff\""), (InvalidUtf8, 1));
        assert_eq!(err(b"[\"ok\", \"\xc3\"]"), (InvalidUtf8, 8));
        assert_eq!(err(br#"{"a":1,"a":2}"#), (DuplicateKey, 7));
        assert_eq!(err(br#"{"x":{"a":1,"a":1}}"#), (DuplicateKey, 12));
        // Unsorted object: the first repeated key in document order.
        assert_eq!(
            err(br#"{"b":1,"a":2,"b":3,"c":4,"c":5}"#),
            (DuplicateKey, 13)
        );
        assert_eq!(err(br#""\ud800""#), (LoneSurrogate, 1));
        assert_eq!(err(br#""ab\udc00x""#), (LoneSurrogate, 3));
        assert_eq!(err(br#""\ud800\u0041""#), (LoneSurrogate, 1));
        assert_eq!(err(br#""\ud800\ud800""#), (LoneSurrogate, 1));
        assert_eq!(err(br#""\ud800\n""#), (LoneSurrogate, 1));
        assert_eq!(err(b"1e400"), (NumberOutOfRange, 0));
        assert_eq!(err(b"[-1e400]"), (NumberOutOfRange, 1));
        assert_eq!(err(b"18446744073709551616"), (NumberOutOfRange, 0));
        assert_eq!(err(b"-9223372036854775809"), (NumberOutOfRange, 0));
        assert_eq!(err(&[b'9'; 200]), (NumberOutOfRange, 0));
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse_str(&deep(64)).is_ok());
        assert_eq!(err(deep(65).as_bytes()), (TooDeep, 64));
        let deep_obj = format!("{}1{}", r#"{"a":"#.repeat(65), "}".repeat(65));
        assert_eq!(err(deep_obj.as_bytes()), (TooDeep, 5 * 64));
        // Huge nesting is rejected without recursing further.
        assert_eq!(err("[".repeat(100_000).as_bytes()), (TooDeep, 64));
    }

    #[test]
    fn error_display() {
        let e = parse(br#"{"a":1,"a":2}"#).err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some(r#"duplicate-key at byte 7: duplicate key "a""#)
        );
        let long = format!(r#"{{"{k}":1,"{k}":2}}"#, k = "\u{e9}".repeat(100));
        let msg = parse_str(&long).err().map(|e| e.detail).unwrap_or_default();
        assert!(msg.len() <= 60 && msg.ends_with("..."), "{msg}");
        let e = parse(b"[1,]").err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("invalid-json at byte 3: expected a json value")
        );
        for kind in [
            ErrorKind::InvalidJson,
            ErrorKind::InvalidUtf8,
            ErrorKind::DuplicateKey,
            ErrorKind::LoneSurrogate,
            ErrorKind::NumberOutOfRange,
            ErrorKind::TooDeep,
        ] {
            assert_eq!(kind.to_string(), kind.as_str());
        }
    }

    #[test]
    fn object_api() {
        let mut o = Object::new();
        assert!(o.is_empty());
        assert_eq!(o.insert("b", Value::from(1i64)), None);
        assert_eq!(o.insert("a", Value::from(true)), None);
        assert_eq!(o.insert(String::from("c"), Value::Null), None);
        assert_eq!(o.insert("b", Value::from("x")), Some(Value::from(1i64)));
        assert_eq!(o.len(), 3);
        assert_eq!(o.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(o.get("b").and_then(Value::as_str), Some("x"));
        assert_eq!(o.get("zz"), None);
        assert_eq!(o.remove("a"), Some(Value::Bool(true)));
        assert_eq!(o.remove("a"), None);
        let pairs: Vec<_> = o.iter().map(|(k, v)| (k.to_owned(), v.clone())).collect();
        assert_eq!(pairs.len(), 2);
        let v = Value::Object(o.clone());
        assert_eq!(to_canonical(&v), r#"{"b":"x","c":null}"#);

        let collected: Object = vec![
            ("z".to_owned(), Value::from(1u64)),
            ("a".to_owned(), Value::from(2u64)),
            ("z".to_owned(), Value::from(3u64)),
            ("z".to_owned(), Value::from(4u64)),
        ]
        .into_iter()
        .collect();
        assert_eq!(to_canonical(&Value::Object(collected)), r#"{"a":2,"z":4}"#);
    }

    #[test]
    fn value_helpers() {
        assert_eq!(Value::Null.kind_name(), "null");
        assert_eq!(Value::from(false).kind_name(), "boolean");
        assert_eq!(Value::from(u64::MAX).kind_name(), "number");
        assert_eq!(Value::from("s").kind_name(), "string");
        assert_eq!(Value::Array(vec![]).kind_name(), "array");
        assert_eq!(Value::Object(Object::new()).kind_name(), "object");
        assert_eq!(Value::from(3i64).as_f64(), Some(3.0));
        assert_eq!(Value::from(-3i64).as_i64(), Some(-3));
        assert_eq!(Value::from(u64::MAX).as_i64(), None);
        assert_eq!(Value::from(true).as_bool(), Some(true));
        let arr = parse_str("[1,2]").ok();
        assert_eq!(
            arr.as_ref().and_then(Value::as_array).map(<[Value]>::len),
            Some(2)
        );
        assert_eq!(to_canonical(&Value::from(i64::MIN)), "-9223372036854775808");
        assert_eq!(to_canonical(&Value::from(u64::MAX)), "18446744073709551615");
        let mut s = String::from("x=");
        write_canonical(&Value::from("\u{1}"), &mut s);
        assert_eq!(s, r#"x="\u0001""#);
    }

    #[test]
    fn fingerprints() {
        let v = parse_str(r#"{"b":1,"a":2}"#).ok().unwrap_or(Value::Null);
        let fp = fingerprint(&v);
        assert_eq!(
            fp.to_hex(),
            "d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772"
        );
        assert_eq!(fp, Fingerprint::of_bytes(to_canonical(&v).as_bytes()));
        assert_eq!(fp.to_string(), fp.to_hex());
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        assert_eq!(Fingerprint::from_hex(&fp.to_hex().to_uppercase()), Some(fp));
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()[..63]), None);
        assert_eq!(Fingerprint::from_hex(&format!("{}0", fp.to_hex())), None);
        assert_eq!(Fingerprint::from_hex(&"g".repeat(64)), None);
        assert_eq!(
            fingerprint(&Value::Object(Object::new())).to_hex(),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn serde_json_conversion() {
        let v = parse_str(
            r#"{"i":-9223372036854775808,"u":18446744073709551615,"f":15000.0,"z":-0.0,"s":"\u00e9","a":[null,true]}"#,
        )
        .ok()
        .unwrap_or(Value::Null);
        let j = to_serde_json(&v);
        assert_eq!(j["i"].as_i64(), Some(i64::MIN));
        assert_eq!(j["u"].as_u64(), Some(u64::MAX));
        assert!(j["f"].is_f64());
        assert_eq!(j["f"].as_f64(), Some(15000.0));
        assert!(j["z"].as_f64().is_some_and(|f| f.is_sign_negative()));
        assert_eq!(j["s"], serde_json::json!("\u{e9}"));
        assert_eq!(j["a"], serde_json::json!([null, true]));
        assert!(to_serde_json(&Value::from(5i64)).is_i64());
    }

    #[test]
    fn canonical_is_fixpoint() {
        let inputs = [
            r#"{"b":{"d":1,"c":[3,2,1]},"a":null,"\u00e9":"\ud83d\ude00\u0000"}"#,
            "[1.5e-7,1e16,-0.0,0,123456789012345678]",
        ];
        for input in inputs {
            let once = canon(input);
            assert_eq!(canon(&once), once);
        }
    }

    #[test]
    fn word_scans_match_bytewise_scans() {
        // Every byte value at every position of a 19-byte buffer (two full
        // words plus a tail), over a background of plain ASCII.
        for special in 0..=255u8 {
            for at in 0..19 {
                let mut bytes = [b'a'; 19];
                bytes[at] = special;
                for start in 0..bytes.len() {
                    let slice = &bytes[start..];
                    assert_eq!(
                        find_string_special(slice),
                        slice
                            .iter()
                            .position(|&b| b == b'"' || b == b'\\' || b < 0x20),
                        "find_string_special byte {special:#x} at {at} from {start}"
                    );
                    assert_eq!(
                        plain_prefix_len(slice),
                        slice
                            .iter()
                            .position(|&b| !is_plain(b))
                            .unwrap_or(slice.len()),
                        "plain_prefix_len byte {special:#x} at {at} from {start}"
                    );
                }
            }
        }
    }

    #[test]
    fn hash_sink_matches_one_shot_digest() {
        // Longer than the sink's buffer, with pieces straddling its end.
        let long = "x".repeat(3 * HASH_BUF_LEN + 7);
        let value = parse_str(&format!(
            r#"{{"a":"{long}","b":[1,2.5,"\u00e9\ud83d\ude00",null,true],"c":{{"d":"{long}"}}}}"#
        ))
        .unwrap_or(Value::Null);
        assert_ne!(value, Value::Null);
        let text = to_canonical(&value);
        assert_eq!(fingerprint(&value), Fingerprint::of_bytes(text.as_bytes()));
    }
}
