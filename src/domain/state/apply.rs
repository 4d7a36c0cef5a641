//! Changes another replica committed, applied to this replica's state
//! incrementally (replicas on one store take turns: at the start of its
//! turn a replica applies what the others committed since its last one).

use std::collections::HashMap;

use uuid::Uuid;

use crate::domain::clock::Timestamp;
use crate::domain::error::{Error, Result};
use crate::domain::ledger::{self, Approval, ApprovalEvent, StoredChange};
use crate::domain::manifest::LastAssessment;
use crate::domain::pins::ApiPin;
use crate::domain::policy::Policy;
use crate::domain::receipts::{self, ReceiptKey, StoredReceiptRecord};
use crate::domain::records::{self, Change, Kind};
use crate::domain::resources::{self, QueueItemChanges, Resources, StoredResource};
use crate::domain::session::{self, Session, StoredCall};

use super::manifests::StoredPin;
use super::*;

/// One change, decoded: what it writes or drops. (Queue items are gathered
/// apart, see [`QueueItemChanges`].)
enum Decoded {
    Approval(Box<Approval>),
    ApprovalGone(Timestamp, Uuid),
    ApprovalChange(StoredChange),
    Session(Box<Session>),
    SessionGone([String; 2]),
    Call(StoredCall),
    CallGone([String; 3]),
    Resource(String, StoredResource),
    ResourceGone(String),
    GlobalVersion(Option<u64>),
    Receipt(StoredReceiptRecord),
    ReceiptGone(ReceiptKey),
    Pin(ApiPin),
    PinGone(String),
    Assessment(String, LastAssessment),
    AssessmentGone(String),
    /// A record the state does not read (another meta record, a queue item).
    Nothing,
}

impl State {
    /// Applies, in order, the changes another replica committed (what its
    /// [`State::take_changes`] handed its store): afterwards this state is
    /// the one [`State::restore`] would make of the store's records with
    /// those changes applied, without rebuilding what they do not touch. A
    /// change writes its record whole; one without a value drops it (a
    /// record not held is no error). Nothing is journaled: the changes are
    /// stored already.
    ///
    /// Returns the ledger transitions the changes represent, in their
    /// order, for this replica's watchers (see [`Ledger::apply`]).
    ///
    /// Every change is decoded and checked before any is applied: a
    /// corrupt one (a value or key that does not decode, queue items that
    /// leave a gap in their queue) is an internal error naming its kind,
    /// and nothing changes. A call id left without its session once the
    /// batch is applied is an error too, found after the others applied
    /// (the replica's store then counts as failed, as for any change it
    /// could not take in).
    pub fn apply_changes(
        &mut self,
        policy: &Policy,
        changes: &[Change],
    ) -> Result<Vec<ApprovalEvent>> {
        let mut items = QueueItemChanges::default();
        let decoded = changes
            .iter()
            .map(|change| decode(change, &mut items))
            .collect::<Result<Vec<_>>>()?;
        let records = decoded.iter().filter_map(|change| match change {
            Decoded::Resource(name, stored) => Some((name.as_str(), Some(stored))),
            Decoded::ResourceGone(name) => Some((name.as_str(), None)),
            _ => None,
        });
        self.resources.check_items(&policy.state, records, &items)?;
        let mut events = Vec::new();
        // Call ids written before their session (a batch writes a new
        // session's first call id before the session): kept until the end
        // of the batch, then remembered in their session; one whose session
        // is not there is a store that lost a record, refused as restore
        // refuses it.
        let mut waiting: HashMap<[String; 3], StoredCall> = HashMap::new();
        for change in decoded {
            match change {
                Decoded::Approval(approval) => events.extend(self.ledger.apply(*approval)),
                Decoded::ApprovalGone(requested_at, id) => self.ledger.remove(requested_at, id),
                Decoded::ApprovalChange((id, change)) => {
                    events.extend(self.ledger.apply_change(id, change));
                }
                Decoded::Session(session) => self.sessions.put_session(*session),
                Decoded::SessionGone([host, session_id]) => {
                    self.sessions.delete_session(&host, &session_id);
                }
                Decoded::Call(call) => {
                    let key = call.key().map(str::to_string);
                    waiting.remove(&key);
                    if let Some(call) = self.sessions.put_call(call) {
                        waiting.insert(key, call);
                    }
                }
                Decoded::CallGone(key) => {
                    waiting.remove(&key);
                    let [host, session_id, call_id] = key;
                    self.sessions.delete_call(&host, &session_id, &call_id);
                }
                Decoded::Resource(name, stored) => self.resources.put_resource(name, stored),
                Decoded::ResourceGone(name) => self.resources.delete_resource(&policy.state, &name),
                Decoded::GlobalVersion(version) => self.resources.set_global_version(version),
                Decoded::Receipt(record) => self.receipts.put(record),
                Decoded::ReceiptGone(key) => self.receipts.delete(&key),
                Decoded::Pin(pin) => self.put_pin(pin),
                Decoded::PinGone(server_id) => {
                    self.api_pins.remove(&server_id);
                }
                Decoded::Assessment(server_id, last) => {
                    self.last_assessed.insert(server_id, last);
                }
                Decoded::AssessmentGone(server_id) => {
                    self.last_assessed.remove(&server_id);
                }
                Decoded::Nothing => {}
            }
        }
        for (_, call) in waiting {
            if let Some(orphan) = self.sessions.put_call(call) {
                return Err(orphan.without_session());
            }
        }
        self.resources.apply_items(items)?;
        Ok(events)
    }

