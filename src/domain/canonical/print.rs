//! The printer (SPEC §1): byte-identical to Python's `json.dumps(sort_keys=True, ensure_ascii=True, separators=(",", ":"))`, into a `String` or straight into SHA-256.

use super::parse::first_flagged;
use super::*;

// ---------------------------------------------------------------------------
// Printer
// ---------------------------------------------------------------------------

/// Destination of canonical output: a `String` or a streaming hasher.
pub(super) trait Sink {
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
pub(super) const HASH_BUF_LEN: usize = 256;

/// Streams canonical text into SHA-256 through a stack buffer: the printer
/// emits many tiny pieces, and batching them costs one copy instead of one
/// `update` call (with its own buffering logic) per piece.
pub(super) struct HashSink {
    hasher: Sha256,
    buf: [u8; HASH_BUF_LEN],
    len: usize,
}

impl HashSink {
    pub(super) fn new() -> Self {
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

    pub(super) fn finish(mut self) -> Fingerprint {
        self.hasher.update(&self.buf[..self.len]);
        Fingerprint(self.hasher.finalize().into())
    }
}

/// `dst.copy_from_slice(src)` for the short pieces the printer emits, with
/// fixed-size (overlapping) moves instead of a `memcpy` call.
#[inline]
pub(super) fn copy_short(dst: &mut [u8], src: &[u8]) {
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

/// Counts the bytes of canonical output, for a size check that needs no text.
struct LenSink(usize);

impl Sink for LenSink {
    #[inline]
    fn put(&mut self, s: &str) {
        self.0 += s.len();
    }

    #[inline]
    fn put_ascii(&mut self, _: u8) {
        self.0 += 1;
    }
}

/// The length in bytes of the canonical form of `value`, without making it.
pub fn canonical_len(value: &Value) -> usize {
    let mut len = LenSink(0);
    write_value(value, &mut len);
    len.0
}

/// The length of the canonical form of `value` when it is over `max`
/// bytes, `None` when it fits. Printed and counted only when [`len_bound`]
/// is over `max` (for a value whose strings hold more than about a sixth
/// of it).
pub fn canonical_len_over(value: &Value, max: usize) -> Option<usize> {
    if len_bound(value) <= max {
        return None;
    }
    Some(canonical_len(value)).filter(|len| *len > max)
}

/// The most bytes a number prints to: an `i128` outside the parser's range
/// (hand-built) takes 40 (`-170141183460469231731687303715884105728`), a
/// double at most 24 (`-2.2250738585072014e-308`).
const NUMBER_LEN_BOUND: usize = 40;

/// An upper bound of [`canonical_len`] from lengths alone. No byte of a
/// string's UTF-8 prints to more than six: a one-byte character to at most
/// `\u007f`, a two- or three-byte one to one `\uXXXX`, a four-byte one to
/// a surrogate pair (twelve).
pub(super) fn len_bound(value: &Value) -> usize {
    let string = |text: &str| text.len().saturating_mul(6).saturating_add(2);
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => NUMBER_LEN_BOUND,
        Value::String(text) => string(text),
        // Brackets, and a comma after every item (one more than printed).
        Value::Array(items) => items.iter().fold(2, |len: usize, item| {
            len.saturating_add(len_bound(item)).saturating_add(1)
        }),
        // The same, with a key and its colon before each value.
        Value::Object(object) => object.iter().fold(2, |len: usize, (key, item)| {
            len.saturating_add(string(key))
                .saturating_add(len_bound(item))
                .saturating_add(2)
        }),
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

pub(super) fn write_value<S: Sink>(value: &Value, out: &mut S) {
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

pub(super) fn write_object<S: Sink>(obj: &Object, out: &mut S) {
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
pub(super) fn is_plain(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

pub(super) fn write_string<S: Sink>(s: &str, out: &mut S) {
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

/// Length of the leading run of [`is_plain`] bytes: printable ASCII
/// other than `"` and `\`, which a JSON string holds as they are.
#[inline]
pub fn plain_prefix_len(bytes: &[u8]) -> usize {
    first_flagged::<true>(bytes).unwrap_or(bytes.len())
}

/// Writes `\uXXXX` with lowercase hex for a UTF-16 code unit.
pub(super) fn put_unit<S: Sink>(unit: u32, out: &mut S) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let nib = |shift: u32| HEX[((unit >> shift) & 0xF) as usize];
    let buf = [b'\\', b'u', nib(12), nib(8), nib(4), nib(0)];
    if let Ok(s) = std::str::from_utf8(&buf) {
        out.put(s);
    }
}

/// Small fixed-capacity text buffer so number formatting never allocates.
pub(super) struct StackBuf {
    buf: [u8; 48],
    len: usize,
}

impl StackBuf {
    pub(super) fn new() -> Self {
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

pub(super) fn write_number<S: Sink>(n: &Number, out: &mut S) {
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
pub(super) fn push_decimal(mut value: u64, out: &mut StackBuf) {
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
pub(super) fn format_float(f: f64, out: &mut StackBuf) {
    if !f.is_finite() {
        write_non_finite(f, out);
        return;
    }
    let mut digits = [0u8; 24];
    let Some((n, exp)) = shortest_digits(f, &mut digits) else {
        return;
    };
    let digits = &digits[..n];
    if f.is_sign_negative() {
        out.push(b'-');
    }
    if (-4..16).contains(&exp) {
        lay_out_fixed(digits, exp, out);
    } else {
        lay_out_scientific(digits, exp, out);
    }
}

/// Unreachable for parsed values; keeps output valid-ish for hand-built ones.
#[inline]
fn write_non_finite(f: f64, out: &mut StackBuf) {
    out.extend(if f.is_nan() {
        b"NaN"
    } else if f > 0.0 {
        b"Infinity"
    } else {
        b"-Infinity"
    });
}

/// The shortest round-trip digits of `f` (ties broken to even, as Python
/// does) into `digits`, with their count and the decimal exponent of the
/// first: 1.2345e-7 gives `12345`, 5, -7.
#[inline]
fn shortest_digits(f: f64, digits: &mut [u8; 24]) -> Option<(usize, i32)> {
    // `{:e}` yields the shortest round-trip digits, e.g. "-1.2345e-7", "0e0".
    let mut sci = StackBuf::new();
    if write!(sci, "{f:e}").is_err() {
        return None;
    }
    let text = &sci.buf[..sci.len];
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
    let n = break_tie_to_even(f, digits, n, exp);
    Some((n, exp))
}

/// Fixed notation, for exponents in -4..=15: `123.45`, `1200.0`, `0.00012`.
#[inline]
fn lay_out_fixed(digits: &[u8], exp: i32, out: &mut StackBuf) {
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
}

/// Scientific notation, with at least two exponent digits: `1.5e+16`, `1e-05`.
#[inline]
fn lay_out_scientific(digits: &[u8], exp: i32, out: &mut StackBuf) {
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

/// Python's `repr` (David Gay's dtoa, mode 0) breaks exact ties between two
/// equally short, equally close digit strings to the even one; Rust's shortest
/// formatter rounds such ties up (e.g. 111275153569243.125: Python `...243.12`,
/// Rust `...243.13`). Detects that case exactly and switches to the even
/// neighbour when it also round-trips. Returns the (possibly new) digit count.
pub(super) fn break_tie_to_even(f: f64, digits: &mut [u8; 24], n: usize, exp: i32) -> usize {
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
