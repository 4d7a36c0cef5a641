//! `[tools]`: each tool's mode, callers, approval rule, input schema and
//! effect.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::decode::toml_to_json;
use super::effects::{Effect, RawEffect, effect};
use super::parse::Loader;
use super::{PolicyError, PolicyMap, StatePolicy};
use crate::domain::canonical::Canonical;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Reads only: allowed for authorised actors.
    Read,
    /// Drafts a change for a person to act on: allowed for authorised actors.
    Propose,
    /// Changes something: allowed, or gated on approval by its rule.
    Execute,
    /// Never allowed.
    Forbidden,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRule {
    Never,
    Always,
    /// Approval needed when the numeric argument exceeds the caller
    /// profile's `approval_threshold` (or is missing / not a number).
    Threshold {
        argument: String,
    },
}

/// A tool as the policy declares it.
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    pub mode: Mode,
    /// Compiled once at load; never per request.
    pub input_schema: jsonschema::Validator<Canonical>,
    /// Actor roles that may call it.
    pub roles: Vec<String>,
    /// Reviewer roles that may approve it.
    pub approvers: Vec<String>,
    pub approval: ApprovalRule,
    /// Manifest server the tool belongs to, if any.
    pub server: Option<String>,
    /// Top-level argument names shown redacted to reviewers.
    pub sensitive: Vec<String>,
    /// Work units charged when the tool is executed.
    pub cost: u64,
    pub effect: Effect,
    /// The top-level argument names the tool reads by name, sorted: its
    /// input schema's `properties`, its sensitive, threshold and effect
    /// arguments. An argument that differs from one only in case is
    /// refused (a server matching names case-insensitively would read it
    /// as that one).
    pub argument_names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTool {
    mode: Mode,
    input_schema: Option<toml::Value>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    approvers: Vec<String>,
    /// Required for an `execute` tool; `never` for the others (which
    /// cannot require approval).
    approval: Option<String>,
    threshold_argument: Option<String>,
    server: Option<String>,
    #[serde(default)]
    sensitive: Vec<String>,
    #[serde(default)]
    cost: u64,
    #[serde(default)]
    effect: RawEffect,
}

/// `[tools]`, each checked against the declared state (for its effect).
pub(super) fn tools(
    loader: &Loader<'_>,
    raw_tools: BTreeMap<String, RawTool>,
    state: &StatePolicy,
) -> Result<PolicyMap<String, Tool>, PolicyError> {
    let mut tools = PolicyMap::default();
    for (name, raw_tool) in raw_tools {
        let tool = tool(loader, name.clone(), raw_tool, state)?;
        tools.insert(name, tool);
    }
    Ok(tools)
}

