//! The proposal envelope and the trusted session (SPEC §2), and the policy
//! checks that Decide and Dispatch share (SPEC §4 steps 2–5, §6 steps 2–3).

use jsonschema::error::ValidationErrorKind;

use crate::domain::canonical::{self, Fingerprint, Instance, Number, Object, Value};
use crate::domain::error::{Error, Result, first_chars};
use crate::domain::ids::check_identifier;
use crate::domain::manifest::ManifestStatus;
use crate::domain::policy::{ActorProfile, ApprovalRule, Mode, Policy, Tool};
use crate::domain::reason::Reason;

/// Largest `version` a proposal may carry (2^53, exactly representable in
/// every JSON implementation).
pub const MAX_VERSION: u64 = 1 << 53;

/// Largest `arguments` accepted, as canonical JSON text (whatever the
/// whitespace and escapes of the text sent; a Check's MCP arguments have
/// the same bound).
pub const MAX_ARGUMENTS_BYTES: usize = 256 * 1024;

/// Largest `arguments_json` text read at all: its escapes may make it up
/// to six times as long as its canonical text (`\u0041` for `A`), and its
/// whitespace longer still.
const MAX_ARGUMENTS_TEXT_BYTES: usize = 6 * MAX_ARGUMENTS_BYTES;

/// The trusted session, asserted by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRef {
    pub actor: String,
    pub session_id: String,
    pub workspace: String,
    /// The identity of the host credential that asserts the session: the
    /// namespace of its session id and of its call ids' receipts (empty
    /// when the core is driven without authentication).
    pub host: String,
}

impl SessionRef {
    /// Field paths are relative to the session (`actor`); the edge adds `session.`.
    pub fn new(actor: String, session_id: String, workspace: String) -> Result<Self> {
        check_identifier("actor", &actor)?;
        check_identifier("session_id", &session_id)?;
        check_identifier("workspace", &workspace)?;
        Ok(SessionRef {
            actor,
            session_id,
            workspace,
            host: String::new(),
        })
    }

    /// The same session, asserted by the host credential `identity`.
    pub fn for_host(mut self, identity: &str) -> Self {
        identity.clone_into(&mut self.host);
        self
    }
}

/// A validated proposal with its fingerprint.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub call_id: String,
    pub actor: String,
    pub name: String,
    pub version: u64,
    pub arguments: Object,
    pub fingerprint: Fingerprint,
}

impl Proposal {
    /// Validates the envelope and computes the fingerprint of exactly the
    /// five keys. Field paths are relative to the proposal.
    pub fn new(
        call_id: String,
        actor: String,
        name: String,
        version: u64,
        arguments_json: &str,
    ) -> Result<Self> {
        if arguments_json.len() > MAX_ARGUMENTS_TEXT_BYTES {
            return Err(Error::invalid(
                "arguments_json",
                format!(
                    "must be at most {MAX_ARGUMENTS_BYTES} bytes (canonical JSON) and \
                     {MAX_ARGUMENTS_TEXT_BYTES} as sent, is {} as sent",
                    arguments_json.len()
                ),
            ));
        }
        let value = canonical::parse_str(arguments_json)
            .map_err(|error| Error::invalid("arguments_json", error.to_string()))?;
        if let Some(len) = canonical::canonical_len_over(&value, MAX_ARGUMENTS_BYTES) {
            return Err(Error::invalid(
                "arguments_json",
                format!("must be at most {MAX_ARGUMENTS_BYTES} bytes (canonical JSON), is {len}"),
            ));
        }
        let Value::Object(arguments) = value else {
            return Err(Error::invalid(
                "arguments_json",
                format!("must be a JSON object, got {}", value.kind_name()),
            ));
        };
        Proposal::with_arguments(call_id, actor, name, version, arguments)
    }

