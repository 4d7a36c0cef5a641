//! `[state]`: the initial versioned state for Dispatch.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::PolicyError;
use super::decode::toml_to_json;
use super::parse::Loader;
use crate::domain::canonical::{self, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionScope {
    /// One version for the whole state, bumped by every commit.
    Global,
    /// Each resource has its own version.
    Resource,
}

/// Initial versioned state for Dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct StatePolicy {
    pub version_scope: VersionScope,
    pub resources: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    #[serde(default = "default_scope")]
    version_scope: VersionScope,
    #[serde(default)]
    resources: BTreeMap<String, toml::Value>,
}

impl Default for RawState {
    fn default() -> Self {
        RawState {
            version_scope: default_scope(),
            resources: BTreeMap::new(),
        }
    }
}

fn default_scope() -> VersionScope {
    VersionScope::Global
}

pub(super) fn state_policy(loader: &Loader<'_>, raw: RawState) -> Result<StatePolicy, PolicyError> {
    let mut resources = BTreeMap::new();
    for (name, value) in raw.resources {
        let key = format!("state.resources.{name}");
        if name.is_empty() || name.len() > 64 {
            return Err(loader.error(key, "resource names are 1 to 64 characters"));
        }
        let json = toml_to_json(&value, "").map_err(|error| loader.error(&key, error))?;
        let text =
            serde_json::to_string(&json).map_err(|error| loader.error(&key, error.to_string()))?;
        let value =
            canonical::parse_str(&text).map_err(|error| loader.error(&key, error.to_string()))?;
        resources.insert(name, value);
    }
    Ok(StatePolicy {
        version_scope: raw.version_scope,
        resources,
    })
}
