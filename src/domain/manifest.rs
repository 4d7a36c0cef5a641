//! Tool-server manifests (SPEC §7): reading, fingerprint, per-tool diff and
//! the assessment against a pin.
//!
//! The fingerprint is the reference algorithm's, byte for byte: the SHA-256
//! of the canonical JSON (SPEC §1) of the record
//! `{"server", "revision", "tools": [{"tool", "description", "parameters",
//! "read_only", "scopes"}]}` after sorting `tools` by `tool` (a stable sort,
//! like Python's) and each tool's `parameters` and `scopes`. An MCP tool's
//! `title`, `inputSchema`, `outputSchema` and `annotations` are hashed under
//! those names, and only when present. Nothing else is changed: duplicates
//! inside `parameters` or `scopes` stay, strings are not normalised.
//!
//! Content the reference fingerprints is never refused as malformed: any
//! string is a valid tool name, scope or parameter. Only the shape (a missing
//! field, a wrong type, a size limit) is an invalid argument. A manifest that
//! is unsafe to accept (two tools with one name, an empty tool name) still
//! gets its fingerprint; [`Manifest::problems`] says why it is unsafe, an
//! assessment of it is never accepted and it cannot be pinned.

use std::collections::BTreeSet;

use crate::domain::canonical::{self, Fingerprint, Object, Value};
use crate::domain::error::{Error, Result};

/// Limits that keep one manifest small enough to hold and diff cheaply.
/// They bound size only; they never judge content.
pub const MAX_TOOLS: usize = 512;
/// Server id, revision, tool name, title, each parameter and scope.
pub const MAX_NAME_LEN: usize = 1024;
pub const MAX_REVISION_LEN: usize = MAX_NAME_LEN;
pub const MAX_DESCRIPTION_LEN: usize = 8192;
pub const MAX_LIST_ITEMS: usize = 128;
pub const MAX_ITEM_LEN: usize = MAX_NAME_LEN;
/// Each JSON field (`inputSchema`, `outputSchema`, `annotations`), as text.
pub const MAX_INPUT_SCHEMA_LEN: usize = 64 * 1024;
/// A manifest file (either form) read by the CLI or the policy loader.
pub const MAX_MANIFEST_FILE_BYTES: usize = 4 * 1024 * 1024;

/// A manifest with its tools stably sorted by name and each tool's
/// parameters and scopes sorted. Names may repeat or be empty (see
/// [`Manifest::problems`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Hashed as `server`.
    pub server_id: String,
    pub revision: String,
    pub tools: Vec<ManifestTool>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ManifestTool {
    /// Hashed as `tool`.
    pub name: String,
    pub description: String,
    pub parameters: Vec<String>,
    pub read_only: bool,
    pub scopes: Vec<String>,
    /// MCP `title`, hashed only when present.
    pub title: Option<String>,
    /// MCP `inputSchema` (a JSON object), hashed only when present.
    pub input_schema: Option<Value>,
    /// MCP `outputSchema` (a JSON object), hashed only when present.
    pub output_schema: Option<Value>,
    /// MCP `annotations` (a JSON object), hashed only when present.
    pub annotations: Option<Value>,
}

/// Which of the two accepted JSON forms a manifest file was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestForm {
    /// `{"server", "revision", "tools": [{"tool", …}]}`.
    Reference,
    /// An MCP `tools/list` result (`{"tools": [{"name", …}]}`, bare or inside
    /// a JSON-RPC response), with the server id and revision given apart.
    McpToolsList,
}

impl ManifestForm {
    pub fn as_str(self) -> &'static str {
        match self {
            ManifestForm::Reference => "reference manifest",
            ManifestForm::McpToolsList => "MCP tools/list result",
        }
    }
}

/// Why a manifest is unsafe to accept although it has a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The tool name concerned (possibly empty).
    pub tool: String,
    pub kind: ProblemKind,
    /// How many tools carry this name.
    pub count: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Two or more tools share one name: which one a host calls is ambiguous.
    DuplicateName,
    /// A tool has an empty name.
    EmptyName,
}

impl ProblemKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::DuplicateName => "duplicate-tool-name",
            ProblemKind::EmptyName => "empty-tool-name",
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ProblemKind::EmptyName if self.count > 1 => {
                write!(formatter, "{} tools have an empty name", self.count)
            }
            ProblemKind::EmptyName => formatter.write_str("a tool has an empty name"),
            ProblemKind::DuplicateName => write!(
                formatter,
                "{} tools are named {:?}; tool names must be unique",
                self.count, self.tool
            ),
        }
    }
}

/// At most [`MAX_TOOLS`] tools: checked before a request's tools are read
/// (each one's JSON parsed), and again by [`Manifest::new`].
pub fn check_tool_count(count: usize) -> Result<()> {
    if count > MAX_TOOLS {
        return Err(Error::invalid(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {count}"),
        ));
    }
    Ok(())
}