/// One tool: who may call it, when it needs approval and by whom, the
/// schema of its arguments, and its effect.
fn tool(
    loader: &Loader<'_>,
    name: String,
    raw: RawTool,
    state: &StatePolicy,
) -> Result<Tool, PolicyError> {
    let key = format!("tools.{name}");
    loader.identifier(&key, &name)?;
    if raw.roles.is_empty() && raw.mode != Mode::Forbidden {
        return Err(loader.error(
            format!("{key}.roles"),
            "must list the actor roles that may call the tool",
        ));
    }
    let approval = match (raw.approval.as_deref(), raw.mode) {
        (Some(approval), _) => approval_rule(loader, &key, approval, raw.threshold_argument)?,
        // No default for the gate that opens: a file cut short after
        // `mode = "execute"` must not load as an execute tool that runs
        // without approval.
        (None, Mode::Execute) => {
            return Err(loader.error(
                format!("{key}.approval"),
                "is required for a tool of mode \"execute\": \"never\", \"always\" or \"threshold\"",
            ));
        }
        (None, _) => approval_rule(loader, &key, "never", raw.threshold_argument)?,
    };
    check_approval_gate(loader, &key, &approval, raw.mode, &raw.approvers)?;
    if let Some(server) = &raw.server {
        loader.server_id(&format!("{key}.server"), server)?;
    }
    let (input_schema, mut argument_names) = input_schema(loader, &key, raw.input_schema)?;
    let effect = effect(loader, &key, raw.effect, state)?;
    if effect != Effect::None && raw.mode != Mode::Execute {
        return Err(loader.error(
            format!("{key}.effect"),
            "only tools of mode \"execute\" have an effect",
        ));
    }
    if let Effect::Set {
        resource_argument,
        value_argument,
        ..
    } = &effect
    {
        // A resource's name is shown whole (answers, audit lines,
        // GetResource): a sensitive argument cannot name one.
        if raw.sensitive.contains(resource_argument) {
            return Err(loader.error(
                format!("{key}.sensitive"),
                format!(
                    "{resource_argument:?} names the resource the effect sets, which is shown \
                     unredacted; it cannot be sensitive"
                ),
            ));
        }
        argument_names.extend([resource_argument.clone(), value_argument.clone()]);
    }
    argument_names.extend(raw.sensitive.iter().cloned());
    if let ApprovalRule::Threshold { argument } = &approval {
        argument_names.push(argument.clone());
    }
    argument_names.sort();
    argument_names.dedup();
    Ok(Tool {
        name,
        mode: raw.mode,
        input_schema,
        argument_names,
        roles: raw.roles,
        approvers: raw.approvers,
        approval,
        server: raw.server,
        sensitive: raw.sensitive,
        cost: raw.cost,
        effect,
    })
}

/// `approval = "never" | "always" | "threshold"`; a threshold names its
/// argument, and only a threshold does.
fn approval_rule(
    loader: &Loader<'_>,
    key: &str,
    approval: &str,
    threshold_argument: Option<String>,
) -> Result<ApprovalRule, PolicyError> {
    match (approval, threshold_argument) {
        ("never", None) => Ok(ApprovalRule::Never),
        ("always", None) => Ok(ApprovalRule::Always),
        ("threshold", Some(argument)) => Ok(ApprovalRule::Threshold { argument }),
        ("threshold", None) => Err(loader.error(
            format!("{key}.threshold_argument"),
            "is required with approval = \"threshold\"",
        )),
        ("never" | "always", Some(_)) => Err(loader.error(
            format!("{key}.threshold_argument"),
            "is only used with approval = \"threshold\"",
        )),
        (other, _) => Err(loader.error(
            format!("{key}.approval"),
            format!("must be \"never\", \"always\" or \"threshold\", not {other:?}"),
        )),
    }
}

/// A tool that can require approval executes, and names the reviewer roles
/// that may give it.
fn check_approval_gate(
    loader: &Loader<'_>,
    key: &str,
    approval: &ApprovalRule,
    mode: Mode,
    approvers: &[String],
) -> Result<(), PolicyError> {
    if *approval == ApprovalRule::Never {
        return Ok(());
    }
    if mode != Mode::Execute {
        return Err(loader.error(
            format!("{key}.approval"),
            "only tools of mode \"execute\" can require approval",
        ));
    }
    if approvers.is_empty() {
        return Err(loader.error(
            format!("{key}.approvers"),
            "must list the reviewer roles that may approve the tool",
        ));
    }
    Ok(())
}

