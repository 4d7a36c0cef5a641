//! The state's durable form. Every change an operation makes to the state is
//! journaled here as a record of one kind, with a key and an encoded value,
//! so that every store keeps the same bytes and recovery is the same code
//! whatever the store: [`Change`]s out of an operation, [`Record`]s back in
//! at start ([`State::restore`](crate::domain::state::State::restore)).
//!
//! Values are JSON (serde), so that an operator can read a store with the
//! engine's own tools; keys are binary and ordered so that new records of a
//! growing kind land at the end of the engine's tree (approvals and their
//! changes, decided call ids and receipts by time first). A record that
//! would be rewritten where it lies is split instead: an approval is written
//! once and each later step apart ([`Kind::ApprovalChange`]), as a session's
//! decided call ids are records of their own.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::canonical::{self, Fingerprint, Value};
use crate::domain::clock::Timestamp;
use crate::domain::error::{Error, Result};
use crate::domain::ledger::ApprovalStatus;
use crate::domain::reason::Reason;

/// A kind of record: one table of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Single values of the whole state (the global version).
    Meta,
    /// One approval record by (requested at, id).
    Approval,
    /// One session's counters by (host, session id).
    Session,
    /// One call id a session decided, by (decided at, host, session id, call
    /// id).
    DecidedCall,
    /// One resource's version and (for a value that is not a queue) value.
    Resource,
    /// One item of a queue resource, by (resource, index).
    QueueItem,
    /// One receipt by (created at, host, actor, call id).
    Receipt,
    /// One manifest pin made through the API, by server id.
    Pin,
    /// The latest assessment of a pinned server, by server id.
    Assessment,
    /// What became of an approval after its request (its grant, its end),
    /// by (changed at, id, step): a small record appended where the
    /// changes of the same moment are, instead of the approval's record
    /// rewritten in its place (see `ledger`).
    ApprovalChange,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Meta,
        Kind::Approval,
        Kind::Session,
        Kind::DecidedCall,
        Kind::Resource,
        Kind::QueueItem,
        Kind::Receipt,
        Kind::Pin,
        Kind::Assessment,
        Kind::ApprovalChange,
    ];

    /// Its place in [`Kind::ALL`], for tables indexed by kind.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The table this kind is kept in (a plain SQL identifier).
    pub fn table(self) -> &'static str {
        match self {
            Kind::Meta => "meta",
            Kind::Approval => "approvals",
            Kind::Session => "sessions",
            Kind::DecidedCall => "decided_calls",
            Kind::Resource => "resources",
            Kind::QueueItem => "queue_items",
            Kind::Receipt => "receipts",
            Kind::Pin => "pins",
            Kind::Assessment => "assessments",
            Kind::ApprovalChange => "approval_changes",
        }
    }
}

/// One change to the durable state: a record written whole, or deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: Kind,
    pub key: Vec<u8>,
    /// `None` deletes the record.
    pub value: Option<Vec<u8>>,
}

/// One stored record, as recovery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// The key made of `parts`: each length-prefixed, so that no part can run
/// into the next whatever bytes it holds.
pub fn key(parts: &[&[u8]]) -> Vec<u8> {
    let mut key = Vec::with_capacity(parts.iter().map(|part| part.len() + 4).sum());
    for part in parts {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        key.extend_from_slice(&len.to_be_bytes());
        key.extend_from_slice(part);
    }
    key
}

/// The parts of a key made by [`key`]; `None` when it was not made so.
pub fn split_key(mut key: &[u8]) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    while !key.is_empty() {
        let (len, rest) = key.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        parts.push(rest.get(..len)?);
        key = rest.get(len..)?;
    }
    Some(parts)
}

/// A timestamp as the first part of a key: big-endian, so keys sort by time.
pub fn time_part(at: Timestamp) -> [u8; 8] {
    at.0.to_be_bytes()
}

/// The bytes a record's encoding starts with room for: an approval or a
/// receipt with short arguments.
const RECORD_CAPACITY: usize = 512;

/// The changes made since the last [`Journal::take_into`], in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    changes: Vec<Change>,
    /// Set when a value could not be encoded: the journal then refuses to
    /// hand out its changes, and the engine fails closed.
    failed: Option<String>,
    /// Set by [`Journal::stop`]: nothing is journaled any more.
    stopped: bool,
}

impl Journal {
    /// Journals nothing from now on, and drops what was journaled and not
    /// taken ([`State::stop_journaling`](crate::domain::state::State::stop_journaling)).
    pub fn stop(&mut self) {
        self.stopped = true;
        self.changes = Vec::new();
    }

    /// Whether changes are journaled (not [`Journal::stop`]ped): lets a
    /// caller skip building a record nobody will keep.
    pub fn is_on(&self) -> bool {
        !self.stopped
    }

