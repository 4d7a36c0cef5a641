//! `[[pins]]`: the reviewed manifest fingerprints of tool servers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::parse::Loader;
use super::{PolicyError, PolicyMap};
use crate::domain::canonical::Fingerprint;
use crate::domain::manifest::{Manifest, PinReference};

/// A pin declared in the policy file.
#[derive(Debug, Clone)]
pub struct PolicyPin {
    pub server_id: String,
    pub fingerprint: Fingerprint,
    /// The reviewed manifest, when the policy names its file.
    pub manifest: Option<Arc<Manifest>>,
}

impl PinReference for PolicyPin {
    fn pinned_fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    fn pinned_manifest(&self) -> Option<&Manifest> {
        self.manifest.as_deref()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPin {
    server: String,
    fingerprint: Option<String>,
    /// Path of the reviewed manifest (JSON), relative to the policy file.
    manifest: Option<PathBuf>,
}

/// `[[pins]]`: one pin per server.
pub(super) fn pins(
    loader: &Loader<'_>,
    raw_pins: Vec<RawPin>,
) -> Result<PolicyMap<String, PolicyPin>, PolicyError> {
    let mut pins = PolicyMap::default();
    for (index, raw_pin) in raw_pins.into_iter().enumerate() {
        let key = |field: &str| format!("pins[{index}].{field}");
        let pin = pin(loader, &key, &raw_pin)?;
        if pins.insert(raw_pin.server.clone(), pin).is_some() {
            return Err(loader.error(
                key("server"),
                format!("server {:?} is pinned twice", raw_pin.server),
            ));
        }
    }
    Ok(pins)
}

/// One pin: a server id, and a fingerprint, a reviewed manifest file, or
/// both (when they agree).
fn pin(
    loader: &Loader<'_>,
    key: &impl Fn(&str) -> String,
    raw_pin: &RawPin,
) -> Result<PolicyPin, PolicyError> {
    loader.server_id(&key("server"), &raw_pin.server)?;
    let manifest = match &raw_pin.manifest {
        None => None,
        Some(relative) => Some(Arc::new(pinned_manifest(
            loader,
            &key("manifest"),
            relative,
            &raw_pin.server,
        )?)),
    };
    let fingerprint = pin_fingerprint(
        loader,
        &key("fingerprint"),
        raw_pin.fingerprint.as_deref(),
        manifest.as_deref(),
    )?;
    Ok(PolicyPin {
        server_id: raw_pin.server.clone(),
        fingerprint,
        manifest,
    })
}

/// The manifest file of a pin, relative to the policy file: readable, a
/// valid manifest, safe, and for the pinned server.
fn pinned_manifest(
    loader: &Loader<'_>,
    key: &str,
    relative: &Path,
    server: &str,
) -> Result<Manifest, PolicyError> {
    let Some(base) = loader.base_dir else {
        return Err(loader.error(key, "a manifest file needs a policy loaded from a file"));
    };
    let path = base.join(relative);
    let bytes = std::fs::read(&path)
        .map_err(|io| loader.error(key, format!("cannot read {}: {io}", path.display())))?;
    let manifest = Manifest::from_json(&bytes)
        .map_err(|invalid| loader.error(key, format!("{}: {invalid}", path.display())))?;
    if let Some(problem) = manifest.problems().first() {
        return Err(loader.error(
            key,
            format!(
                "{}: an unsafe manifest cannot be pinned: {problem}",
                path.display()
            ),
        ));
    }
    if manifest.server_id != server {
        return Err(loader.error(
            key,
            format!(
                "manifest is for server {:?}, not {:?}",
                manifest.server_id, server
            ),
        ));
    }
    Ok(manifest)
}

/// The pinned fingerprint: as declared (64 hex digits), which must match
/// the manifest file when there is one, or else the manifest file's.
fn pin_fingerprint(
    loader: &Loader<'_>,
    key: &str,
    declared: Option<&str>,
    manifest: Option<&Manifest>,
) -> Result<Fingerprint, PolicyError> {
    let declared = match declared {
        None => None,
        Some(hex) => Some(
            Fingerprint::from_hex(hex)
                .ok_or_else(|| loader.error(key, "must be 64 hexadecimal characters (SHA-256)"))?,
        ),
    };
    match (declared, manifest) {
        (Some(declared), Some(manifest)) if declared != manifest.fingerprint() => Err(loader
            .error(
                key,
                format!(
                    "does not match the manifest file, whose fingerprint is {}",
                    manifest.fingerprint()
                ),
            )),
        (Some(declared), _) => Ok(declared),
        (None, Some(manifest)) => Ok(manifest.fingerprint()),
        (None, None) => Err(loader.error(key, "is required when no manifest file is given")),
    }
}