/// `input_schema`: a JSON Schema object (a TOML table, or JSON text in a
/// string; `{"type": "object"}` when absent), compiled once here.
fn input_schema(
    loader: &Loader<'_>,
    key: &str,
    raw: Option<toml::Value>,
) -> Result<(jsonschema::Validator<Canonical>, Vec<String>), PolicyError> {
    let schema_json = match raw {
        None => serde_json::json!({"type": "object"}),
        // Read as toolgate reads JSON: a duplicate key is an error, never
        // the last copy winning (a schema that enforced another bound than
        // the text shows).
        Some(toml::Value::String(text)) => crate::domain::canonical::parse_str(&text)
            .map(|schema| crate::domain::canonical::to_serde_json(&schema))
            .map_err(|error| {
                loader.error(
                    format!("{key}.input_schema"),
                    format!("not JSON toolgate accepts: {error}"),
                )
            })?,
        Some(value) => toml_to_json(&value, "")
            .map_err(|error| loader.error(format!("{key}.input_schema"), error))?,
    };
    if !schema_json.is_object() {
        return Err(loader.error(
            format!("{key}.input_schema"),
            "must be a JSON Schema object",
        ));
    }
    let properties = (schema_json.get("properties"))
        .and_then(serde_json::Value::as_object)
        .map(|properties| properties.keys().cloned().collect())
        .unwrap_or_default();
    // A format the validator knows is checked (in 2019-09 and later it is
    // only an annotation unless asked): an author writes `format` to have
    // it held. One it does not know stays an annotation, as JSON Schema
    // says (OpenAPI's `int32`, draft-07's `uuid`: schemas that tools
    // publish).
    let validator = jsonschema::options_for::<Canonical>()
        .should_validate_formats(true)
        .build(&schema_json)
        .map_err(|error| {
            loader.error(
                format!("{key}.input_schema"),
                schema_error_message(&schema_json, &error),
            )
        })?;
    if let Some((pointer, keyword, why)) = refused_keyword(&schema_json) {
        let at = match pointer.as_str() {
            "" => String::new(),
            pointer => format!(" at {pointer}"),
        };
        return Err(loader.error(
            format!("{key}.input_schema"),
            format!("{keyword:?}{at} is refused: {why}"),
        ));
    }
    Ok((validator, properties))
}

/// Annotations: keywords the validator reads nothing from, known in every
/// draft (an earlier draft ignores a later one's alike).
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "readOnly",
    "writeOnly",
    "deprecated",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
];

/// Why the validator would ignore a key: `ignored!("why")`.
macro_rules! ignored {
    ($why:literal) => {
        concat!("the validator would ignore it: ", $why)
    };
}

/// Why `key` is refused in a schema object of `draft` holding `members`,
/// if it is: mostly because the validator would ignore it there.
fn ignored_because(
    draft: jsonschema::Draft,
    members: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<&'static str> {
    use jsonschema::Draft;
    if key.starts_with("x-") || ANNOTATIONS.contains(&key) {
        return None;
    }
    let known = match key {
        // Compiled in 2019-09 only (referencing knows them later too).
        "$recursiveRef" | "$recursiveAnchor" => draft == Draft::Draft201909,
        _ => draft.is_known_keyword(key),
    };
    if !known {
        return Some(ignored!(
            "it is no keyword of the schema's draft, so a misspelt bound would not be \
             enforced (annotations of your own start with \"x-\")"
        ));
    }
    if draft < Draft::Draft201909
        && members.contains_key("$ref")
        && !matches!(key, "$ref" | "$schema" | "id" | "$id")
    {
        return Some(ignored!(
            "drafts before 2019-09 ignore every keyword beside \"$ref\" (put the reference \
             and it in an allOf)"
        ));
    }
    let beside = |other: &str| members.contains_key(other);
    match key {
        "additionalItems"
            if !members
                .get("items")
                .is_some_and(serde_json::Value::is_array) =>
        {
            Some(ignored!(
                "it applies only beside a list of \"items\" (in 2020-12: \"items\" after \
                 \"prefixItems\")"
            ))
        }
        "then" | "else" if !beside("if") => Some(ignored!("it applies only beside \"if\"")),
        // An annotation since 2019-09: a bound inside would hold nothing.
        "contentSchema" => Some(ignored!(
            "it is an annotation in 2019-09 and later: nothing in it is checked"
        )),
        // A client's text checked as a regular expression costs time that
        // grows with the square of its length (its group names are looked
        // up in a list): not a check a model's arguments may set off.
        "format" if members.get("format").and_then(serde_json::Value::as_str) == Some("regex") => {
            Some(
                "toolgate does not check the \"regex\" format (its cost grows with the square of the argument's length): use \"pattern\" and \"maxLength\"",
            )
        }
        "minContains" | "maxContains" if !beside("contains") => {
            Some(ignored!("it applies only beside \"contains\""))
        }
        _ => None,
    }
}