impl Manifest {
    /// Checks the size limits and sorts. Field paths in errors are relative
    /// to the manifest: `tools[2].description`.
    pub fn new(server_id: String, revision: String, tools: Vec<ManifestTool>) -> Result<Self> {
        check_len("server", &server_id, MAX_NAME_LEN)?;
        check_len("revision", &revision, MAX_REVISION_LEN)?;
        check_tool_count(tools.len())?;
        let mut tools = tools;
        for (index, tool) in tools.iter_mut().enumerate() {
            tool.check_and_sort()
                .map_err(|error| error.under(&format!("tools[{index}]")))?;
        }
        // Stable, like Python's `sorted`: tools of one name keep their order.
        tools.sort_by(|left, right| left.name.cmp(&right.name));
        Ok(Manifest {
            server_id,
            revision,
            tools,
        })
    }

    /// Why this manifest is unsafe to accept or pin, in tool-name order;
    /// empty when it is safe.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for group in self.tools.chunk_by(|left, right| left.name == right.name) {
            let name = &group[0].name;
            if name.is_empty() {
                problems.push(Problem {
                    tool: String::new(),
                    kind: ProblemKind::EmptyName,
                    count: group.len(),
                });
            } else if group.len() > 1 {
                problems.push(Problem {
                    tool: name.clone(),
                    kind: ProblemKind::DuplicateName,
                    count: group.len(),
                });
            }
        }
        problems
    }

    /// Reads a manifest in the reference JSON form:
    /// `{"server", "revision", "tools": [{"tool", "description",
    /// "parameters", "read_only", "scopes"}]}`, each tool optionally with
    /// MCP's `title`, `inputSchema`, `outputSchema`, `annotations`. Every
    /// field of the reference record is required; unknown keys are
    /// rejected, so that nothing the fingerprint would not cover is silently
    /// dropped.
    pub fn from_json(text: &[u8]) -> Result<Self> {
        let value = parse_file(text)?;
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid("", "a manifest must be a JSON object"))?;
        reject_unknown_keys(object, &["server", "revision", "tools"], "")?;
        let server_id = required_string(object, "server", "server")?;
        let revision = required_string(object, "revision", "revision")?;
        let tool_values = required_array(object, "tools", "tools")?;
        let tools = tool_values
            .iter()
            .enumerate()
            .map(|(index, value)| ManifestTool::from_reference(value, &format!("tools[{index}]")))
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(server_id, revision, tools)
    }

    /// Reads an MCP `tools/list` result — `{"tools": [...], "nextCursor"?}`,
    /// bare or as the `result` of a JSON-RPC response — for the given server
    /// id and revision. Each MCP tool becomes a reference tool: `tool` is its
    /// `name`, `description` its description (`""` when absent),
    /// `parameters` the property names of its `inputSchema`, `read_only` its
    /// `annotations.readOnlyHint` (false when absent) and `scopes` empty; its
    /// `title`, `inputSchema`, `outputSchema` and `annotations` are kept and
    /// hashed under those names. `_meta` is ignored (MCP's out-of-band
    /// metadata); any other key is rejected. A page with a `nextCursor` is
    /// refused: a fingerprint of part of the tools would prove nothing.
    pub fn from_mcp_tools_list(text: &[u8], server_id: String, revision: String) -> Result<Self> {
        let value = parse_file(text)?;
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid("", "a tools/list result must be a JSON object"))?;
        let is_envelope = object.get("tools").is_none()
            && (object.get("result").is_some() || object.get("error").is_some());
        let (result, prefix) = if is_envelope {
            reject_unknown_keys(object, &["jsonrpc", "id", "result", "error"], "")?;
            if object.get("error").is_some() {
                return Err(Error::invalid(
                    "error",
                    "a JSON-RPC error response, not a tools/list result",
                ));
            }
            let result = object
                .get("result")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    Error::invalid("result", "a tools/list result must be a JSON object")
                })?;
            (result, "result.")
        } else {
            (object, "")
        };
        reject_unknown_keys(
            result,
            &["tools", "nextCursor", "_meta"],
            prefix.trim_end_matches('.'),
        )?;
        match result.get("nextCursor") {
            None | Some(Value::Null) => {}
            Some(_) => {
                return Err(Error::invalid(
                    format!("{prefix}nextCursor"),
                    "this is one page of a paginated tools/list; fetch every page and join their tools",
                ));
            }
        }
        let tools_path = format!("{prefix}tools");
        let tool_values = required_array(result, "tools", &tools_path)?;
        let tools = tool_values
            .iter()
            .enumerate()
            .map(|(index, value)| ManifestTool::from_mcp(value, &format!("{tools_path}[{index}]")))
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(server_id, revision, tools)
    }

    /// The record that is hashed, under the reference's key names.
    pub fn to_value(&self) -> Value {
        let mut object = Object::new();
        object.insert("server", Value::from(self.server_id.as_str()));
        object.insert("revision", Value::from(self.revision.as_str()));
        let tools = self.tools.iter().map(ManifestTool::to_value).collect();
        object.insert("tools", Value::Array(tools));
        Value::Object(object)
    }

    /// The fingerprint of [`Manifest::to_value`], streamed from the
    /// manifest into the hasher without building that tree.
    pub fn fingerprint(&self) -> Fingerprint {
        canonical::fingerprint_object(|manifest| {
            manifest.member_str("revision", &self.revision);
            manifest.member_str("server", &self.server_id);
            manifest.member_objects("tools", &self.tools, |members, tool| tool.hash(members));
        })
    }

    /// Whether the two print the same canonical JSON ([`Manifest::to_value`]),
    /// and so have the same fingerprint: a comparison, much cheaper than
    /// the fingerprint's canonical text and SHA-256.
    pub fn identical(&self, other: &Manifest) -> bool {
        let Manifest {
            server_id,
            revision,
            tools,
        } = self;
        *server_id == other.server_id
            && *revision == other.revision
            && tools.len() == other.tools.len()
            && tools
                .iter()
                .zip(&other.tools)
                .all(|(left, right)| left.identical(right))
    }

    /// The tool of that name; only meaningful for a manifest without problems.
    fn tool(&self, name: &str) -> Option<&ManifestTool> {
        self.tools
            .binary_search_by(|tool| tool.name.as_str().cmp(name))
            .ok()
            .map(|index| &self.tools[index])
    }
}

