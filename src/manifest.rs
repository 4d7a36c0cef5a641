//! Tool-server manifests (SPEC §7): validation, fingerprint, per-tool diff
//! and the assessment against a pin.
//!
//! The fingerprint is the SHA-256 of the canonical JSON of
//! `{"revision", "server_id", "tools": [...]}` with the tools sorted by name
//! and each tool's `parameters` and `scopes` sorted; each tool is
//! `{"description", "input_schema"?, "name", "parameters", "read_only",
//! "scopes"}` (`input_schema` only when the manifest has one). Nothing else is
//! changed: duplicates inside `parameters` or `scopes` stay, strings are not
//! normalised.

use std::collections::BTreeSet;

use crate::canonical::{self, Fingerprint, Object, Value};
use crate::error::{Error, Result};
use crate::ids::check_server_id;

/// Limits that keep one manifest small enough to hold and diff cheaply.
pub const MAX_TOOLS: usize = 512;
pub const MAX_REVISION_LEN: usize = 128;
pub const MAX_DESCRIPTION_LEN: usize = 8192;
pub const MAX_LIST_ITEMS: usize = 128;
pub const MAX_ITEM_LEN: usize = 128;
pub const MAX_INPUT_SCHEMA_LEN: usize = 64 * 1024;

/// A validated manifest with its tools sorted by name (names unique) and each
/// tool's parameters and scopes sorted.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub server_id: String,
    pub revision: String,
    pub tools: Vec<ManifestTool>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ManifestTool {
    pub name: String,
    pub description: String,
    pub parameters: Vec<String>,
    pub read_only: bool,
    pub scopes: Vec<String>,
    pub input_schema: Option<Value>,
}

impl Manifest {
    /// Validates and normalises (sorts) a manifest. Field paths in errors are
    /// relative to the manifest: `tools[2].name`.
    pub fn new(server_id: String, revision: String, tools: Vec<ManifestTool>) -> Result<Self> {
        check_server_id("server_id", &server_id)?;
        if revision.chars().count() > MAX_REVISION_LEN {
            return Err(Error::invalid(
                "revision",
                format!("must be at most {MAX_REVISION_LEN} characters"),
            ));
        }
        if tools.len() > MAX_TOOLS {
            return Err(Error::invalid(
                "tools",
                format!("at most {MAX_TOOLS} tools, got {}", tools.len()),
            ));
        }
        let mut tools = tools;
        for (index, tool) in tools.iter_mut().enumerate() {
            tool.validate_and_sort()
                .map_err(|error| error.under(&format!("tools[{index}]")))?;
        }
        let mut order: Vec<usize> = (0..tools.len()).collect();
        order.sort_by(|left, right| tools[*left].name.cmp(&tools[*right].name));
        for pair in order.windows(2) {
            if tools[pair[0]].name == tools[pair[1]].name {
                let later = pair[0].max(pair[1]);
                return Err(Error::invalid(
                    format!("tools[{later}].name"),
                    format!("duplicate tool name {:?}", tools[later].name),
                ));
            }
        }
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        Ok(Manifest {
            server_id,
            revision,
            tools,
        })
    }

    /// Reads a manifest from JSON text:
    /// `{"server_id", "revision", "tools": [{"name", "description",
    /// "parameters", "read_only", "scopes", "input_schema"}]}`. Unknown keys
    /// are rejected: a field the fingerprint would not cover must not be
    /// silently dropped.
    pub fn from_json(text: &[u8]) -> Result<Self> {
        let value =
            canonical::parse(text).map_err(|error| Error::invalid("", error.to_string()))?;
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid("", "a manifest must be a JSON object"))?;
        reject_unknown_keys(object, &["server_id", "revision", "tools"], "")?;
        let server_id = required_string(object, "server_id", "server_id")?;
        let revision = optional_string(object, "revision", "revision")?.unwrap_or_default();
        let tool_values = match object.get("tools") {
            None => &[][..],
            Some(value) => value
                .as_array()
                .ok_or_else(|| Error::invalid("tools", "must be an array"))?,
        };
        let tools = tool_values
            .iter()
            .enumerate()
            .map(|(index, value)| ManifestTool::from_value(value, &format!("tools[{index}]")))
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(server_id, revision, tools)
    }

    /// The canonical structure that is hashed.
    pub fn to_value(&self) -> Value {
        let mut object = Object::new();
        object.insert("server_id", Value::from(self.server_id.as_str()));
        object.insert("revision", Value::from(self.revision.as_str()));
        let tools = self.tools.iter().map(ManifestTool::to_value).collect();
        object.insert("tools", Value::Array(tools));
        Value::Object(object)
    }

    pub fn fingerprint(&self) -> Fingerprint {
        canonical::fingerprint(&self.to_value())
    }

    fn tool(&self, name: &str) -> Option<&ManifestTool> {
        self.tools
            .binary_search_by(|tool| tool.name.as_str().cmp(name))
            .ok()
            .map(|index| &self.tools[index])
    }
}