    /// [`Proposal::new`] of arguments already parsed (the arguments of an
    /// MCP `tools/call` that Envoy forwards): the envelope checked, the
    /// fingerprint of exactly the five keys.
    pub fn with_arguments(
        call_id: String,
        actor: String,
        name: String,
        version: u64,
        arguments: Object,
    ) -> Result<Self> {
        check_identifier("call_id", &call_id)?;
        check_identifier("actor", &actor)?;
        check_identifier("name", &name)?;
        if version > MAX_VERSION {
            return Err(Error::invalid(
                "version",
                format!("must be at most 2^53 ({MAX_VERSION})"),
            ));
        }
        // Exactly the five keys, in sorted order, hashed as they are written.
        let fingerprint = canonical::fingerprint_object(|envelope| {
            envelope.member_str("actor", &actor);
            envelope.member_object("arguments", &arguments);
            envelope.member_str("call_id", &call_id);
            envelope.member_str("name", &name);
            envelope.member_u64("version", version);
        });
        Ok(Proposal {
            call_id,
            actor,
            name,
            version,
            arguments,
            fingerprint,
        })
    }
}

/// Why the policy refuses a proposal before any state is consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The claimed actor is not the session's.
    Forbidden,
    UnknownTool,
    ForbiddenTool,
    NotAuthorized,
    /// The session's actor is not defined in the policy (reason
    /// `not-authorized`, with a message that says so).
    UnknownActor,
    /// Never [`ManifestStatus::Verified`].
    ManifestUnverified(ManifestStatus),
}

impl Refusal {
    pub fn reason(self) -> Reason {
        match self {
            Refusal::Forbidden => Reason::Forbidden,
            Refusal::UnknownTool => Reason::UnknownTool,
            Refusal::ForbiddenTool => Reason::ForbiddenTool,
            Refusal::NotAuthorized | Refusal::UnknownActor => Reason::NotAuthorized,
            Refusal::ManifestUnverified(_) => Reason::ManifestUnverified,
        }
    }
}

/// A proposal that passed SPEC §4 steps 2–3: the tool and the caller's profile.
#[derive(Debug)]
pub struct Admitted<'p> {
    pub tool: &'p Tool,
    pub profile: &'p ActorProfile,
}

/// SPEC §4 steps 2–3 (and §6 steps 2–3): actor, tool, mode, roles.
pub fn admit<'p>(
    policy: &'p Policy,
    session: &SessionRef,
    proposal: &Proposal,
) -> Result<Admitted<'p>, Refusal> {
    if proposal.actor != session.actor {
        return Err(Refusal::Forbidden);
    }
    let tool = policy
        .tools
        .get(&proposal.name)
        .ok_or(Refusal::UnknownTool)?;
    if tool.mode == Mode::Forbidden {
        return Err(Refusal::ForbiddenTool);
    }
    let profile = policy
        .actors
        .get(&session.actor)
        .ok_or(Refusal::UnknownActor)?;
    if !tool.roles.iter().any(|role| profile.roles.contains(role)) {
        return Err(Refusal::NotAuthorized);
    }
    Ok(Admitted { tool, profile })
}

/// SPEC §4 steps 2–3 and the schema check of step 5, all of which depend
/// only on the policy: computed before the state lock is taken, and reported
/// in the contract's order under it.
pub type Screened<'p> = Result<(Admitted<'p>, Result<()>), Refusal>;

pub fn screen<'p>(policy: &'p Policy, session: &SessionRef, proposal: &Proposal) -> Screened<'p> {
    let admitted = admit(policy, session, proposal)?;
    let schema = check_arguments(admitted.tool, &proposal.arguments);
    Ok((admitted, schema))
}