/// Tells the two JSON forms apart: a top-level `server` key (or the old
/// `server_id`) means the reference form, anything else an MCP result.
pub fn detect_form(text: &[u8]) -> Result<ManifestForm> {
    let value = parse_file(text)?;
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid("", "a manifest must be a JSON object"))?;
    if object.get("server").is_some()
        || object.get("revision").is_some()
        || object.get("server_id").is_some()
    {
        Ok(ManifestForm::Reference)
    } else {
        Ok(ManifestForm::McpToolsList)
    }
}

fn parse_file(text: &[u8]) -> Result<Value> {
    if text.len() > MAX_MANIFEST_FILE_BYTES {
        return Err(Error::invalid(
            "",
            format!("a manifest file must be at most {MAX_MANIFEST_FILE_BYTES} bytes"),
        ));
    }
    canonical::parse(text).map_err(|error| Error::invalid("", error.to_string()))
}

impl ManifestTool {
    fn check_and_sort(&mut self) -> Result<()> {
        check_len("tool", &self.name, MAX_NAME_LEN)?;
        check_len("description", &self.description, MAX_DESCRIPTION_LEN)?;
        if let Some(title) = &self.title {
            check_len("title", title, MAX_NAME_LEN)?;
        }
        check_list("parameters", &self.parameters)?;
        check_list("scopes", &self.scopes)?;
        for (field, value) in [
            ("inputSchema", &self.input_schema),
            ("outputSchema", &self.output_schema),
            ("annotations", &self.annotations),
        ] {
            if let Some(value) = value {
                check_json_field(field, value)?;
            }
        }
        self.parameters.sort();
        self.scopes.sort();
        Ok(())
    }

    fn from_reference(value: &Value, path: &str) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(path, "a tool must be a JSON object"))?;
        reject_unknown_keys(
            object,
            &[
                "tool",
                "description",
                "parameters",
                "read_only",
                "scopes",
                "title",
                "inputSchema",
                "outputSchema",
                "annotations",
            ],
            path,
        )?;
        let field = |key: &str| format!("{path}.{key}");
        let read_only = match object.get("read_only") {
            None => return Err(Error::invalid(field("read_only"), "is required")),
            Some(Value::Bool(flag)) => *flag,
            Some(other) => {
                return Err(Error::invalid(
                    field("read_only"),
                    format!("must be a boolean, got {}", other.kind_name()),
                ));
            }
        };
        Ok(ManifestTool {
            name: required_string(object, "tool", &field("tool"))?,
            description: required_string(object, "description", &field("description"))?,
            parameters: string_list(object, "parameters", path)?,
            read_only,
            scopes: string_list(object, "scopes", path)?,
            title: optional_string(object, "title", &field("title"))?,
            input_schema: optional_object(object, "inputSchema", path)?,
            output_schema: optional_object(object, "outputSchema", path)?,
            annotations: optional_object(object, "annotations", path)?,
        })
    }

    fn from_mcp(value: &Value, path: &str) -> Result<Self> {
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(path, "a tool must be a JSON object"))?;
        reject_unknown_keys(
            object,
            &[
                "name",
                "title",
                "description",
                "inputSchema",
                "outputSchema",
                "annotations",
                "_meta",
            ],
            path,
        )?;
        let field = |key: &str| format!("{path}.{key}");
        let input_schema = optional_object(object, "inputSchema", path)?;
        let parameters = input_schema
            .as_ref()
            .and_then(|schema| schema.as_object())
            .and_then(|schema| schema.get("properties"))
            .and_then(Value::as_object)
            .map(|properties| properties.keys().map(str::to_string).collect())
            .unwrap_or_default();
        let annotations = optional_object(object, "annotations", path)?;
        let read_only = match annotations
            .as_ref()
            .and_then(|annotations| annotations.as_object())
            .and_then(|annotations| annotations.get("readOnlyHint"))
        {
            None | Some(Value::Null) => false,
            Some(Value::Bool(flag)) => *flag,
            Some(other) => {
                return Err(Error::invalid(
                    field("annotations.readOnlyHint"),
                    format!("must be a boolean, got {}", other.kind_name()),
                ));
            }
        };
        Ok(ManifestTool {
            name: required_string(object, "name", &field("name"))?,
            description: optional_string(object, "description", &field("description"))?
                .unwrap_or_default(),
            parameters,
            read_only,
            scopes: Vec::new(),
            title: optional_string(object, "title", &field("title"))?,
            input_schema,
            output_schema: optional_object(object, "outputSchema", path)?,
            annotations,
        })
    }

    /// Its members in [`ManifestTool::to_value`], in key order.
    fn hash(&self, members: &mut canonical::Members<'_>) {
        let optional = |members: &mut canonical::Members<'_>, key, value: &Option<Value>| {
            if let Some(value) = value {
                members.member(key, value);
            }
        };
        optional(members, "annotations", &self.annotations);
        members.member_str("description", &self.description);
        optional(members, "inputSchema", &self.input_schema);
        optional(members, "outputSchema", &self.output_schema);
        members.member_strs("parameters", &self.parameters);
        members.member_bool("read_only", self.read_only);
        members.member_strs("scopes", &self.scopes);
        if let Some(title) = &self.title {
            members.member_str("title", title);
        }
        members.member_str("tool", &self.name);
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
        object.insert("tool", Value::from(self.name.as_str()));
        object.insert("description", Value::from(self.description.as_str()));
        object.insert("parameters", strings(&self.parameters));
        object.insert("read_only", Value::Bool(self.read_only));
        object.insert("scopes", strings(&self.scopes));
        if let Some(title) = &self.title {
            object.insert("title", Value::from(title.as_str()));
        }
        for (key, value) in [
            ("inputSchema", &self.input_schema),
            ("outputSchema", &self.output_schema),
            ("annotations", &self.annotations),
        ] {
            if let Some(value) = value {
                object.insert(key, value.clone());
            }
        }
        Value::Object(object)
    }
}