/// What a walk of a schema found: the pointers of the schemas it judged,
/// the anchors they declare, and the references they make.
#[derive(Default)]
struct Walked {
    schemas: std::collections::HashSet<String>,
    anchors: std::collections::HashSet<String>,
    references: Vec<(String, String, String)>,
}

/// A refusal: the pointer of the schema object, its key, and why.
type Refusal = (String, String, std::borrow::Cow<'static, str>);

/// The first key of the schema (or of a schema inside it) that is refused
/// ([`ignored_because`]), with its pointer: a misspelt `maxLenght` would
/// otherwise pass every string, and so would a later draft's
/// `dependentRequired` in a draft-07 schema, a bound beside a draft-07
/// `$ref`, or a `then` without its `if`. Ajv's strict mode refuses them
/// alike. Keys starting `x-` are the author's annotations; values that are
/// data (`enum`, `const`, `default`, `examples`) and property names are not
/// looked into. The whole schema is read as the root's draft: a `$schema`
/// inside naming another is refused. And a reference must reach a schema
/// this walk judged (`#/x-defs/a`, `#/default` would reach one it did not).
fn refused_keyword(schema: &serde_json::Value) -> Option<Refusal> {
    let mut walked = Walked::default();
    if let Some(refusal) = walk(schema, jsonschema::Draft::default(), "", &mut walked) {
        return Some(refusal);
    }
    walked
        .references
        .iter()
        .find_map(|(pointer, keyword, target)| {
            let reached = match (keyword.as_str(), target.strip_prefix('#')) {
                // Read as "#" whatever it says.
                ("$recursiveRef", fragment) => fragment == Some(""),
                (_, Some("")) => true,
                (_, Some(fragment)) => match percent_decoded(fragment) {
                    Some(fragment) if fragment.starts_with('/') => {
                        walked.schemas.contains(&fragment)
                    }
                    Some(anchor) => walked.anchors.contains(&anchor),
                    None => false,
                },
                (_, None) => false,
            };
            (!reached).then(|| {
                let why = format!(
                    "it leads to {target:?}, which is no schema toolgate judged: a reference must \
                 lead from the root to a schema among the schema's own keywords (\"#\", \
                 \"#/...\", \"#anchor\")"
                );
                (pointer.clone(), keyword.clone(), why.into())
            })
        })
}

/// A URI fragment's `%XX` escapes decoded (the rest as it is); `None`
/// when that is not UTF-8.
fn percent_decoded(fragment: &str) -> Option<String> {
    let bytes = fragment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .filter(|pair| pair.iter().all(u8::is_ascii_hexdigit))
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

fn walk(
    schema: &serde_json::Value,
    draft: jsonschema::Draft,
    pointer: &str,
    walked: &mut Walked,
) -> Option<Refusal> {
    use serde_json::Value;
    let members = match schema {
        Value::Object(members) => members,
        Value::Bool(_) => {
            walked.schemas.insert(pointer.to_owned());
            return None;
        }
        _ => return None, // a list of names (`dependencies`): no schema
    };
    walked.schemas.insert(pointer.to_owned());
    let declared = draft.detect(schema);
    if !pointer.is_empty() && declared != draft {
        let why = ignored!("the whole schema is read as its root's draft");
        return Some((pointer.to_owned(), "$schema".to_owned(), why.into()));
    }
    let draft = declared;
    for (key, value) in members {
        if let Some(why) = ignored_because(draft, members, key) {
            return Some((pointer.to_owned(), key.clone(), why.into()));
        }
        let text = value.as_str();
        match (key.as_str(), text) {
            ("$anchor" | "$dynamicAnchor", Some(name)) => {
                walked.anchors.insert(name.to_owned());
            }
            // Drafts 4 to 7 name an anchor as a fragment-only id.
            ("$id" | "id", Some(id)) if id.starts_with('#') => {
                walked.anchors.insert(id[1..].to_owned());
            }
            // Below the root an id would move the base the references
            // inside it are read from: references are judged from the root.
            // (Only the draft's own id keyword gets here: the other one was
            // refused as unknown.)
            ("$id" | "id", Some(_)) if !pointer.is_empty() => {
                let why = "an id below the root moves the base of the references inside it, \
                           and toolgate judges references from the root";
                return Some((pointer.to_owned(), key.clone(), why.into()));
            }
            ("$defs" | "definitions", _) if !value.is_object() => {
                let why = "it must be an object of schemas";
                return Some((pointer.to_owned(), key.clone(), why.into()));
            }
            ("$ref" | "$dynamicRef" | "$recursiveRef", Some(target)) => {
                walked
                    .references
                    .push((pointer.to_owned(), key.clone(), target.to_owned()));
            }
            _ => {}
        }
        let here = child(pointer, key);
        let refusal = match (key.as_str(), value) {
            // Maps of names to schemas (`dependencies` maps to lists of
            // names too, which hold no keywords).
            (
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas"
                | "dependencies",
                Value::Object(named),
            ) => named
                .iter()
                .find_map(|(name, schema)| walk(schema, draft, &child(&here, name), walked)),
            // Lists of schemas (`items` as a list: drafts before 2020-12).
            ("allOf" | "anyOf" | "oneOf" | "prefixItems" | "items", Value::Array(schemas)) => {
                schemas.iter().enumerate().find_map(|(index, schema)| {
                    walk(schema, draft, &format!("{here}/{index}"), walked)
                })
            }
            // One schema.
            (
                "not"
                | "if"
                | "then"
                | "else"
                | "items"
                | "additionalItems"
                | "unevaluatedItems"
                | "unevaluatedProperties"
                | "contains"
                | "additionalProperties"
                | "propertyNames",
                schema,
            ) => walk(schema, draft, &here, walked),
            _ => None,
        };
        if refusal.is_some() {
            return refusal;
        }
    }
    None
}

/// Why a schema does not compile, with the JSON pointer inside the schema.
/// The schema is the instance its meta-schema checks: the instance path is
/// that pointer.
fn schema_error_message(
    schema_json: &serde_json::Value,
    error: &jsonschema::ValidationError<'_>,
) -> String {
    match error.kind() {
        jsonschema::error::ValidationErrorKind::Referencing(_) => {
            match outside_reference(schema_json, "") {
                Some((pointer, target)) => format!(
                    "invalid JSON Schema at {pointer}: cannot resolve {target:?}: \
                     only references inside the schema (\"#/...\") are followed"
                ),
                None => format!("invalid JSON Schema: {error}"),
            }
        }
        _ => match error.instance_path().as_str() {
            "" => format!("invalid JSON Schema: {error}"),
            pointer => format!("invalid JSON Schema at {pointer}: {error}"),
        },
    }
}

/// The JSON pointer and target of the first `$ref` in a schema that points
/// outside it.
fn outside_reference(schema: &serde_json::Value, pointer: &str) -> Option<(String, String)> {
    match schema {
        serde_json::Value::Object(members) => members.iter().find_map(|(key, value)| {
            let here = child(pointer, key);
            match (key.as_str(), value) {
                ("$ref", serde_json::Value::String(target)) if !target.starts_with('#') => {
                    Some((here, target.clone()))
                }
                _ => outside_reference(value, &here),
            }
        }),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(index, item)| outside_reference(item, &format!("{pointer}/{index}"))),
        _ => None,
    }
}

/// `pointer` with one more step, `key` escaped as JSON Pointer says.
fn child(pointer: &str, key: &str) -> String {
    format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"))
}