impl ManifestTool {
    fn validate_and_sort(&mut self) -> Result<()> {
        check_server_id("name", &self.name)?;
        if self.description.chars().count() > MAX_DESCRIPTION_LEN {
            return Err(Error::invalid(
                "description",
                format!("must be at most {MAX_DESCRIPTION_LEN} characters"),
            ));
        }
        check_list("parameters", &self.parameters)?;
        check_list("scopes", &self.scopes)?;
        self.parameters.sort();
        self.scopes.sort();
        Ok(())
    }

    fn from_value(value: &Value, path: &str) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(path, "a tool must be a JSON object"))?;
        reject_unknown_keys(
            object,
            &[
                "name",
                "description",
                "parameters",
                "read_only",
                "scopes",
                "input_schema",
            ],
            path,
        )?;
        let read_only = match object.get("read_only") {
            None => false,
            Some(Value::Bool(flag)) => *flag,
            Some(_) => {
                return Err(Error::invalid(
                    format!("{path}.read_only"),
                    "must be a boolean",
                ));
            }
        };
        let input_schema = match object.get("input_schema") {
            None => None,
            Some(schema @ Value::Object(_)) => Some(schema.clone()),
            Some(_) => {
                return Err(Error::invalid(
                    format!("{path}.input_schema"),
                    "must be a JSON object",
                ));
            }
        };
        Ok(ManifestTool {
            name: required_string(object, "name", &format!("{path}.name"))?,
            description: optional_string(object, "description", &format!("{path}.description"))?
                .unwrap_or_default(),
            parameters: string_list(object, "parameters", path)?,
            read_only,
            scopes: string_list(object, "scopes", path)?,
            input_schema,
        })
    }

    fn to_value(&self) -> Value {
        let strings = |items: &[String]| {
            Value::Array(
                items
                    .iter()
                    .map(|item| Value::from(item.as_str()))
                    .collect(),
            )
        };
        let mut object = Object::new();
        object.insert("name", Value::from(self.name.as_str()));
        object.insert("description", Value::from(self.description.as_str()));
        object.insert("parameters", strings(&self.parameters));
        object.insert("read_only", Value::Bool(self.read_only));
        object.insert("scopes", strings(&self.scopes));
        if let Some(schema) = &self.input_schema {
            object.insert("input_schema", schema.clone());
        }
        Value::Object(object)
    }
}

fn check_list(field: &str, items: &[String]) -> Result<()> {
    if items.len() > MAX_LIST_ITEMS {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_LIST_ITEMS} items, got {}", items.len()),
        ));
    }
    for (index, item) in items.iter().enumerate() {
        if item.is_empty() || item.chars().count() > MAX_ITEM_LEN {
            return Err(Error::invalid(
                format!("{field}[{index}]"),
                format!("must be 1 to {MAX_ITEM_LEN} characters"),
            ));
        }
    }
    Ok(())
}

fn reject_unknown_keys(object: &Object, known: &[&str], path: &str) -> Result<()> {
    match object.keys().find(|key| !known.contains(key)) {
        None => Ok(()),
        Some(key) => {
            let field = if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            };
            Err(Error::invalid(
                field,
                format!("unknown field; expected one of {}", known.join(", ")),
            ))
        }
    }
}

fn required_string(object: &Object, key: &str, field: &str) -> Result<String> {
    optional_string(object, key, field)?.ok_or_else(|| Error::invalid(field, "is required"))
}

fn optional_string(object: &Object, key: &str, field: &str) -> Result<Option<String>> {
    match object.get(key) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(Error::invalid(
            field,
            format!("must be a string, got {}", other.kind_name()),
        )),
    }
}