/// SPEC §4 step 5: arguments against the tool's input schema. The error
/// names the argument path (`proposal.arguments.amount`) and the rule.
pub fn check_arguments(tool: &Tool, arguments: &Object) -> Result<()> {
    check_case_variants(tool, arguments)?;
    // The arguments where they are (no serde_json copy); the fast check
    // first (no error values, no boxed iterator); only a failure collects
    // the errors, for the first one's path and rule.
    let instance = Instance::Object(arguments);
    if tool.input_schema.is_valid(instance) {
        return Ok(());
    }
    let Some(error) = tool.input_schema.iter_errors(instance).next() else {
        // Not valid, yet no error to name: fail closed all the same.
        return Err(Error::invalid(
            "proposal.arguments",
            format!("fails the input schema of {:?}", tool.name),
        ));
    };
    let mut field = String::from("proposal.arguments");
    for segment in error.instance_path().as_str().split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|byte| byte.is_ascii_digit()) {
            field.push_str(&format!("[{segment}]"));
        } else {
            field.push('.');
            field.push_str(&segment);
        }
    }
    // The message names the rule, never the offending value: values may be
    // sensitive and arbitrarily large (the answer must fit in a header).
    let mut rule = format!(
        "fails the input schema of {:?}: `{}` at {}",
        tool.name,
        error.kind().keyword(),
        error.schema_path().as_str()
    );
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let shown: Vec<String> = unexpected
                .iter()
                .take(5)
                .map(|name| truncated(name, 40))
                .collect();
            rule.push_str(&format!(" (unexpected: {}", shown.join(", ")));
            if unexpected.len() > shown.len() {
                rule.push_str(&format!(" and {} more", unexpected.len() - shown.len()));
            }
            rule.push(')');
        }
        ValidationErrorKind::Required { property } => {
            rule.push_str(&format!(
                " (missing: {})",
                truncated(&property.to_string(), 40)
            ));
        }
        _ => {}
    }
    Err(Error::invalid(truncated(&field, MAX_FIELD_PATH_LEN), rule))
}

/// Longest field path echoed in an error.
const MAX_FIELD_PATH_LEN: usize = 200;

/// At most `max` characters of `text`, marked when cut.
fn truncated(text: &str, max: usize) -> String {
    match first_chars(text, max) {
        (kept, true) => format!("{kept}…"),
        (whole, false) => whole.to_string(),
    }
}

/// Why a tool call needs approval, if it does (SPEC §3 approval rule).
pub fn approval_reason(tool: &Tool, profile: &ActorProfile, arguments: &Object) -> Option<Reason> {
    match &tool.approval {
        ApprovalRule::Never => None,
        ApprovalRule::Always => Some(Reason::ApprovalRequired),
        ApprovalRule::Threshold { argument } => {
            let within = match (arguments.get(argument), profile.approval_threshold) {
                // Exactly: an integer over 2^53 is not rounded to a double
                // first (1e18 + 64 would compare equal to 1e18).
                (Some(Value::Number(Number::Int(amount))), Some(threshold)) => {
                    *amount <= threshold.floor() as i128
                }
                (Some(Value::Number(Number::Float(amount))), Some(threshold)) => {
                    *amount <= threshold
                }
                // No threshold in the profile, or the argument missing or
                // not a number: fail closed.
                _ => false,
            };
            (!within).then_some(Reason::ApprovalThresholdExceeded)
        }
    }
}

/// An argument whose name differs only in case (with Unicode folding) from
/// one the tool reads by name: a server that matches names
/// case-insensitively (Go's `encoding/json`) would read `{"Limit": 10^6}`
/// as `limit`, past a schema that bounds `limit` and never sees `Limit`,
/// and `Password` would be shown unredacted where `password` is
/// sensitive. Refused, naming both.
fn check_case_variants(tool: &Tool, arguments: &Object) -> Result<()> {
    let names = &tool.argument_names;
    for key in arguments.keys() {
        if names
            .binary_search_by(|name| name.as_str().cmp(key))
            .is_ok()
        {
            continue;
        }
        let folded = unicase::UniCase::unicode(key);
        if let Some(name) =
            (names.iter()).find(|name| unicase::UniCase::unicode(name.as_str()) == folded)
        {
            let (shown, _) = first_chars(key, 64);
            return Err(Error::invalid(
                "proposal.arguments",
                format!(
                    "argument {shown:?} differs from {name:?}, an argument of tool {:?}, only \
                     in case: a server that matches names case-insensitively would read it as \
                     {name:?}",
                    tool.name
                ),
            ));
        }
    }
    Ok(())
}