fn check_len(field: &str, text: &str, max: usize) -> Result<()> {
    if too_long(text, max) {
        return Err(too_long_error(field, max));
    }
    Ok(())
}

/// More than `max` characters; counted only when the text has more than
/// `max` bytes, since no character is shorter than a byte.
fn too_long(text: &str, max: usize) -> bool {
    text.len() > max && text.chars().count() > max
}

fn too_long_error(field: &str, max: usize) -> Error {
    Error::invalid(field, format!("must be at most {max} characters"))
}

/// A JSON field of a tool: an object, at most [`MAX_INPUT_SCHEMA_LEN`]
/// bytes as canonical text.
fn check_json_field(field: &str, value: &Value) -> Result<()> {
    if !matches!(value, Value::Object(_)) {
        return Err(Error::invalid(field, "must be a JSON object"));
    }
    if canonical::canonical_len_over(value, MAX_INPUT_SCHEMA_LEN).is_some() {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_INPUT_SCHEMA_LEN} bytes"),
        ));
    }
    Ok(())
}

fn check_list(field: &str, items: &[String]) -> Result<()> {
    if items.len() > MAX_LIST_ITEMS {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_LIST_ITEMS} items, got {}", items.len()),
        ));
    }
    // The field's name is made only for an item that fails.
    match items.iter().position(|item| too_long(item, MAX_ITEM_LEN)) {
        Some(index) => Err(too_long_error(&format!("{field}[{index}]"), MAX_ITEM_LEN)),
        None => Ok(()),
    }
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

fn required_array<'a>(object: &'a Object, key: &str, field: &str) -> Result<&'a [Value]> {
    match object.get(key) {
        None => Err(Error::invalid(field, "is required")),
        Some(value) => value.as_array().ok_or_else(|| {
            Error::invalid(
                field,
                format!("must be an array, got {}", value.kind_name()),
            )
        }),
    }
}

fn optional_object(object: &Object, key: &str, path: &str) -> Result<Option<Value>> {
    match object.get(key) {
        None => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.clone())),
        Some(other) => Err(Error::invalid(
            format!("{path}.{key}"),
            format!("must be a JSON object, got {}", other.kind_name()),
        )),
    }
}

fn string_list(object: &Object, key: &str, path: &str) -> Result<Vec<String>> {
    let field = format!("{path}.{key}");
    let items = required_array(object, key, &field).map_err(|_| match object.get(key) {
        None => Error::invalid(&field, "is required"),
        Some(_) => Error::invalid(&field, "must be an array of strings"),
    })?;
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

/// How one tool differs between the pinned reference and the assessed
/// manifest, or why it makes the assessed manifest unsafe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolDiff {
    pub tool: String,
    pub change: ToolChange,
    pub description_changed: bool,
    pub parameters_changed: bool,
    pub scopes_changed: bool,
    pub read_only_changed: bool,
    pub input_schema_changed: bool,
    pub title_changed: bool,
    pub output_schema_changed: bool,
    pub annotations_changed: bool,
    pub parameters_added: Vec<String>,
    pub parameters_removed: Vec<String>,
    pub scopes_added: Vec<String>,
    pub scopes_removed: Vec<String>,
    /// The tool can do more than was reviewed: new, new scopes, or no longer
    /// read-only.
    pub widened: bool,
    /// Set when `change` is [`ToolChange::Unsafe`].
    pub problem: Option<Problem>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolChange {
    #[default]
    Added,
    Removed,
    Modified,
    /// The assessed manifest is unsafe because of this tool name (see
    /// [`ToolDiff::problem`]).
    Unsafe,
}

/// Per-tool differences from `reference` to `current`, sorted by tool name;
/// unchanged tools are omitted. Names that make `current` unsafe get one
/// [`ToolChange::Unsafe`] entry each instead of a comparison.
pub fn diff(reference: &Manifest, current: &Manifest) -> Vec<ToolDiff> {
    let problems = current.problems();
    let unsafe_names: BTreeSet<&str> = problems
        .iter()
        .map(|problem| problem.tool.as_str())
        .collect();
    let names: BTreeSet<&str> = reference
        .tools
        .iter()
        .chain(&current.tools)
        .map(|tool| tool.name.as_str())
        .filter(|name| !unsafe_names.contains(name))
        .collect();
    let mut diffs: Vec<ToolDiff> = names
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
            (Some(before), Some(after)) if !before.identical(after) => {
                Some(tool_diff(before, after))
            }
            _ => None,
        })
        .collect();
    diffs.extend(problem_diffs(problems));
    diffs.sort_by(|left, right| left.tool.cmp(&right.tool));
    diffs
}

