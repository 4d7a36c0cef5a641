//! Manifest pins made through the API, and the record of any pin (policy or API).

use std::sync::Arc;

use crate::domain::canonical::Fingerprint;
use crate::domain::clock::Timestamp;
use crate::domain::manifest::{Manifest, PinReference};

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

pub(crate) fn api_pin_record(api_pin: &ApiPin) -> PinRecord {
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