/// What a redacted argument shows in its place.
pub const REDACTED: &str = "[redacted]";

/// The arguments as a reviewer sees them: top-level keys the tool marks
/// sensitive replaced by `"[redacted]"`, as canonical JSON.
pub fn redacted_arguments(tool: &Tool, arguments: &Object) -> String {
    let shown = redacted(tool, arguments).unwrap_or_else(|| arguments.clone());
    canonical::to_canonical(&Value::Object(shown))
}

/// An approval request's stored arguments view as reviewers are shown it
/// under `policy`: with the keys its tool marks sensitive now redacted too
/// (a reload may have marked one after the request was made); `None` when
/// that changes nothing. Only a view that names such a key is parsed.
pub fn view_under(policy: &Policy, tool: &str, view: &str) -> Option<String> {
    let tool = policy.tools.get(tool)?;
    let named = |key: &String| {
        let quoted = canonical::to_canonical(&Value::from(key.as_str()));
        view.contains(&format!("{quoted}:"))
    };
    if !tool.sensitive.iter().any(named) {
        return None;
    }
    let Ok(Value::Object(arguments)) = canonical::parse(view.as_bytes()) else {
        // Every stored view is an object's canonical text; should one not
        // be, none of it is shown.
        return Some(canonical::to_canonical(&Value::from(REDACTED)));
    };
    let shown = redacted(tool, &arguments)?;
    (shown != arguments).then(|| canonical::to_canonical(&Value::Object(shown)))
}

