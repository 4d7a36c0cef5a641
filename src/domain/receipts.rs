//! The receipt log (SPEC §6): one stored answer per (host, actor, call id), kept for the retention window and within the byte budget.

use crate::domain::canonical::{Fingerprint, Value};
use crate::domain::clock::Timestamp;
use crate::domain::error::Result;
use crate::domain::policy::Limits;
use crate::domain::records::{self, Change, Journal, Kind, Record};
use crate::domain::resources::{CommitResult, value_bytes};
use crate::domain::table::Table;
use std::collections::BTreeSet;
use std::sync::Arc;
use uuid::Uuid;

/// A stored receipt: the fingerprint it was made for and a copy of the result.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub id: Uuid,
    pub fingerprint: Fingerprint,
    pub result: CommitResult,
    pub created_at: Timestamp,
    /// The grant the commit consumed, answered again on a replay (records
    /// written before it was kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<Uuid>,
}

/// What one receipt costs besides its value and key text: the boxed
/// record, its table slot and its entry in the age index.
const RECEIPT_OVERHEAD_BYTES: usize = 256;

/// The bytes a receipt holds under the byte budget.
pub fn receipt_bytes(
    host: &str,
    actor: &str,
    call_id: &str,
    resource: Option<&str>,
    value: Option<&Value>,
) -> usize {
    RECEIPT_OVERHEAD_BYTES
        + host.len()
        + actor.len()
        + call_id.len()
        + resource.map_or(0, str::len)
        + value.map_or(0, value_bytes)
}

/// A host identity, an actor's name and a call id in one shared allocation
/// (the log's table and its age index hold the same one), ordered as the
/// triple.
#[derive(Debug, Clone)]
struct CallKey {
    text: Arc<str>,
    host_len: usize,
    actor_len: usize,
}

impl CallKey {
    fn new(host: &str, actor: &str, call_id: &str) -> Self {
        let mut text = String::with_capacity(host.len() + actor.len() + call_id.len());
        text.push_str(host);
        text.push_str(actor);
        text.push_str(call_id);
        CallKey {
            text: Arc::from(text),
            host_len: host.len(),
            actor_len: actor.len(),
        }
    }

    fn host(&self) -> &str {
        self.text.get(..self.host_len).unwrap_or_default()
    }

    fn actor(&self) -> &str {
        self.text
            .get(self.host_len..self.host_len + self.actor_len)
            .unwrap_or_default()
    }

    fn call_id(&self) -> &str {
        self.text
            .get(self.host_len + self.actor_len..)
            .unwrap_or_default()
    }

    fn parts(&self) -> (&str, &str, &str) {
        (self.host(), self.actor(), self.call_id())
    }

    fn is(&self, host: &str, actor: &str, call_id: &str) -> bool {
        self.parts() == (host, actor, call_id)
    }
}

impl PartialEq for CallKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for CallKey {}

impl Ord for CallKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for CallKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A receipt under its key, boxed in the log so that growing the table
/// moves pointers only.
#[derive(Debug)]
struct StoredReceipt {
    key: CallKey,
    receipt: Receipt,
    /// What it counts under the byte budget ([`receipt_bytes`]).
    bytes: usize,
}

/// Receipts by (host identity, actor, call id): each host and each actor has
/// its own call-id space, so one cannot replay or occupy another's call ids
/// (SPEC §6 step 4). Capped in count and counted in bytes; receipts older
/// than the retention window may be evicted to make room, younger ones never
/// are (exactly-once needs them).
#[derive(Debug, Default)]
pub struct ReceiptLog {
    receipts: Table<Box<StoredReceipt>>,
    /// Oldest first; among receipts of the same millisecond, by key.
    by_age: BTreeSet<(Timestamp, CallKey)>,
    /// Σ bytes of the stored receipts.
    bytes: usize,
    /// Receipts stored and evicted since the state last took the changes.
    journal: Journal,
}

/// A receipt as it is stored: with the call it answers.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReceiptRecord<Text, Stored> {
    host: Text,
    actor: Text,
    call_id: Text,
    receipt: Stored,
}

/// A stored receipt record, decoded ([`decode_receipt`]).
pub struct StoredReceiptRecord(ReceiptRecord<String, Receipt>);

/// The receipt record of a stored value.
pub fn decode_receipt(value: &[u8]) -> Result<StoredReceiptRecord> {
    records::decode_value(Kind::Receipt, value).map(StoredReceiptRecord)
}

/// The parts of the key a receipt is stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptKey {
    pub created_at: Timestamp,
    pub host: String,
    pub actor: String,
    pub call_id: String,
}

