//! The strict parser (SPEC §1): bytes to [`Value`], or the first offset that breaks a rule.

use super::print::{is_plain, write_string};
use super::*;

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
pub(super) type ParseResult<T> = Result<T, Box<CanonicalError>>;

pub(super) struct Parser<'a> {
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

    /// A number: `-`? integer part, fraction?, exponent?. With a fraction
    /// or an exponent it is a double (finite); otherwise an integer in
    /// [-2^63, 2^64-1]. The steps are `#[inline]`: numbers are parsed
    /// inside the container loops.
    fn parse_number(&mut self) -> ParseResult<Number> {
        let start = self.pos;
        let negative = self.scan_sign();
        let int_start = self.pos;
        self.scan_integer_part(start)?;
        let int_end = self.pos;
        let has_fraction = self.scan_fraction()?;
        let has_exponent = self.scan_exponent()?;
        if has_fraction || has_exponent {
            return self.float_value(start);
        }
        int_value(&self.bytes[int_start..int_end], negative, start)
    }

    /// An optional `-`; whether there was one.
    #[inline]
    fn scan_sign(&mut self) -> bool {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        negative
    }

    /// `0`, or a digit 1-9 and more digits: no leading zero. `start` is
    /// where the number (its sign) starts.
    #[inline]
    fn scan_integer_part(&mut self, start: usize) -> ParseResult<()> {
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
        Ok(())
    }

    /// An optional `.` and at least one digit; whether there was one.
    #[inline]
    fn scan_fraction(&mut self) -> ParseResult<bool> {
        if self.peek() != Some(b'.') {
            return Ok(false);
        }
        self.pos += 1;
        if self.skip_digits() == 0 {
            return Err(self.invalid(self.pos, "expected digit after '.'"));
        }
        Ok(true)
    }

    /// An optional `e`/`E`, sign, and at least one digit; whether there was one.
    #[inline]
    fn scan_exponent(&mut self) -> ParseResult<bool> {
        let Some(b'e' | b'E') = self.peek() else {
            return Ok(false);
        };
        self.pos += 1;
        if let Some(b'+' | b'-') = self.peek() {
            self.pos += 1;
        }
        if self.skip_digits() == 0 {
            return Err(self.invalid(self.pos, "expected digit in exponent"));
        }
        Ok(true)
    }

    /// The double the text from `start` to here denotes; it must be finite.
    #[inline]
    fn float_value(&self, start: usize) -> ParseResult<Number> {
        let f: f64 = self.src[start..self.pos]
            .parse()
            .map_err(|_| self.invalid(start, "invalid number"))?;
        if !f.is_finite() {
            return Err(out_of_range(start, "number overflows a double"));
        }
        Ok(Number::Float(f))
    }
}

/// The integer `digits` (no sign, no leading zero) denote, negated when
/// `negative`; `start` is where the number starts, for the error.
#[inline]
fn int_value(digits: &[u8], negative: bool, start: usize) -> ParseResult<Number> {
    // Up to 18 digits always fits (and stays inside the range): no
    // overflow checks and no 128-bit multiplies.
    if digits.len() <= 18 {
        let magnitude = digits
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
        let v = i128::from(magnitude);
        return Ok(Number::Int(if negative { -v } else { v }));
    }
    wide_int_value(digits, negative, start)
}

/// [`int_value`] for 19 digits or more: checked, in [-2^63, 2^64-1].
#[inline]
fn wide_int_value(digits: &[u8], negative: bool, start: usize) -> ParseResult<Number> {
    let mut magnitude: u128 = 0;
    for &d in digits {
        magnitude = magnitude
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(d - b'0')))
            .ok_or_else(|| out_of_range(start, "integer outside [-2^63, 2^64-1]"))?;
    }
    let limit = if negative {
        1u128 << 63
    } else {
        u128::from(u64::MAX)
    };
    if magnitude > limit {
        return Err(out_of_range(start, "integer outside [-2^63, 2^64-1]"));
    }
    let v = i128::try_from(magnitude)
        .map_err(|_| out_of_range(start, "integer outside [-2^63, 2^64-1]"))?;
    Ok(Number::Int(if negative { -v } else { v }))
}

/// A number at `start` outside what canonical JSON holds.
fn out_of_range(start: usize, detail: &'static str) -> Box<CanonicalError> {
    Box::new(CanonicalError::new(
        ErrorKind::NumberOutOfRange,
        start,
        detail,
    ))
}

/// Code-point order of two keys (== byte order). Keys mostly differ in
/// their first byte, which is decided here without a `memcmp` call.
#[inline]
pub(super) fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.as_bytes().first(), b.as_bytes().first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ => a.cmp(b),
    }
}

/// Offset of the first `"`, `\\` or control byte (< 0x20) in `bytes`.
#[inline]
pub(super) fn find_string_special(bytes: &[u8]) -> Option<usize> {
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
pub(super) fn first_flagged<const NON_ASCII: bool>(bytes: &[u8]) -> Option<usize> {
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

pub(super) fn lone_surrogate(offset: usize) -> Box<CanonicalError> {
    Box::new(CanonicalError::new(
        ErrorKind::LoneSurrogate,
        offset,
        "lone utf-16 surrogate",
    ))
}

pub(super) fn duplicate_error(offset: usize, key: &str) -> Box<CanonicalError> {
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