/// `arguments` with the top-level keys the tool marks sensitive replaced by
/// `"[redacted]"`; `None` when it has none of them.
pub fn redacted(tool: &Tool, arguments: &Object) -> Option<Object> {
    if tool
        .sensitive
        .iter()
        .all(|key| arguments.get(key).is_none())
    {
        return None;
    }
    let mut shown = arguments.clone();
    for key in &tool.sensitive {
        if shown.get(key).is_some() {
            shown.insert(key.clone(), Value::from(REDACTED));
        }
    }
    Some(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments are bounded as canonical JSON, as a Check's are: padding
    /// does not count, escapes do.
    #[test]
    fn the_arguments_bound_is_their_canonical_texts() {
        let padded = format!("{{\"a\":1{}}}", " ".repeat(MAX_ARGUMENTS_BYTES));
        let proposal = Proposal::new("c".into(), "a".into(), "t".into(), 0, &padded);
        assert!(proposal.is_ok(), "{proposal:?}");
        let escaped = format!("{{\"a\":\"{}\"}}", "\u{7f}".repeat(45_000));
        assert!(escaped.len() < MAX_ARGUMENTS_BYTES);
        let error = Proposal::new("c".into(), "a".into(), "t".into(), 0, &escaped).unwrap_err();
        assert_eq!(
            error,
            Error::invalid(
                "arguments_json",
                "must be at most 262144 bytes (canonical JSON), is 270008"
            )
        );
        let huge = format!("{{\"a\":1{}}}", " ".repeat(6 * MAX_ARGUMENTS_BYTES));
        assert!(Proposal::new("c".into(), "a".into(), "t".into(), 0, &huge).is_err());
    }

    /// A schema's `format` is held (2020-12 makes it an annotation unless
    /// the validator is asked to check it).
    #[test]
    fn a_format_in_the_schema_is_checked() {
        let policy = Policy::parse(
            "[server]\nopen_host_api = true\n[profiles.p]\nroles = [\"r\"]\n\
             [actors.a]\nprofile = \"p\"\n[tools.mail]\nmode = \"read\"\nroles = [\"r\"]\n\
             input_schema = { properties = { to = { type = \"string\", format = \"email\" } } }\n",
            "p.toml",
            None,
        )
        .unwrap();
        let check = |arguments: &str| {
            let Value::Object(arguments) = canonical::parse_str(arguments).unwrap() else {
                unreachable!()
            };
            check_arguments(&policy.tools["mail"], &arguments)
        };
        assert!(check(r#"{"to":"ops@example.com"}"#).is_ok());
        let error = check(r#"{"to":"ops at example"}"#).unwrap_err().to_string();
        assert_eq!(
            error,
            "proposal.arguments.to: fails the input schema of \"mail\": `format` at /properties/to/format"
        );
    }

    /// An argument named like one the tool reads but for case is refused.
    #[test]
    fn an_argument_differing_only_in_case_from_a_named_one_is_refused() {
        let policy = Policy::parse(
            "[server]\nopen_host_api = true\n\
             [profiles.p]\nroles = [\"r\"]\n\
             [actors.a]\nprofile = \"p\"\n\
             [tools.search]\nmode = \"read\"\nroles = [\"r\"]\nsensitive = [\"password\"]\n\
             input_schema = { type = \"object\", properties = { limit = { type = \"integer\", \
             maximum = 100 } } }\n",
            "p.toml",
            None,
        )
        .unwrap();
        let tool = &policy.tools["search"];
        let check = |arguments: &str| {
            let Value::Object(arguments) = canonical::parse_str(arguments).unwrap() else {
                unreachable!()
            };
            check_arguments(tool, &arguments)
        };
        assert!(check(r#"{"limit":5,"other":1}"#).is_ok());
        // Past the schema's bound for `limit` on a server that folds case.
        let error = check(r#"{"Limit":1000000}"#).unwrap_err().to_string();
        assert!(
            error.contains("\"Limit\" differs from \"limit\""),
            "{error}"
        );
        // Shown unredacted where `password` is sensitive; the Kelvin sign
        // folds to `k` as Go's encoding/json folds it.
        assert!(check(r#"{"PassWord":"x"}"#).is_err());
        assert!(check(r#"{"\u212aey":1,"limit":1}"#).is_ok());
        let policy_k = Policy::parse(
            "[server]\nopen_host_api = true\n[profiles.p]\nroles = [\"r\"]\n\
             [actors.a]\nprofile = \"p\"\n[tools.t]\nmode = \"read\"\nroles = [\"r\"]\n\
             input_schema = { type = \"object\", properties = { key = { type = \"integer\" } } }\n",
            "p.toml",
            None,
        )
        .unwrap();
        let Value::Object(kelvin) = canonical::parse_str(r#"{"\u212aey":1}"#).unwrap() else {
            unreachable!()
        };
        assert!(check_arguments(&policy_k.tools["t"], &kelvin).is_err());
    }

    /// The threshold rule compares an integer amount exactly: one unit over
    /// a threshold past 2^53 needs approval (as a double it was equal).
    #[test]
    fn a_large_integer_amount_is_compared_exactly() {
        let policy = Policy::parse(
            "[server]\nopen_host_api = true\n\
             [profiles.p]\nroles = [\"r\"]\napproval_threshold = 1e18\n\
             [actors.a]\nprofile = \"p\"\n\
             [tools.pay]\nmode = \"execute\"\nroles = [\"r\"]\napprovers = [\"x\"]\n\
             approval = \"threshold\"\nthreshold_argument = \"amount\"\n",
            "p.toml",
            None,
        )
        .unwrap();
        let (tool, profile) = (&policy.tools["pay"], &policy.actors["a"]);
        let reason = |amount: &str| {
            let arguments = canonical::parse_str(&format!("{{\"amount\":{amount}}}")).unwrap();
            let Value::Object(arguments) = arguments else {
                unreachable!()
            };
            approval_reason(tool, profile, &arguments)
        };
        let over = Some(Reason::ApprovalThresholdExceeded);
        assert_eq!(reason("1000000000000000000"), None);
        assert_eq!(reason("1000000000000000001"), over);
        assert_eq!(reason("1000000000000000064"), over);
        assert_eq!(reason("999999999999999999.0"), None);
        assert_eq!(reason("1.0000000000000002e18"), over);
        assert_eq!(reason("-5"), None);
        assert_eq!(reason("\"5\""), over);
    }
}