/// The parts of a receipt's key; a key that does not decode is a corrupt
/// store.
pub fn decode_receipt_key(key: &[u8]) -> Result<ReceiptKey> {
    let parts = records::split_key(key).and_then(|parts| {
        let [at, host, actor, call_id] = <[&[u8]; 4]>::try_from(parts).ok()?;
        let created_at = Timestamp(u64::from_be_bytes(at.try_into().ok()?));
        let text = |part: &[u8]| std::str::from_utf8(part).ok().map(str::to_string);
        Some(ReceiptKey {
            created_at,
            host: text(host)?,
            actor: text(actor)?,
            call_id: text(call_id)?,
        })
    });
    parts.ok_or_else(|| records::corrupt_key(Kind::Receipt))
}

/// The key a receipt is stored under: by age first, so that new receipts
/// land at the end of the store's tree and old ones leave from its start.
fn record_key(created_at: Timestamp, host: &str, actor: &str, call_id: &str) -> Vec<u8> {
    records::key(&[
        &records::time_part(created_at),
        host.as_bytes(),
        actor.as_bytes(),
        call_id.as_bytes(),
    ])
}

fn retention_millis(limits: &Limits) -> u64 {
    u64::try_from(limits.receipt_retention.as_millis()).unwrap_or(u64::MAX)
}

impl ReceiptLog {
    pub fn len(&self) -> usize {
        self.receipts.len()
    }

    /// When the youngest receipt was made.
    pub fn latest_time(&self) -> Timestamp {
        self.by_age
            .last()
            .map(|(created_at, _)| *created_at)
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.receipts.is_empty()
    }

    /// What the stored receipts count under the byte budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The hash a key is found under, from borrowed parts (no allocation).
    fn hash(&self, host: &str, actor: &str, call_id: &str) -> u64 {
        self.receipts.hash(&(host, actor, call_id))
    }

    pub fn get(&self, host: &str, actor: &str, call_id: &str) -> Option<&Receipt> {
        self.receipts
            .find(self.hash(host, actor, call_id), |stored| {
                stored.key.is(host, actor, call_id)
            })
            .map(|stored| &stored.receipt)
    }

    /// Evicts the oldest receipt if it is past retention; the bytes freed.
    fn evict_oldest_past_retention(&mut self, now: Timestamp, limits: &Limits) -> Option<usize> {
        let (created_at, _) = self.by_age.first()?;
        if now.millis_since(*created_at) < retention_millis(limits) {
            return None;
        }
        let (_, key) = self.by_age.pop_first()?;
        let (host, actor, call_id) = key.parts();
        let hash = self.hash(host, actor, call_id);
        let stored = self
            .receipts
            .remove(hash, |stored| stored.key.is(host, actor, call_id))?;
        self.bytes = self.bytes.saturating_sub(stored.bytes);
        let key = record_key(stored.receipt.created_at, host, actor, call_id);
        self.journal.delete(Kind::Receipt, key);
        Some(stored.bytes)
    }

    /// How many receipts must go before one more fits under
    /// `limits.receipt_capacity`.
    pub fn over_capacity(&self, limits: &Limits) -> usize {
        (self.receipts.len() + 1).saturating_sub(limits.receipt_capacity)
    }