fn string_list(object: &Object, key: &str, path: &str) -> Result<Vec<String>> {
    let Some(value) = object.get(key) else {
        return Ok(Vec::new());
    };
    let field = format!("{path}.{key}");
    let items = value
        .as_array()
        .ok_or_else(|| Error::invalid(&field, "must be an array of strings"))?;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_str()
                .map(str::to_string)
                .ok_or_else(|| Error::invalid(format!("{field}[{index}]"), "must be a string"))
        })
        .collect()
}

/// How one tool differs between the pinned reference and the assessed manifest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolDiff {
    pub tool: String,
    pub change: ToolChange,
    pub description_changed: bool,
    pub parameters_changed: bool,
    pub scopes_changed: bool,
    pub read_only_changed: bool,
    pub input_schema_changed: bool,
    pub parameters_added: Vec<String>,
    pub parameters_removed: Vec<String>,
    pub scopes_added: Vec<String>,
    pub scopes_removed: Vec<String>,
    /// The tool can do more than was reviewed: new, new scopes, or no longer
    /// read-only.
    pub widened: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolChange {
    #[default]
    Added,
    Removed,
    Modified,
}

/// Per-tool differences from `reference` to `current`, sorted by tool name;
/// unchanged tools are omitted.
pub fn diff(reference: &Manifest, current: &Manifest) -> Vec<ToolDiff> {
    let names: BTreeSet<&str> = reference
        .tools
        .iter()
        .chain(&current.tools)
        .map(|tool| tool.name.as_str())
        .collect();
    names
        .into_iter()
        .filter_map(|name| match (reference.tool(name), current.tool(name)) {
            (None, Some(_)) => Some(ToolDiff {
                tool: name.to_string(),
                change: ToolChange::Added,
                widened: true,
                ..ToolDiff::default()
            }),
            (Some(_), None) => Some(ToolDiff {
                tool: name.to_string(),
                change: ToolChange::Removed,
                ..ToolDiff::default()
            }),
            (Some(before), Some(after)) if before != after => Some(tool_diff(before, after)),
            _ => None,
        })
        .collect()
}

fn tool_diff(before: &ManifestTool, after: &ManifestTool) -> ToolDiff {
    let parameters_added = sorted_difference(&after.parameters, &before.parameters);
    let parameters_removed = sorted_difference(&before.parameters, &after.parameters);
    let scopes_added = sorted_difference(&after.scopes, &before.scopes);
    let scopes_removed = sorted_difference(&before.scopes, &after.scopes);
    let read_only_changed = before.read_only != after.read_only;
    ToolDiff {
        tool: after.name.clone(),
        change: ToolChange::Modified,
        description_changed: before.description != after.description,
        parameters_changed: before.parameters != after.parameters,
        scopes_changed: before.scopes != after.scopes,
        read_only_changed,
        input_schema_changed: before.input_schema != after.input_schema,
        widened: !scopes_added.is_empty() || (before.read_only && !after.read_only),
        parameters_added,
        parameters_removed,
        scopes_added,
        scopes_removed,
    }
}

/// Items of sorted `left` that are not in sorted `right` (deduplicated).
fn sorted_difference(left: &[String], right: &[String]) -> Vec<String> {
    let mut out: Vec<String> = left
        .iter()
        .filter(|item| right.binary_search(item).is_err())
        .cloned()
        .collect();
    out.dedup();
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssessReason {
    Matched,
    Changed,
    Unpinned,
}

impl AssessReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AssessReason::Matched => "matched",
            AssessReason::Changed => "changed",
            AssessReason::Unpinned => "unpinned",
        }
    }
}

/// The answer to "has this server changed since review?".
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub accepted: bool,
    pub reason: AssessReason,
    pub fingerprint: Fingerprint,
    pub pinned_fingerprint: Option<Fingerprint>,
    pub pinned_revision: Option<String>,
    pub diffs: Vec<ToolDiff>,
    pub diff_available: bool,
}

/// What a pin holds: the trusted fingerprint and, when known, the reviewed
/// manifest itself (for diffs).
pub trait PinReference {
    fn pinned_fingerprint(&self) -> Fingerprint;
    fn pinned_manifest(&self) -> Option<&Manifest>;
}

