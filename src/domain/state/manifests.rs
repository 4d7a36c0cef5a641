//! AssessManifest and the pins (SPEC §7).

use std::sync::Arc;

use crate::domain::canonical::{self, Fingerprint};
use crate::domain::clock::Timestamp;
use crate::domain::error::{Error, Result};
use crate::domain::manifest::{
    self, Assessment, LastAssessment, Manifest, ManifestStatus, PinReference,
};
use crate::domain::pins::{ApiPin, MAX_API_PINS, PinRecord, PinSource};
use crate::domain::policy::Policy;
use crate::domain::records::Kind;

use super::*;
use crate::domain::pins::api_pin_record;

impl State {
    /// The pin in force: an API pin overrides the policy file's.
    pub(super) fn pin<'a>(
        &'a self,
        policy: &'a Policy,
        server_id: &str,
    ) -> Option<&'a dyn PinReference> {
        match self.api_pins.get(server_id) {
            Some(api_pin) => Some(api_pin),
            None => policy
                .pins
                .get(server_id)
                .map(|pin| pin as &dyn PinReference),
        }
    }

    /// AssessManifest: compares with the pin in force and remembers the
    /// result (the manifest's fingerprint and safety, whatever the pin) for
    /// pinned servers. A server never pinned is not remembered, so a flood
    /// of made-up server ids cannot grow the state; one remembered from
    /// when it had a pin is updated: this manifest is its latest, which a
    /// pin put back by a reload (or held by another replica's policy) is
    /// compared with.
    pub fn assess_manifest(&mut self, policy: &Policy, manifest: &Manifest) -> Assessment {
        let pin = self.pin(policy, &manifest.server_id);
        let assessment = manifest::assess(manifest, pin);
        if pin.is_none() && !self.last_assessed.contains_key(&manifest.server_id) {
            return assessment;
        }
        // The same assessment again (a server asked again, unchanged)
        // changes nothing, so nothing is written: its answer waits for no
        // sync of its own.
        let last = LastAssessment::from(&assessment);
        if self.last_assessed.get(&manifest.server_id) != Some(&last) {
            let key = manifest.server_id.as_bytes().to_vec();
            self.journal.put(Kind::Assessment, key, &last);
            self.last_assessed.insert(manifest.server_id.clone(), last);
        }
        assessment
    }

    /// True when the server has a pin and its latest assessment matched the
    /// pin in force now (a re-pin to another fingerprint is verified by an
    /// assessment that matches it, the latest one included).
    pub fn manifest_verified(&self, policy: &Policy, server_id: &str) -> bool {
        self.manifest_status(policy, server_id) == ManifestStatus::Verified
    }

    /// Why a manifest server's tools may or may not be decided on.
    pub fn manifest_status(&self, policy: &Policy, server_id: &str) -> ManifestStatus {
        ManifestStatus::of(
            self.pin(policy, server_id),
            self.last_assessed.get(server_id),
        )
    }

    pub fn pin_manifest(
        &mut self,
        now: Timestamp,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
        if let Err(error) = crate::domain::ids::check_server_id("server", &manifest.server_id) {
            return Err(Error::FailedPrecondition(format!(
                "server id {:?} cannot be pinned ({error}); nothing was pinned",
                manifest.server_id
            )));
        }
        if let Some(problem) = manifest.problems().first() {
            return Err(Error::FailedPrecondition(format!(
                "an unsafe manifest cannot be pinned: {problem}; nothing was pinned"
            )));
        }
        let fingerprint = manifest.fingerprint();
        if let Some(expected) = expected
            && expected != fingerprint
        {
            return Err(Error::FailedPrecondition(format!(
                "manifest fingerprint is {fingerprint}, not the expected {expected}; nothing was pinned"
            )));
        }
        if !self.api_pins.contains_key(&manifest.server_id) && self.api_pins.len() >= MAX_API_PINS {
            return Err(Error::ResourceExhausted(format!(
                "at most {MAX_API_PINS} pins may be made through the API"
            )));
        }
        let api_pin = ApiPin {
            manifest: Arc::new(manifest),
            fingerprint,
            pinned_by: reviewer.to_string(),
            pinned_at: now,
        };
        // What is pinned must read back at the next start, where the stored
        // text is read as a manifest file (its size, its depth): a manifest
        // that only fits the API's per-field limits would stop the restart.
        let stored = StoredPin::of(&api_pin);
        if let Err(error) = Manifest::from_json(stored.manifest.as_bytes()) {
            return Err(Error::FailedPrecondition(format!(
                "this manifest cannot be pinned: its canonical JSON ({} bytes) does not read \
                 back as a manifest ({error}); nothing was pinned",
                stored.manifest.len()
            )));
        }
        let record = api_pin_record(&api_pin);
        let key = record.server_id.as_bytes().to_vec();
        self.journal.put(Kind::Pin, key, &stored);
        self.api_pins.insert(record.server_id.clone(), api_pin);
        Ok(record)
    }

    /// Pins in force, sorted by server id.
    pub fn list_pins(&self, policy: &Policy) -> Vec<PinRecord> {
        let mut records: Vec<PinRecord> = self.api_pins.values().map(api_pin_record).collect();
        records.extend(
            policy
                .pins
                .values()
                .filter(|pin| !self.api_pins.contains_key(&pin.server_id))
                .map(|pin| PinRecord {
                    server_id: pin.server_id.clone(),
                    fingerprint: pin.fingerprint,
                    revision: pin
                        .manifest
                        .as_ref()
                        .map(|manifest| manifest.revision.clone()),
                    source: PinSource::Policy,
                    pinned_by: None,
                    pinned_at: None,
                    tool_count: pin
                        .manifest
                        .as_ref()
                        .map_or(0, |manifest| manifest.tools.len()),
                }),
        );
        records.sort_by(|left, right| left.server_id.cmp(&right.server_id));
        records
    }

    /// Removes an API pin. A policy pin is changed by editing the policy.
    pub fn remove_pin(&mut self, policy: &Policy, server_id: &str) -> Result<PinRecord> {
        if let Some(api_pin) = self.api_pins.remove(server_id) {
            self.journal
                .delete(Kind::Pin, server_id.as_bytes().to_vec());
            if !policy.pins.contains_key(server_id) {
                self.last_assessed.remove(server_id);
                self.journal
                    .delete(Kind::Assessment, server_id.as_bytes().to_vec());
            }
            return Ok(api_pin_record(&api_pin));
        }
        if policy.pins.contains_key(server_id) {
            return Err(Error::FailedPrecondition(format!(
                "the pin for {server_id:?} is declared in the policy file; edit the policy to change it"
            )));
        }
        Err(Error::NotFound(format!("no pin for server {server_id:?}")))
    }
}

/// An API pin as it is stored: the manifest as its canonical JSON text
/// (the form `Manifest::from_json` reads).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct StoredPin {
    manifest: String,
    fingerprint: Fingerprint,
    pinned_by: String,
    pinned_at: Timestamp,
}

impl StoredPin {
    fn of(pin: &ApiPin) -> Self {
        StoredPin {
            manifest: canonical::to_canonical(&pin.manifest.to_value()),
            fingerprint: pin.fingerprint,
            pinned_by: pin.pinned_by.clone(),
            pinned_at: pin.pinned_at,
        }
    }

    /// The pin, when its manifest still has the fingerprint it was pinned
    /// with.
    pub(super) fn into_pin(self) -> Result<ApiPin> {
        let manifest = Manifest::from_json(self.manifest.as_bytes())?;
        if manifest.fingerprint() != self.fingerprint {
            return Err(Error::Internal(format!(
                "the stored pin of {:?} does not match its fingerprint; run `toolgate store check`",
                manifest.server_id
            )));
        }
        Ok(ApiPin {
            manifest: Arc::new(manifest),
            fingerprint: self.fingerprint,
            pinned_by: self.pinned_by,
            pinned_at: self.pinned_at,
        })
    }
}