    /// The sizes of the receipts past retention, oldest first: those that
    /// may be evicted.
    fn past_retention<'a>(
        &'a self,
        now: Timestamp,
        limits: &Limits,
    ) -> impl Iterator<Item = usize> + 'a {
        let retention = retention_millis(limits);
        self.by_age
            .iter()
            .take_while(move |(created_at, _)| now.millis_since(*created_at) >= retention)
            .map(|(_, key)| {
                let (host, actor, call_id) = key.parts();
                let hash = self.hash(host, actor, call_id);
                self.receipts
                    .find(hash, |stored| stored.key.is(host, actor, call_id))
                    .map_or(0, |stored| stored.bytes)
            })
    }

    /// What evicting receipts past retention, oldest first, until `count`
    /// of them and `enough` bytes are gone would take: the receipts and the
    /// bytes, fewer when too few are past retention (changes nothing).
    pub fn evictable(
        &self,
        now: Timestamp,
        limits: &Limits,
        count: usize,
        enough: usize,
    ) -> (usize, usize) {
        // Checked before each receipt is looked at: a commit with room
        // (count and enough 0) looks at none.
        let mut sizes = self.past_retention(now, limits);
        let (mut receipts, mut bytes) = (0usize, 0usize);
        while receipts < count || bytes < enough {
            let Some(size) = sizes.next() else { break };
            receipts += 1;
            bytes = bytes.saturating_add(size);
        }
        (receipts, bytes)
    }

    /// Evicts receipts past retention, oldest first, until `count` of them
    /// and `needed` bytes are gone or none is left; the bytes freed.
    pub fn evict(&mut self, now: Timestamp, limits: &Limits, count: usize, needed: usize) -> usize {
        let (mut evicted, mut freed) = (0usize, 0usize);
        while evicted < count || freed < needed {
            match self.evict_oldest_past_retention(now, limits) {
                Some(bytes) => {
                    evicted += 1;
                    freed = freed.saturating_add(bytes);
                }
                None => break,
            }
        }
        freed
    }

    /// Stores the receipt of a call id; the caller has checked that it has
    /// none yet (Dispatch step 4, under the same lock) and made room.
    pub fn insert(&mut self, host: &str, actor: &str, call_id: &str, receipt: Receipt) {
        let record = ReceiptRecord {
            host,
            actor,
            call_id,
            receipt: &receipt,
        };
        let record_key = record_key(receipt.created_at, host, actor, call_id);
        self.journal.put(Kind::Receipt, record_key, &record);
        self.store(host, actor, call_id, receipt);
    }

    /// Puts a receipt in the table and the age index (nothing journaled);
    /// the caller has checked that its call id has none.
    fn store(&mut self, host: &str, actor: &str, call_id: &str, receipt: Receipt) {
        let hash = self.hash(host, actor, call_id);
        let key = CallKey::new(host, actor, call_id);
        let bytes = receipt_bytes(
            host,
            actor,
            call_id,
            receipt.result.resource.as_deref(),
            receipt.result.value.as_ref(),
        );
        self.bytes = self.bytes.saturating_add(bytes);
        self.by_age.insert((receipt.created_at, key.clone()));
        self.receipts.insert_unique(
            hash,
            Box::new(StoredReceipt {
                key,
                receipt,
                bytes,
            }),
        );
    }

    /// Takes a call id's receipt out of the table and the age index.
    fn take_out(&mut self, host: &str, actor: &str, call_id: &str) -> Option<Box<StoredReceipt>> {
        let hash = self.hash(host, actor, call_id);
        let stored = self
            .receipts
            .remove(hash, |stored| stored.key.is(host, actor, call_id))?;
        self.by_age
            .remove(&(stored.receipt.created_at, stored.key.clone()));
        self.bytes = self.bytes.saturating_sub(stored.bytes);
        Some(stored)
    }

    /// The log of stored receipts (recovery). Of two records of one call
    /// id, the first is kept.
    pub fn restore(stored: &[Record]) -> Result<ReceiptLog> {
        let mut log = ReceiptLog::default();
        for record in stored {
            let record = decode_receipt(&record.value)?;
            if log
                .get(&record.0.host, &record.0.actor, &record.0.call_id)
                .is_none()
            {
                log.put(record);
            }
        }
        Ok(log)
    }

    /// A receipt record as another replica wrote it: added, or replacing
    /// the receipt of its call id whole (its place in the age order too).
    /// Nothing is journaled.
    pub fn put(&mut self, record: StoredReceiptRecord) {
        let ReceiptRecord {
            host,
            actor,
            call_id,
            receipt,
        } = record.0;
        self.take_out(&host, &actor, &call_id);
        self.store(&host, &actor, &call_id, receipt);
    }

    /// Drops the receipt stored under this key ([`decode_receipt_key`]), as
    /// another replica did (an eviction); nothing is journaled. One not held
    /// (or held under another time) is no error.
    pub fn delete(&mut self, key: &ReceiptKey) {
        let ReceiptKey {
            created_at,
            host,
            actor,
            call_id,
        } = key;
        if self
            .get(host, actor, call_id)
            .is_some_and(|receipt| receipt.created_at == *created_at)
        {
            self.take_out(host, actor, call_id);
        }
    }

    /// Journals nothing from now on ([`Journal::stop`]).
    pub fn stop_journaling(&mut self) {
        self.journal.stop();
    }

    /// The receipts stored and evicted since the last call, in order.
    pub fn take_changes(&mut self, out: &mut Vec<Change>) -> Result<()> {
        self.journal.take_into(out)
    }
}

#[cfg(test)]
impl ReceiptLog {
    /// Every receipt, the age order and the bytes, for tests that compare
    /// two logs.
    pub(crate) fn dump(&self) -> String {
        let mut receipts: Vec<String> = self
            .receipts
            .iter()
            .map(|stored| {
                format!(
                    "{:?} {:?} {}",
                    stored.key.parts(),
                    stored.receipt,
                    stored.bytes
                )
            })
            .collect();
        receipts.sort();
        let by_age: Vec<(Timestamp, (&str, &str, &str))> = self
            .by_age
            .iter()
            .map(|(at, key)| (*at, key.parts()))
            .collect();
        format!(
            "receipts {receipts:#?}\nby age {by_age:?}\nbytes {}\n",
            self.bytes
        )
    }
}