fn problem_diffs(problems: Vec<Problem>) -> impl Iterator<Item = ToolDiff> {
    problems.into_iter().map(|problem| ToolDiff {
        tool: problem.tool.clone(),
        change: ToolChange::Unsafe,
        problem: Some(problem),
        ..ToolDiff::default()
    })
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
        input_schema_changed: !identical_values(&before.input_schema, &after.input_schema),
        title_changed: before.title != after.title,
        output_schema_changed: !identical_values(&before.output_schema, &after.output_schema),
        annotations_changed: !identical_values(&before.annotations, &after.annotations),
        widened: !scopes_added.is_empty() || (before.read_only && !after.read_only),
        parameters_added,
        parameters_removed,
        scopes_added,
        scopes_removed,
        problem: None,
    }
}

impl ManifestTool {
    /// Whether the two print the same canonical JSON: `-0.0` and `0.0` in a
    /// schema differ, as they do in the fingerprint ([`Value::identical`]).
    fn identical(&self, other: &ManifestTool) -> bool {
        // Every field named, so that a new one cannot be left out.
        let ManifestTool {
            name,
            description,
            parameters,
            read_only,
            scopes,
            title,
            input_schema,
            output_schema,
            annotations,
        } = self;
        *name == other.name
            && *description == other.description
            && *parameters == other.parameters
            && *read_only == other.read_only
            && *scopes == other.scopes
            && *title == other.title
            && identical_values(input_schema, &other.input_schema)
            && identical_values(output_schema, &other.output_schema)
            && identical_values(annotations, &other.annotations)
    }
}

/// Two optional values that print the same canonical JSON.
fn identical_values(left: &Option<Value>, right: &Option<Value>) -> bool {
    match (left, right) {
        (Some(left), Some(right)) => left.identical(right),
        (left, right) => left.is_none() && right.is_none(),
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
    /// The fingerprint matches the pin and the manifest has no problems.
    pub accepted: bool,
    /// What the fingerprint comparison says (an unsafe manifest may even
    /// match a pin made only from a fingerprint; it is still not accepted).
    pub reason: AssessReason,
    pub fingerprint: Fingerprint,
    pub pinned_fingerprint: Option<Fingerprint>,
    pub pinned_revision: Option<String>,
    pub diffs: Vec<ToolDiff>,
    pub diff_available: bool,
    /// Why the manifest is unsafe; empty when it is safe.
    pub problems: Vec<Problem>,
}

/// What a pin holds: the trusted fingerprint and, when known, the reviewed
/// manifest itself (for diffs).
pub trait PinReference {
    /// Computed by toolgate, never taken from a caller; when there is a
    /// pinned manifest, its fingerprint (checked when the pin is made, read
    /// from the policy and loaded from the store).
    fn pinned_fingerprint(&self) -> Fingerprint;
    fn pinned_manifest(&self) -> Option<&Manifest>;
}

/// Compares a manifest with its pin. A hash inside the manifest is never
/// trusted: the fingerprint is computed here, or, for a manifest identical
/// to the pinned one (a server that did not change: the common case), it
/// is the pin's.
pub fn assess(manifest: &Manifest, pin: Option<&dyn PinReference>) -> Assessment {
    let unchanged = pin.and_then(|pin| {
        pin.pinned_manifest()
            .filter(|reference| manifest.identical(reference))
            .map(|_| pin.pinned_fingerprint())
    });
    let fingerprint = unchanged.unwrap_or_else(|| manifest.fingerprint());
    let problems = manifest.problems();
    let Some(pin) = pin else {
        return Assessment {
            accepted: false,
            reason: AssessReason::Unpinned,
            fingerprint,
            pinned_fingerprint: None,
            pinned_revision: None,
            diffs: problem_diffs(problems.clone()).collect(),
            diff_available: false,
            problems,
        };
    };
    let pinned_fingerprint = pin.pinned_fingerprint();
    let matched = pinned_fingerprint == fingerprint;
    let reference = pin.pinned_manifest();
    let diffs = match reference {
        // Identical: no tool changed, only its problems are listed (as
        // `diff` would, in the tools' order).
        Some(reference) if unchanged.is_none() => diff(reference, manifest),
        _ => problem_diffs(problems.clone()).collect(),
    };
    Assessment {
        accepted: matched && problems.is_empty(),
        reason: if matched {
            AssessReason::Matched
        } else {
            AssessReason::Changed
        },
        fingerprint,
        pinned_fingerprint: Some(pinned_fingerprint),
        pinned_revision: reference.map(|reference| reference.revision.clone()),
        diffs,
        diff_available: reference.is_some(),
        problems,
    }
}

/// What is remembered of a pinned server's latest assessment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LastAssessment {
    pub fingerprint: Fingerprint,
    /// The assessed manifest had no problems.
    pub safe: bool,
}