    pub fn put(&mut self, kind: Kind, key: Vec<u8>, value: &impl Serialize) {
        if self.stopped {
            return;
        }
        // Most records fit: one allocation instead of a chain of doublings
        // from serde_json's 128 bytes.
        let mut bytes = Vec::with_capacity(RECORD_CAPACITY);
        match serde_json::to_writer(&mut bytes, value) {
            Ok(()) => self.changes.push(Change {
                kind,
                key,
                value: Some(bytes),
            }),
            Err(error) => {
                self.failed
                    .get_or_insert_with(|| format!("a {} record: {error}", kind.table()));
            }
        }
    }

    pub fn delete(&mut self, kind: Kind, key: Vec<u8>) {
        if self.stopped {
            return;
        }
        self.changes.push(Change {
            kind,
            key,
            value: None,
        });
    }

    /// Moves the changes journaled into `out`, in order.
    pub fn take_into(&mut self, out: &mut Vec<Change>) -> Result<()> {
        if let Some(failed) = self.failed.take() {
            self.changes.clear();
            return Err(Error::Internal(format!(
                "a change could not be made durable: {failed}"
            )));
        }
        out.append(&mut self.changes);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.failed.is_none()
    }
}

/// Decodes a stored value; a value that does not decode is a corrupt store.
pub fn decode<'a, T: Deserialize<'a>>(record: &'a Record) -> Result<T> {
    decode_value(record.kind, &record.value)
}

/// Decodes the value of a record of `kind` (a stored record's, or a
/// change's read back from the store); one that does not decode is a
/// corrupt store.
pub fn decode_value<'a, T: Deserialize<'a>>(kind: Kind, value: &'a [u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|error| {
        Error::Internal(format!(
            "the store holds a {} record that does not decode ({error}); \
             run `toolgate store check`",
            kind.table()
        ))
    })
}

/// The error for a record of `kind` whose key does not decode.
pub fn corrupt_key(kind: Kind) -> Error {
    Error::Internal(format!(
        "the store holds a {} record whose key does not decode; run `toolgate store check`",
        kind.table()
    ))
}

// The leaf types of the domain, as they are stored.

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        // From the stack buffer: `collect_str` would go through `fmt`.
        serializer.serialize_str(self.hex().as_str())
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let text = <&str>::deserialize(deserializer)?;
        Fingerprint::from_hex(text).ok_or_else(|| D::Error::custom("not a fingerprint"))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        u64::deserialize(deserializer).map(Timestamp)
    }
}

/// Serializes by a stable name; deserializes by looking the name up among
/// `all` (so that a stored name never depends on declaration order).
macro_rules! by_name {
    ($type:ty, $all:expr) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(
                &self,
                serializer: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(
                deserializer: D,
            ) -> std::result::Result<Self, D::Error> {
                let name = <&str>::deserialize(deserializer)?;
                $all.into_iter()
                    .find(|known| known.as_str() == name)
                    .ok_or_else(|| D::Error::custom(format!("unknown name {name:?}")))
            }
        }
    };
}

by_name!(Reason, Reason::ALL);
by_name!(ApprovalStatus, ApprovalStatus::ALL);

/// A value is stored as its canonical JSON text.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut text = String::new();
        canonical::write_canonical(self, &mut text);
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        canonical::parse_str(&text).map_err(|error| D::Error::custom(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_at_its_index_in_all() {
        for (index, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), index, "{kind:?}");
        }
    }

    #[test]
    fn keys_keep_their_parts_apart() {
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]));
        assert_eq!(key(&[b"a"]), vec![0, 0, 0, 1, b'a']);
        let made = key(&[b"host", b"", b"call"]);
        assert_eq!(split_key(&made).unwrap(), [&b"host"[..], b"", b"call"]);
        assert_eq!(split_key(&made[..made.len() - 1]), None);
    }

    #[test]
    fn leaf_types_round_trip() {
        let fingerprint = Fingerprint::of_bytes(b"x");
        let text = serde_json::to_string(&fingerprint).unwrap();
        assert_eq!(text, format!("\"{fingerprint}\""));
        assert_eq!(
            serde_json::from_str::<Fingerprint>(&text).unwrap(),
            fingerprint
        );
        for reason in Reason::ALL {
            let text = serde_json::to_string(&reason).unwrap();
            assert_eq!(serde_json::from_str::<Reason>(&text).unwrap(), reason);
        }
        let value = canonical::parse_str(r#"{"b":[1,"x"],"a":null}"#).unwrap();
        let text = serde_json::to_string(&value).unwrap();
        assert_eq!(text, r#""{\"a\":null,\"b\":[1,\"x\"]}""#);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), value);
        assert!(serde_json::from_str::<Reason>("\"no-such-reason\"").is_err());
    }
}
