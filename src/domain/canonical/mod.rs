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
//!
//! Values are also what a tool's input schema validates, in place
//! ([`Canonical`], jsonschema's representation trait).

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

mod fingerprint;
mod parse;
mod print;
mod schema;

pub use fingerprint::{Fingerprint, Members, fingerprint, fingerprint_object};
pub use parse::{canonicalize, parse, parse_str};
pub use print::{
    canonical_len, canonical_len_over, plain_prefix_len, to_canonical, write_canonical,
};
pub use schema::{Canonical, Instance};

// ---------------------------------------------------------------------------
// Conveniences
// ---------------------------------------------------------------------------

impl Value {
    /// Whether the two print the same canonical JSON, and so have the same
    /// fingerprint. Stricter than `==`, for which `0.0` and `-0.0` are equal
    /// though canonical JSON writes them apart.
    pub fn identical(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Number(Number::Float(left)), Value::Number(Number::Float(right))) => {
                left.to_bits() == right.to_bits()
            }
            (Value::Array(left), Value::Array(right)) => {
                left.len() == right.len()
                    && left
                        .iter()
                        .zip(right)
                        .all(|(left, right)| left.identical(right))
            }
            (Value::Object(left), Value::Object(right)) => {
                left.members.len() == right.members.len()
                    && left.members.iter().zip(&right.members).all(
                        |((left_key, left), (right_key, right))| {
                            left_key == right_key && left.identical(right)
                        },
                    )
            }
            (left, right) => left == right,
        }
    }

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

/// `number` as a serde_json number: an integer as one, any other number as
/// an `f64`; `None` for a float that is not finite, which the parser never
/// makes.
fn serde_number(number: Number) -> Option<serde_json::Number> {
    match number {
        Number::Int(int) => match (i64::try_from(int), u64::try_from(int)) {
            (Ok(int), _) => Some(int.into()),
            (_, Ok(int)) => Some(int.into()),
            // Outside the documented invariant (a hand-built value).
            _ => serde_json::Number::from_f64(int as f64),
        },
        Number::Float(float) => serde_json::Number::from_f64(float),
    }
}

/// An object as a serde_json object (an error's instance in JSON Schema
/// validation), without cloning it into a `Value` first.
fn object_to_serde_json(object: &Object) -> serde_json::Value {
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
        Value::Number(number) => serde_number(*number).map_or(J::Null, J::Number),
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
    use super::parse::find_string_special;
    use super::print::{HASH_BUF_LEN, is_plain, plain_prefix_len};
    use super::*;

    fn canon(s: &str) -> String {
        match canonicalize(s.as_bytes()) {
            Ok(c) => c,
            Err(e) => panic!("{s:?} rejected: {e}"),
        }
    }

    #[test]
    fn identical_values_are_those_with_one_canonical_text() {
        let texts = [
            "0.0",
            "-0.0",
            "0",
            "1",
            "1.0",
            "1e0",
            "\"a\"",
            "null",
            "[0.0,1]",
            "[-0.0,1]",
            "[0.0]",
            r#"{"a":{"b":[-0.0]}}"#,
            r#"{"a":{"b":[0.0]}}"#,
            r#"{"a":1,"b":2}"#,
            r#"{"b":2,"a":1}"#,
            r#"{"a":1}"#,
            r#"{"c":1,"b":2}"#,
        ];
        for left in texts {
            for right in texts {
                let (Ok(left_value), Ok(right_value)) = (parse_str(left), parse_str(right)) else {
                    panic!("{left} or {right} does not parse");
                };
                assert_eq!(
                    left_value.identical(&right_value),
                    canon(left) == canon(right),
                    "{left} and {right}"
                );
            }
        }
        // `==` says 0.0 and -0.0 are equal; their texts differ.
        assert_eq!(parse_str("-0.0").ok(), parse_str("0.0").ok());
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

    #[test]
    fn canonical_len_is_the_length_of_the_canonical_text() {
        for text in [
            r#"{"z":[1,2.5,-0.0,1e300,null,true],"a":{"é":"\u0000\n\"","😀":"x"}}"#,
            "[]",
            r#""""#,
            "-9223372036854775808",
        ] {
            let value = parse_str(text).unwrap();
            assert_eq!(canonical_len(&value), to_canonical(&value).len(), "{text}");
        }
    }

    /// Values whose canonical text is longest for their lengths: characters
    /// that print as escapes (`\u007f`, surrogate pairs), doubles printed
    /// with padding or long exponents, integers beyond the parser's range.
    fn widest_values() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let scalar = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            prop_oneof![Just(i128::MIN), any::<i128>()]
                .prop_map(|int| Value::Number(Number::Int(int))),
            prop_oneof![
                Just(1e15),
                Just(-1e15),
                Just(-2.2250738585072014e-308),
                Just(-0.00012345678901234567),
                any::<f64>(),
            ]
            .prop_filter("finite", |float| float.is_finite())
            .prop_map(|float| Value::Number(Number::Float(float))),
            "[\\x00-\\x7f\u{80}\u{7ff}\u{ffff}\u{10ffff}\"\\\\]{0,8}".prop_map(Value::String),
        ];
        scalar.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec(("[\\x7f\u{10ffff}a]{0,3}", inner), 0..4).prop_map(
                    |members| {
                        let mut object = Object::new();
                        for (key, value) in members {
                            object.insert(key, value);
                        }
                        Value::Object(object)
                    }
                ),
            ]
        })
    }

    proptest::proptest! {
        /// The bound that spares the printing is one, and the answer is
        /// the count's at every limit around the length.
        #[test]
        fn canonical_len_over_is_the_count(value in widest_values(), below in 0usize..64) {
            let len = canonical_len(&value);
            proptest::prop_assert!(len <= print::len_bound(&value));
            for max in [len.saturating_sub(below), len.saturating_sub(1), len, len + below] {
                proptest::prop_assert_eq!(canonical_len_over(&value, max), (len > max).then_some(len));
            }
        }
    }
}