impl From<&Assessment> for LastAssessment {
    fn from(assessment: &Assessment) -> Self {
        LastAssessment {
            fingerprint: assessment.fingerprint,
            safe: assessment.problems.is_empty(),
        }
    }
}

/// Whether a manifest server's tools may be decided on (SPEC §4 step 4),
/// and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestStatus {
    /// Pinned, and the latest assessment matched the pin in force.
    Verified,
    /// No pin for the server.
    Unpinned,
    /// Pinned, but no manifest of it is remembered as assessed (none was,
    /// or the last one was assessed while it had no pin).
    NeverAssessed,
    /// The latest assessment's fingerprint differs from the pin in force.
    Differed,
    /// The latest assessment matched but the manifest was unsafe.
    Unsafe,
}

impl ManifestStatus {
    pub fn of(pin: Option<&dyn PinReference>, last: Option<&LastAssessment>) -> Self {
        match (pin, last) {
            (None, _) => ManifestStatus::Unpinned,
            (Some(_), None) => ManifestStatus::NeverAssessed,
            (Some(pin), Some(last)) if pin.pinned_fingerprint() != last.fingerprint => {
                ManifestStatus::Differed
            }
            (Some(_), Some(last)) if !last.safe => ManifestStatus::Unsafe,
            (Some(_), Some(_)) => ManifestStatus::Verified,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's worked example (SPEC §7).
    const WORKED_EXAMPLE: &str = r#"{"server":"a","revision":"r1","tools":[{"tool":"read","description":"[[tool:elders/read]]","parameters":["target","mode"],"read_only":true,"scopes":["read","audit"]},{"tool":"paint","description":"Kleur kaart.","parameters":["target","color"],"read_only":false,"scopes":["paint"]}]}"#;

    fn tool(name: &str, scopes: &[&str]) -> ManifestTool {
        ManifestTool {
            name: name.to_string(),
            description: format!("{name} tool"),
            parameters: vec!["b".into(), "a".into()],
            read_only: true,
            scopes: scopes.iter().map(|scope| scope.to_string()).collect(),
            ..ManifestTool::default()
        }
    }

    /// A pin of `manifest` with its computed fingerprint, as every pin is.
    struct Pinned(Manifest, Fingerprint);

    impl PinReference for Pinned {
        fn pinned_fingerprint(&self) -> Fingerprint {
            self.1
        }
        fn pinned_manifest(&self) -> Option<&Manifest> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_manifest_identical_to_its_pin_is_assessed_as_when_hashed_and_diffed() {
        let schema = |zero: &str| {
            Some(canonical::parse_str(&format!(r#"{{"type":"number","minimum":{zero}}}"#)).unwrap())
        };
        let with_schema = |zero: &str| ManifestTool {
            input_schema: schema(zero),
            ..tool("s", &["x"])
        };
        let manifest =
            |tools: Vec<ManifestTool>| Manifest::new("srv".into(), "1".into(), tools).unwrap();
        let cases = [
            (
                vec![tool("a", &["x"]), with_schema("0.0")],
                vec![tool("a", &["x"]), with_schema("0.0")],
            ),
            // Problems (a duplicate name, an empty one) are listed as before.
            (
                vec![
                    tool("b", &[]),
                    tool("b", &[]),
                    tool("", &[]),
                    tool("a", &[]),
                ],
                vec![
                    tool("a", &[]),
                    tool("b", &[]),
                    tool("", &[]),
                    tool("b", &[]),
                ],
            ),
            // `==` holds, the canonical texts (and fingerprints) differ.
            (vec![with_schema("-0.0")], vec![with_schema("0.0")]),
            (vec![tool("a", &["x"])], vec![tool("a", &["y"])]),
        ];
        for (pinned, current) in cases {
            let (pinned, current) = (manifest(pinned), manifest(current));
            let pin = Pinned(pinned.clone(), pinned.fingerprint());
            let assessment = assess(&current, Some(&pin));
            assert_eq!(
                current.identical(&pinned),
                current.fingerprint() == pinned.fingerprint(),
                "{current:?}"
            );
            assert_eq!(assessment.fingerprint, current.fingerprint(), "{current:?}");
            assert_eq!(
                assessment.reason,
                if current.identical(&pinned) {
                    AssessReason::Matched
                } else {
                    AssessReason::Changed
                }
            );
            assert_eq!(assessment.diffs, diff(&pinned, &current), "{current:?}");
            assert_eq!(assessment.problems, current.problems());
            // A change the fingerprint sees, the diff shows: a reviewer is
            // never told "changed" with nothing to look at.
            if assessment.reason == AssessReason::Changed && current.problems().is_empty() {
                assert!(!assessment.diffs.is_empty(), "{current:?}");
            }
        }
        // -0.0 for 0.0 in a schema: the changed flag names the schema.
        let diffs = diff(
            &manifest(vec![with_schema("0.0")]),
            &manifest(vec![with_schema("-0.0")]),
        );
        assert_eq!(diffs.len(), 1, "{diffs:?}");
        assert!(diffs[0].input_schema_changed, "{diffs:?}");
    }

    #[test]
    fn worked_example_has_the_reference_canonical_form_and_fingerprint() {
        let manifest = Manifest::from_json(WORKED_EXAMPLE.as_bytes()).unwrap();
        assert_eq!(
            canonical::to_canonical(&manifest.to_value()),
            r#"{"revision":"r1","server":"a","tools":[{"description":"Kleur kaart.","parameters":["color","target"],"read_only":false,"scopes":["paint"],"tool":"paint"},{"description":"[[tool:elders/read]]","parameters":["mode","target"],"read_only":true,"scopes":["audit","read"],"tool":"read"}]}"#
        );
        assert_eq!(
            manifest.fingerprint().to_hex(),
            "57c402536871ebb9cb2093abe956200d0e8b124ccd75959aad08503ceba6a5d1"
        );
        assert_eq!(
            detect_form(WORKED_EXAMPLE.as_bytes()).unwrap(),
            ManifestForm::Reference
        );
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
        assert!(base.identical(&base.clone()));
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
        changed.tools[0].title = Some(String::new());
        variants.push(changed);
        for slot in 0..3 {
            let mut changed = base.clone();
            let target = match slot {
                0 => &mut changed.tools[0].input_schema,
                1 => &mut changed.tools[0].output_schema,
                _ => &mut changed.tools[0].annotations,
            };
            *target = Some(Value::Object(Object::new()));
            variants.push(changed);
        }
        let mut seen = BTreeSet::new();
        for variant in variants {
            assert_ne!(variant.fingerprint(), base.fingerprint(), "{variant:?}");
            assert!(!variant.identical(&base), "{variant:?}");
            assert!(seen.insert(variant.fingerprint().to_hex()), "{variant:?}");
        }
    }

    #[test]
    fn the_streamed_fingerprint_is_that_of_the_canonical_record() {
        let tools_list = r#"{"tools":[
            {"name":"zoek in één","title":"Zoek \"x\"","description":"line\nbreak \u0001",
             "inputSchema":{"type":"object","properties":{"q":{"type":"string"},"é":{"type":"number","maximum":1.5e300}},"required":["q"]},
             "outputSchema":{"type":"object"},"annotations":{"readOnlyHint":true,"destructiveHint":false}},
            {"name":"a","inputSchema":{"type":"object"}},
            {"name":"a","description":""},
            {"name":"","annotations":{"readOnlyHint":null}}]}"#;
        let manifests = [
            Manifest::from_json(WORKED_EXAMPLE.as_bytes()).unwrap(),
            Manifest::from_mcp_tools_list(tools_list.as_bytes(), "srv 🦀".into(), "r\t".into())
                .unwrap(),
            Manifest::new(String::new(), String::new(), Vec::new()).unwrap(),
            Manifest::new(
                "s".into(),
                "1".into(),
                vec![tool("a", &[]), tool("b", &["x"])],
            )
            .unwrap(),
        ];
        for manifest in manifests {
            assert_eq!(
                manifest.fingerprint(),
                canonical::fingerprint(&manifest.to_value()),
                "{}",
                canonical::to_canonical(&manifest.to_value())
            );
        }
    }

    #[test]
    fn any_string_is_content_not_an_invalid_argument() {
        let manifest = Manifest::from_json(
            r#"{"server":"my docs","revision":"","tools":[{"tool":"zoek in één","description":"","parameters":[""],"read_only":false,"scopes":["", "ünïcode scope"]}]}"#.as_bytes(),
        )
        .unwrap();
        assert!(manifest.problems().is_empty());
        assert_eq!(manifest.tools[0].scopes, vec!["", "ünïcode scope"]);
    }

    #[test]
    fn duplicate_and_empty_names_are_problems_not_errors() {
        let manifest = Manifest::new(
            "srv".into(),
            "1".into(),
            vec![
                tool("a", &["1"]),
                tool("b", &[]),
                tool("a", &["2"]),
                tool("", &[]),
            ],
        )
        .unwrap();
        // Stable sort: the two "a" tools keep their order, like Python's.
        assert_eq!(manifest.tools[1].scopes, vec!["1"]);
        assert_eq!(manifest.tools[2].scopes, vec!["2"]);
        let problems = manifest.problems();
        assert_eq!(
            problems,
            vec![
                Problem {
                    tool: String::new(),
                    kind: ProblemKind::EmptyName,
                    count: 1
                },
                Problem {
                    tool: "a".into(),
                    kind: ProblemKind::DuplicateName,
                    count: 2
                },
            ]
        );
        assert_eq!(
            problems[1].to_string(),
            "2 tools are named \"a\"; tool names must be unique"
        );
        let assessment = assess(&manifest, None);
        assert!(!assessment.accepted);
        assert_eq!(
            assessment
                .diffs
                .iter()
                .map(|diff| (diff.tool.as_str(), diff.change))
                .collect::<Vec<_>>(),
            vec![("", ToolChange::Unsafe), ("a", ToolChange::Unsafe)]
        );
    }

    #[test]
    fn reference_form_requires_every_field_and_rejects_unknown_ones() {
        let cases = [
            (
                r#"{"server_id":"s","revision":"1","tools":[]}"#,
                "server_id",
            ),
            (r#"{"server":"s","tools":[]}"#, "revision"),
            (r#"{"server":"s","revision":"1"}"#, "tools"),
            (
                r#"{"server":"s","revision":"1","tools":[{"tool":"a","description":"","parameters":[],"scopes":[]}]}"#,
                "tools[0].read_only",
            ),
            (
                r#"{"server":"s","revision":"1","tools":[{"tool":"a","description":"","parameters":[],"read_only":true,"scopes":[],"sha256":"x"}]}"#,
                "tools[0].sha256",
            ),
            (
                r#"{"server":"s","revision":"1","tools":[{"tool":"a","description":"","parameters":"p","read_only":true,"scopes":[]}]}"#,
                "tools[0].parameters",
            ),
            (
                r#"{"server":"s","revision":"1","tools":[{"tool":"a","description":"","parameters":[],"read_only":true,"scopes":[],"inputSchema":[]}]}"#,
                "tools[0].inputSchema",
            ),
        ];
        for (text, expected) in cases {
            let error = Manifest::from_json(text.as_bytes()).unwrap_err();
            assert!(
                matches!(error, Error::InvalidArgument { ref field, .. } if field == expected),
                "{text}: {error:?}"
            );
        }
    }

    #[test]
    fn mcp_tools_list_maps_onto_the_reference_record() {
        let listed = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"get_weather","title":"Weather","description":"Current weather","inputSchema":{"type":"object","properties":{"location":{"type":"string"},"units":{"type":"string"}}},"annotations":{"readOnlyHint":true},"_meta":{"x":1}}]}}"#;
        assert_eq!(detect_form(listed).unwrap(), ManifestForm::McpToolsList);
        let manifest = Manifest::from_mcp_tools_list(listed, "weather".into(), "7".into()).unwrap();
        let tool = &manifest.tools[0];
        assert_eq!(tool.name, "get_weather");
        assert_eq!(tool.parameters, vec!["location", "units"]);
        assert!(tool.read_only);
        assert_eq!(tool.title.as_deref(), Some("Weather"));
        let canonical = canonical::to_canonical(&manifest.to_value());
        assert_eq!(
            canonical,
            r#"{"revision":"7","server":"weather","tools":[{"annotations":{"readOnlyHint":true},"description":"Current weather","inputSchema":{"properties":{"location":{"type":"string"},"units":{"type":"string"}},"type":"object"},"parameters":["location","units"],"read_only":true,"scopes":[],"title":"Weather","tool":"get_weather"}]}"#
        );
        let failed = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}"#;
        let error = Manifest::from_mcp_tools_list(failed, "s".into(), "1".into()).unwrap_err();
        assert_eq!(
            error,
            Error::invalid(
                "error",
                "a JSON-RPC error response, not a tools/list result"
            )
        );
        let paged = br#"{"tools":[],"nextCursor":"2"}"#;
        let error = Manifest::from_mcp_tools_list(paged, "s".into(), "1".into()).unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { ref field, .. } if field == "nextCursor"),
            "{error:?}"
        );
    }

    #[test]
    fn status_says_never_assessed_differed_unsafe_or_verified() {
        struct Fixed(Fingerprint);
        impl PinReference for Fixed {
            fn pinned_fingerprint(&self) -> Fingerprint {
                self.0
            }
            fn pinned_manifest(&self) -> Option<&Manifest> {
                None
            }
        }
        let manifest = Manifest::new("srv".into(), "1".into(), vec![tool("a", &[])]).unwrap();
        let pin = Fixed(manifest.fingerprint());
        let other = Fingerprint::of_bytes(b"other");
        let last = |fingerprint, safe| LastAssessment { fingerprint, safe };
        assert_eq!(ManifestStatus::of(None, None), ManifestStatus::Unpinned);
        assert_eq!(
            ManifestStatus::of(Some(&pin), None),
            ManifestStatus::NeverAssessed
        );
        assert_eq!(
            ManifestStatus::of(Some(&pin), Some(&last(other, true))),
            ManifestStatus::Differed
        );
        assert_eq!(
            ManifestStatus::of(Some(&pin), Some(&last(pin.0, false))),
            ManifestStatus::Unsafe
        );
        assert_eq!(
            ManifestStatus::of(Some(&pin), Some(&last(pin.0, true))),
            ManifestStatus::Verified
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
        widened.annotations = Some(Value::Object(Object::new()));
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
        assert!(diffs[1].annotations_changed);
        assert!(!diffs[1].description_changed);
    }
}