/// Compares a manifest with its pin. A hash inside the manifest is never
/// trusted: the fingerprint is always computed here.
pub fn assess(manifest: &Manifest, pin: Option<&dyn PinReference>) -> Assessment {
    let fingerprint = manifest.fingerprint();
    let Some(pin) = pin else {
        return Assessment {
            accepted: false,
            reason: AssessReason::Unpinned,
            fingerprint,
            pinned_fingerprint: None,
            pinned_revision: None,
            diffs: Vec::new(),
            diff_available: false,
        };
    };
    let pinned_fingerprint = pin.pinned_fingerprint();
    let matched = pinned_fingerprint == fingerprint;
    let reference = pin.pinned_manifest();
    Assessment {
        accepted: matched,
        reason: if matched {
            AssessReason::Matched
        } else {
            AssessReason::Changed
        },
        fingerprint,
        pinned_fingerprint: Some(pinned_fingerprint),
        pinned_revision: reference.map(|reference| reference.revision.clone()),
        diffs: reference
            .map(|reference| diff(reference, manifest))
            .unwrap_or_default(),
        diff_available: reference.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, scopes: &[&str]) -> ManifestTool {
        ManifestTool {
            name: name.to_string(),
            description: format!("{name} tool"),
            parameters: vec!["b".into(), "a".into()],
            read_only: true,
            scopes: scopes.iter().map(|scope| scope.to_string()).collect(),
            input_schema: None,
        }
    }

    #[test]
    fn fingerprint_ignores_tool_parameter_and_scope_order() {
        let one = Manifest::new(
            "srv".into(),
            "1".into(),
            vec![tool("b", &["y", "x"]), tool("a", &["z"])],
        )
        .unwrap();
        let two = Manifest::new(
            "srv".into(),
            "1".into(),
            vec![tool("a", &["z"]), tool("b", &["x", "y"])],
        )
        .unwrap();
        assert_eq!(one.fingerprint(), two.fingerprint());
        assert_eq!(one.tools[0].name, "a");
        assert_eq!(one.tools[1].parameters, vec!["a", "b"]);
    }

    #[test]
    fn fingerprint_covers_every_field() {
        let base = Manifest::new("srv".into(), "1".into(), vec![tool("a", &["x"])]).unwrap();
        let mut variants = Vec::new();
        let mut changed = base.clone();
        changed.revision = "2".into();
        variants.push(changed);
        let mut changed = base.clone();
        changed.server_id = "srv2".into();
        variants.push(changed);
        let mut changed = base.clone();
        changed.tools[0].description.push('!');
        variants.push(changed);
        let mut changed = base.clone();
        changed.tools[0].read_only = false;
        variants.push(changed);
        let mut changed = base.clone();
        changed.tools[0].scopes.push("y".into());
        variants.push(changed);
        let mut changed = base.clone();
        changed.tools[0].parameters.push("c".into());
        variants.push(changed);
        let mut changed = base.clone();
        changed.tools[0].input_schema = Some(Value::Object(Object::new()));
        variants.push(changed);
        for variant in variants {
            assert_ne!(variant.fingerprint(), base.fingerprint(), "{variant:?}");
        }
    }

    #[test]
    fn duplicate_tool_names_name_the_later_index() {
        let error = Manifest::new(
            "srv".into(),
            "1".into(),
            vec![tool("a", &[]), tool("b", &[]), tool("a", &[])],
        )
        .unwrap_err();
        assert_eq!(
            error,
            Error::invalid("tools[2].name", "duplicate tool name \"a\"")
        );
    }

    #[test]
    fn json_manifest_rejects_unknown_fields() {
        let error =
            Manifest::from_json(br#"{"server_id":"s","tools":[{"name":"a","sha256":"x"}]}"#)
                .unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { ref field, .. } if field == "tools[0].sha256"),
            "{error:?}"
        );
    }

    #[test]
    fn diff_reports_added_removed_and_widened_scopes() {
        let reference = Manifest::new(
            "srv".into(),
            "1".into(),
            vec![tool("keep", &["read"]), tool("gone", &[])],
        )
        .unwrap();
        let mut widened = tool("keep", &["read", "write"]);
        widened.read_only = false;
        let current =
            Manifest::new("srv".into(), "2".into(), vec![widened, tool("new", &[])]).unwrap();
        let diffs = diff(&reference, &current);
        let summary: Vec<(&str, ToolChange, bool)> = diffs
            .iter()
            .map(|diff| (diff.tool.as_str(), diff.change, diff.widened))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("gone", ToolChange::Removed, false),
                ("keep", ToolChange::Modified, true),
                ("new", ToolChange::Added, true),
            ]
        );
        assert_eq!(diffs[1].scopes_added, vec!["write"]);
        assert!(diffs[1].read_only_changed);
        assert!(!diffs[1].description_changed);
    }
}
