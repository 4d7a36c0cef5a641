//! `State`: everything toolgate remembers between calls. Every RPC is one
//! method on this one type, called with the policy snapshot and the time, so
//! that a durable or replicated backend can implement the same operations.

use std::collections::HashMap;
use std::sync::Arc;

use crate::canonical::Fingerprint;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::manifest::{self, Assessment, Manifest, PinReference};
use crate::policy::Policy;

/// Most pins that may be made through the API.
pub const MAX_API_PINS: usize = 1024;

/// A pin made by a reviewer through `PinManifest`; survives policy reloads.
#[derive(Debug, Clone)]
pub struct ApiPin {
    pub manifest: Arc<Manifest>,
    pub fingerprint: Fingerprint,
    pub pinned_by: String,
    pub pinned_at: Timestamp,
}

impl PinReference for ApiPin {
    fn pinned_fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    fn pinned_manifest(&self) -> Option<&Manifest> {
        Some(&self.manifest)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinSource {
    Policy,
    Api,
}

/// A pin as reported to reviewers.
#[derive(Debug, Clone, PartialEq)]
pub struct PinRecord {
    pub server_id: String,
    pub fingerprint: Fingerprint,
    pub revision: Option<String>,
    pub source: PinSource,
    pub pinned_by: Option<String>,
    pub pinned_at: Option<Timestamp>,
    pub tool_count: usize,
}

#[derive(Debug, Default)]
pub struct State {
    api_pins: HashMap<String, ApiPin>,
    /// Fingerprint of the latest assessment per pinned server.
    last_assessed: HashMap<String, Fingerprint>,
}

impl State {
    /// The pin in force: an API pin overrides the policy file's.
    fn pin<'a>(&'a self, policy: &'a Policy, server_id: &str) -> Option<&'a dyn PinReference> {
        match self.api_pins.get(server_id) {
            Some(api_pin) => Some(api_pin),
            None => policy
                .pins
                .get(server_id)
                .map(|pin| pin as &dyn PinReference),
        }
    }

    /// AssessManifest: compares with the pin in force and remembers the
    /// result for pinned servers (unpinned ones are not remembered, so a
    /// flood of made-up server ids cannot grow the state).
    pub fn assess_manifest(&mut self, policy: &Policy, manifest: &Manifest) -> Assessment {
        let pin = self.pin(policy, &manifest.server_id);
        let assessment = manifest::assess(manifest, pin);
        if pin.is_some() {
            self.last_assessed
                .insert(manifest.server_id.clone(), assessment.fingerprint);
        }
        assessment
    }

    /// True when the server has a pin and its latest assessment matched the
    /// pin in force now (a later re-pin needs a new assessment).
    pub fn manifest_verified(&self, policy: &Policy, server_id: &str) -> bool {
        match (
            self.pin(policy, server_id),
            self.last_assessed.get(server_id),
        ) {
            (Some(pin), Some(assessed)) => pin.pinned_fingerprint() == *assessed,
            _ => false,
        }
    }

    pub fn pin_manifest(
        &mut self,
        now: Timestamp,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
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
        let record = api_pin_record(&api_pin);
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
            if !policy.pins.contains_key(server_id) {
                self.last_assessed.remove(server_id);
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

fn api_pin_record(api_pin: &ApiPin) -> PinRecord {
    PinRecord {
        server_id: api_pin.manifest.server_id.clone(),
        fingerprint: api_pin.fingerprint,
        revision: Some(api_pin.manifest.revision.clone()),
        source: PinSource::Api,
        pinned_by: Some(api_pin.pinned_by.clone()),
        pinned_at: Some(api_pin.pinned_at),
        tool_count: api_pin.manifest.tools.len(),
    }
}