    /// An API pin as stored: in force for its server.
    pub(super) fn put_pin(&mut self, pin: ApiPin) {
        self.api_pins.insert(pin.manifest.server_id.clone(), pin);
    }
}

/// What one change writes or drops; a queue item is gathered into `items`.
fn decode(change: &Change, items: &mut QueueItemChanges) -> Result<Decoded> {
    let (kind, key) = (change.kind, change.key.as_slice());
    let Some(value) = change.value.as_deref() else {
        return Ok(match kind {
            Kind::Approval => {
                let (at, id) =
                    ledger::parse_record_key(key).ok_or_else(|| records::corrupt_key(kind))?;
                Decoded::ApprovalGone(at, id)
            }
            // Dropped with its approval's record, which the record's
            // deletion drops from the state.
            Kind::ApprovalChange => {
                ledger::parse_change_key(key).ok_or_else(|| records::corrupt_key(kind))?;
                Decoded::Nothing
            }
            Kind::Session => Decoded::SessionGone(session::decode_session_key(key)?),
            Kind::DecidedCall => Decoded::CallGone(session::decode_call_key(key)?),
            Kind::Resource => Decoded::ResourceGone(resources::decode_resource_key(key)?),
            Kind::QueueItem => {
                items.delete(key)?;
                Decoded::Nothing
            }
            Kind::Meta if Resources::is_global_version_key(key) => Decoded::GlobalVersion(None),
            Kind::Meta => Decoded::Nothing,
            Kind::Receipt => Decoded::ReceiptGone(receipts::decode_receipt_key(key)?),
            Kind::Pin => Decoded::PinGone(text_key(kind, key)?),
            Kind::Assessment => Decoded::AssessmentGone(text_key(kind, key)?),
        });
    };
    Ok(match kind {
        Kind::Approval => {
            ledger::parse_record_key(key).ok_or_else(|| records::corrupt_key(kind))?;
            Decoded::Approval(records::decode_value(kind, value)?)
        }
        Kind::ApprovalChange => Decoded::ApprovalChange(ledger::decode_change(key, value)?),
        Kind::Session => {
            session::decode_session_key(key)?;
            Decoded::Session(records::decode_value(kind, value)?)
        }
        Kind::DecidedCall => Decoded::Call(session::decode_call(key, value)?),
        Kind::Resource => {
            let (name, stored) = resources::decode_resource(key, value)?;
            Decoded::Resource(name, stored)
        }
        Kind::QueueItem => {
            items.put(key, value)?;
            Decoded::Nothing
        }
        Kind::Meta if Resources::is_global_version_key(key) => {
            Decoded::GlobalVersion(Some(records::decode_value(kind, value)?))
        }
        Kind::Meta => Decoded::Nothing,
        Kind::Receipt => {
            receipts::decode_receipt_key(key)?;
            Decoded::Receipt(receipts::decode_receipt(value)?)
        }
        Kind::Pin => {
            text_key(kind, key)?;
            let stored: StoredPin = records::decode_value(kind, value)?;
            Decoded::Pin(stored.into_pin().map_err(|error| {
                Error::Internal(format!(
                    "the store holds a {} record that does not decode ({error}); \
                     run `toolgate store check`",
                    kind.table()
                ))
            })?)
        }
        Kind::Assessment => {
            let server_id = text_key(kind, key)?;
            Decoded::Assessment(server_id, records::decode_value(kind, value)?)
        }
    })
}

/// A key that is a server id (pins, assessments).
pub(super) fn text_key(kind: Kind, key: &[u8]) -> Result<String> {
    String::from_utf8(key.to_vec()).map_err(|_| records::corrupt_key(kind))
}
