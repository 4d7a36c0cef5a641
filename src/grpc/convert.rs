//! `TryFrom<pb::X>` for domain types and `From<domain> for pb::X`. Field
//! paths in errors are the request's own (`manifest.tools[1].name`).

use crate::canonical::{self, Fingerprint, Value};
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::manifest::{
    AssessReason, Assessment, MAX_INPUT_SCHEMA_LEN, Manifest, ManifestTool, ToolChange, ToolDiff,
};
use crate::pb;
use crate::state::{PinRecord, PinSource};

pub fn timestamp(time: Timestamp) -> prost_types::Timestamp {
    let millis = i64::try_from(time.0).unwrap_or(i64::MAX);
    prost_types::Timestamp {
        seconds: millis.div_euclid(1000),
        nanos: i32::try_from(millis.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// A required message field: `None` is an invalid argument naming it.
pub fn required<T>(value: Option<T>, field: &str) -> Result<T> {
    value.ok_or_else(|| Error::invalid(field, "is required"))
}

/// An optional fingerprint in hex; empty means absent.
pub fn optional_fingerprint(hex: &str, field: &str) -> Result<Option<Fingerprint>> {
    if hex.is_empty() {
        return Ok(None);
    }
    Fingerprint::from_hex(hex)
        .map(Some)
        .ok_or_else(|| Error::invalid(field, "must be 64 hexadecimal characters (SHA-256)"))
}

impl TryFrom<pb::Manifest> for Manifest {
    type Error = Error;

    /// Paths in errors are relative to the manifest (`tools[1].name`); the
    /// caller puts the request field in front with `Error::under`.
    fn try_from(message: pb::Manifest) -> Result<Self> {
        let tools = message
            .tools
            .into_iter()
            .enumerate()
            .map(|(index, tool)| {
                manifest_tool(tool).map_err(|error| error.under(&format!("tools[{index}]")))
            })
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(message.server_id, message.revision, tools)
    }
}

fn manifest_tool(tool: pb::ManifestTool) -> Result<ManifestTool> {
    let input_schema = if tool.input_schema_json.is_empty() {
        None
    } else {
        if tool.input_schema_json.len() > MAX_INPUT_SCHEMA_LEN {
            return Err(Error::invalid(
                "input_schema_json",
                format!("must be at most {MAX_INPUT_SCHEMA_LEN} bytes"),
            ));
        }
        let schema = canonical::parse_str(&tool.input_schema_json)
            .map_err(|error| Error::invalid("input_schema_json", error.to_string()))?;
        if !matches!(schema, Value::Object(_)) {
            return Err(Error::invalid("input_schema_json", "must be a JSON object"));
        }
        Some(schema)
    };
    Ok(ManifestTool {
        name: tool.name,
        description: tool.description,
        parameters: tool.parameters,
        read_only: tool.read_only,
        scopes: tool.scopes,
        input_schema,
    })
}

impl From<Assessment> for pb::AssessManifestResponse {
    fn from(assessment: Assessment) -> Self {
        let reason = match assessment.reason {
            AssessReason::Matched => pb::AssessReason::Matched,
            AssessReason::Changed => pb::AssessReason::Changed,
            AssessReason::Unpinned => pb::AssessReason::Unpinned,
        };
        pb::AssessManifestResponse {
            accepted: assessment.accepted,
            reason: reason.into(),
            fingerprint: assessment.fingerprint.to_hex(),
            pinned_fingerprint: assessment
                .pinned_fingerprint
                .map(|fingerprint| fingerprint.to_hex())
                .unwrap_or_default(),
            diffs: assessment
                .diffs
                .into_iter()
                .map(pb::ToolDiff::from)
                .collect(),
            diff_available: assessment.diff_available,
            pinned_revision: assessment.pinned_revision.unwrap_or_default(),
        }
    }
}

impl From<ToolDiff> for pb::ToolDiff {
    fn from(diff: ToolDiff) -> Self {
        let change = match diff.change {
            ToolChange::Added => pb::ToolChange::Added,
            ToolChange::Removed => pb::ToolChange::Removed,
            ToolChange::Modified => pb::ToolChange::Modified,
        };
        pb::ToolDiff {
            tool: diff.tool,
            change: change.into(),
            description_changed: diff.description_changed,
            parameters_changed: diff.parameters_changed,
            scopes_changed: diff.scopes_changed,
            read_only_changed: diff.read_only_changed,
            input_schema_changed: diff.input_schema_changed,
            parameters_added: diff.parameters_added,
            parameters_removed: diff.parameters_removed,
            scopes_added: diff.scopes_added,
            scopes_removed: diff.scopes_removed,
            widened: diff.widened,
        }
    }
}

impl From<PinRecord> for pb::Pin {
    fn from(record: PinRecord) -> Self {
        let source = match record.source {
            PinSource::Policy => pb::PinSource::Policy,
            PinSource::Api => pb::PinSource::Api,
        };
        pb::Pin {
            server_id: record.server_id,
            fingerprint: record.fingerprint.to_hex(),
            revision: record.revision.unwrap_or_default(),
            source: source.into(),
            pinned_by: record.pinned_by.unwrap_or_default(),
            pinned_at: record.pinned_at.map(timestamp),
            tool_count: u32::try_from(record.tool_count).unwrap_or(u32::MAX),
        }
    }
}

impl From<&Manifest> for pb::Manifest {
    fn from(manifest: &Manifest) -> Self {
        pb::Manifest {
            server_id: manifest.server_id.clone(),
            revision: manifest.revision.clone(),
            tools: manifest
                .tools
                .iter()
                .map(|tool| pb::ManifestTool {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                    read_only: tool.read_only,
                    scopes: tool.scopes.clone(),
                    input_schema_json: tool
                        .input_schema
                        .as_ref()
                        .map(canonical::to_canonical)
                        .unwrap_or_default(),
                })
                .collect(),
        }
    }
}
