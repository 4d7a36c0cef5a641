//! Fingerprints (SPEC §1): SHA-256 of the canonical text, computed while printing.

use super::print::{HashSink, Sink, write_number, write_object, write_string, write_value};
use super::*;
use crate::domain::ids::AsciiText;

// ---------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------

/// SHA-256 of the canonical form, streamed into the hasher (no intermediate String).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Lowercase hex (64 chars).
    pub fn to_hex(&self) -> String {
        self.hex().as_str().to_owned()
    }

    /// Lowercase hex in a stack buffer, no allocation: an audit field is
    /// `fingerprint = x.fingerprint.hex().as_str()`, a plain string.
    pub fn hex(&self) -> AsciiText<64> {
        let mut digits = [0u8; 64];
        for (pair, byte) in digits.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX_DIGITS[usize::from(byte >> 4)];
            pair[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
        }
        AsciiText::new(digits)
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

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hex().as_str())
    }
}

/// Fingerprints an object whose members `write` supplies one by one, in
/// sorted key order, without building it: the canonical text goes straight
/// into the hasher. Used for the proposal envelope on every call, and for
/// manifests, whose tools are objects written the same way.
pub fn fingerprint_object(write: impl FnOnce(&mut Members<'_>)) -> Fingerprint {
    let mut sink = HashSink::new();
    Members::write(&mut sink, write);
    sink.finish()
}

/// The members of one object being hashed ([`fingerprint_object`]), in
/// sorted key order (checked in debug builds).
pub struct Members<'s> {
    sink: &'s mut HashSink,
    count: usize,
    #[cfg(debug_assertions)]
    last_key: String,
}

impl Members<'_> {
    /// `{`, the members `write` supplies, `}`.
    fn write(sink: &mut HashSink, write: impl FnOnce(&mut Members<'_>)) {
        sink.put_ascii(b'{');
        let mut members = Members {
            sink,
            count: 0,
            #[cfg(debug_assertions)]
            last_key: String::new(),
        };
        write(&mut members);
        members.sink.put_ascii(b'}');
    }

    fn key(&mut self, key: &str) {
        #[cfg(debug_assertions)]
        {
            debug_assert!(
                self.count == 0 || self.last_key.as_str() < key,
                "members must come in sorted key order"
            );
            self.last_key = key.to_string();
        }
        if self.count > 0 {
            self.sink.put_ascii(b',');
        }
        self.count += 1;
        write_string(key, self.sink);
        self.sink.put_ascii(b':');
    }

    pub fn member(&mut self, key: &str, value: &Value) {
        self.key(key);
        write_value(value, self.sink);
    }

    pub fn member_object(&mut self, key: &str, object: &Object) {
        self.key(key);
        write_object(object, self.sink);
    }

    pub fn member_str(&mut self, key: &str, text: &str) {
        self.key(key);
        write_string(text, self.sink);
    }

    pub fn member_u64(&mut self, key: &str, number: u64) {
        self.key(key);
        write_number(&Number::Int(i128::from(number)), self.sink);
    }

    pub fn member_bool(&mut self, key: &str, flag: bool) {
        self.key(key);
        self.sink.put(if flag { "true" } else { "false" });
    }

    /// An array of strings.
    pub fn member_strs(&mut self, key: &str, items: &[String]) {
        self.key(key);
        self.array(items, |item, sink| write_string(item, sink));
    }

    /// An array of objects, each `item`'s members written by `write`.
    pub fn member_objects<T>(
        &mut self,
        key: &str,
        items: &[T],
        mut write: impl FnMut(&mut Members<'_>, &T),
    ) {
        self.key(key);
        self.array(items, |item, sink| {
            Members::write(sink, |members| write(members, item));
        });
    }

    fn array<T>(&mut self, items: &[T], mut write: impl FnMut(&T, &mut HashSink)) {
        self.sink.put_ascii(b'[');
        for (index, item) in items.iter().enumerate() {
            if index > 0 {
                self.sink.put_ascii(b',');
            }
            write(item, self.sink);
        }
        self.sink.put_ascii(b']');
    }
}

/// SHA-256 of the canonical form of `value`.
pub fn fingerprint(value: &Value) -> Fingerprint {
    let mut sink = HashSink::new();
    write_value(value, &mut sink);
    sink.finish()
}
