//! MCP over streamable HTTP, as an external authorizer sees it (issue 17):
//! an HTTP request (method, headers, body, peer principal, verified JWT
//! claims) becomes either a `tools/call` to decide — the trusted session
//! and the proposal — or another MCP request, or a refusal with a stable
//! reason; and the JSON-RPC error body a denied call is answered with.
//!
//! No Envoy or gRPC type appears here: the edge hands the request in
//! through [`HttpRequest`]. Every refusal changes no state.

use std::borrow::Cow;

use crate::domain::canonical::{self, Fingerprint, Object, Value};
use crate::domain::error::{Error, first_chars};
use crate::domain::ids::check_identifier;
use crate::domain::policy::{ActorSource, ExtAuthzSettings, WorkspaceSource};
use crate::domain::proposal::{MAX_ARGUMENTS_BYTES, Proposal, SessionRef};

/// The header Envoy sets when it sent only part of the body.
pub const PARTIAL_BODY_HEADER: &str = "x-envoy-auth-partial-body";
/// The current MCP revision's headers naming the method and the tool.
pub const MCP_METHOD_HEADER: &str = "mcp-method";
pub const MCP_NAME_HEADER: &str = "mcp-name";
/// The header that names the operation key of a call (its call id).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// The headers that say how a body's bytes are to be read.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
pub const CONTENT_ENCODING_HEADER: &str = "content-encoding";
/// The HTTP methods besides POST that reach an MCP endpoint, none with a
/// JSON-RPC message: GET (the server's stream), DELETE (the end of a
/// session), and HEAD and OPTIONS (probes, CORS preflights).
const BODYLESS_METHODS: [&str; 4] = ["GET", "DELETE", "HEAD", "OPTIONS"];

/// The request as the authorizer sees it.
pub trait HttpRequest {
    /// The HTTP method (`POST`, `GET`, …).
    fn method(&self) -> &str;
    /// A header's value, by lowercase name: as Envoy's `headers` map has
    /// it, the values of a repeated header joined with `,` (so that a copy
    /// a client added never goes unseen), bytes that are not UTF-8
    /// replaced (so that they match nothing).
    fn header(&self, name: &str) -> Option<Cow<'_, str>>;
    /// The body Envoy buffered, if it sent one.
    fn body(&self) -> Option<&[u8]>;
    /// The peer principal (`attributes.source.principal`), if any.
    fn principal(&self) -> Option<&str>;
    /// A claim of the verified JWT whose payload the JWT filter stored
    /// under `payload`; `Err` says why it is not a usable string.
    fn jwt_claim(&self, payload: &str, claim: &str) -> Result<String, String>;
}

/// Why a request is refused before any decision (the stable reasons of a
/// Check besides Decide's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestRefusal {
    /// A POST without a body.
    BodyMissing,
    /// Envoy sent part of the body (`x-envoy-auth-partial-body: true`).
    BodyTruncated,
    /// The body is not (strict) JSON.
    BodyNotJson,
    /// A POST's body is not declared as UTF-8 JSON as it is (its
    /// `Content-Type` is not `application/json` with at most
    /// `charset=utf-8`, or it has a content coding).
    UnsupportedMediaType,
    /// A JSON-RPC batch.
    Batch,
    /// A JSON value that is not a JSON-RPC request.
    NotJsonRpc,
    /// Member names that differ only in case (as Go's `encoding/json`
    /// folds them) in one object, or a member of the envelope or `params`
    /// that folds to a name toolgate reads without being it.
    AmbiguousMemberNames,
    /// `Mcp-Method` or `Mcp-Name` disagrees with the body.
    HeaderMismatch,
    /// A `tools/call` whose params or tool name are malformed.
    InvalidToolCall,
    /// The arguments fail the tool's input schema (Decide's
    /// INVALID_ARGUMENT).
    InvalidArguments,
    /// No usable actor (header, claim or principal).
    ActorMissing,
    /// An actor the host credential the adapter acts with may not assert.
    ActorNotPermitted,
    /// No session id header, or not one usable session id.
    SessionMissing,
    /// No usable workspace.
    WorkspaceMissing,
    /// The session id runs as another actor, or in another workspace
    /// (Decide's INVALID_ARGUMENT on `session.*`).
    SessionConflict,
    /// A method other than `tools/call` while `other_methods = "deny"`.
    MethodNotAllowed,
    /// A limit of the state is reached (Decide's RESOURCE_EXHAUSTED: the
    /// sessions of the host, pending requests of the actor, the byte
    /// budget): the call may pass later, so HTTP 429.
    ResourceExhausted,
}

impl RequestRefusal {
    pub const ALL: [RequestRefusal; 17] = [
        RequestRefusal::BodyMissing,
        RequestRefusal::BodyTruncated,
        RequestRefusal::BodyNotJson,
        RequestRefusal::UnsupportedMediaType,
        RequestRefusal::Batch,
        RequestRefusal::NotJsonRpc,
        RequestRefusal::AmbiguousMemberNames,
        RequestRefusal::HeaderMismatch,
        RequestRefusal::InvalidToolCall,
        RequestRefusal::InvalidArguments,
        RequestRefusal::ActorMissing,
        RequestRefusal::ActorNotPermitted,
        RequestRefusal::SessionMissing,
        RequestRefusal::WorkspaceMissing,
        RequestRefusal::SessionConflict,
        RequestRefusal::MethodNotAllowed,
        RequestRefusal::ResourceExhausted,
    ];

    /// The stable kebab-case reason.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestRefusal::BodyMissing => "body-missing",
            RequestRefusal::BodyTruncated => "body-truncated",
            RequestRefusal::BodyNotJson => "body-not-json",
            RequestRefusal::UnsupportedMediaType => "unsupported-media-type",
            RequestRefusal::Batch => "batch-not-supported",
            RequestRefusal::NotJsonRpc => "not-json-rpc",
            RequestRefusal::AmbiguousMemberNames => "ambiguous-member-names",
            RequestRefusal::HeaderMismatch => "mcp-header-mismatch",
            RequestRefusal::InvalidToolCall => "invalid-tool-call",
            RequestRefusal::InvalidArguments => "invalid-arguments",
            RequestRefusal::ActorMissing => "actor-missing",
            RequestRefusal::ActorNotPermitted => "actor-not-permitted",
            RequestRefusal::SessionMissing => "session-missing",
            RequestRefusal::WorkspaceMissing => "workspace-missing",
            RequestRefusal::SessionConflict => "session-conflict",
            RequestRefusal::MethodNotAllowed => "method-not-allowed",
            RequestRefusal::ResourceExhausted => "resource-exhausted",
        }
    }

    /// The HTTP status of the denied answer: 429 for a limit the call may
    /// pass later, 403 otherwise.
    pub fn http_status(self) -> u16 {
        match self {
            RequestRefusal::ResourceExhausted => 429,
            _ => 403,
        }
    }

    /// The JSON-RPC error code of the denied answer.
    pub fn json_rpc_code(self) -> i64 {
        match self {
            RequestRefusal::BodyNotJson => PARSE_ERROR,
            RequestRefusal::InvalidArguments | RequestRefusal::InvalidToolCall => INVALID_PARAMS,
            RequestRefusal::MethodNotAllowed
            | RequestRefusal::ActorNotPermitted
            | RequestRefusal::ResourceExhausted => DENIED,
            _ => INVALID_REQUEST,
        }
    }
}

/// JSON-RPC's codes, and the two of toolgate's answers (in the range
/// JSON-RPC leaves to servers).
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;
/// Denied by policy (DENY).
pub const DENIED: i64 = -32001;
/// A reviewer must approve this exact call first (REQUIRE_APPROVAL).
pub const APPROVAL_REQUIRED: i64 = -32002;

/// A refused request: the reason, what exactly is wrong, the JSON-RPC id
/// when the body had one, and the proposal's fingerprint when there was a
/// proposal (the engine refused it).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub refusal: RequestRefusal,
    pub message: String,
    pub id: Value,
    pub fingerprint: Option<Fingerprint>,
}

/// What a request is.
#[derive(Debug, Clone, PartialEq)]
pub enum McpRequest {
    /// A `tools/call`: decide it (boxed: it is most of the enum's size).
    ToolCall(Box<ToolCall>),
    /// Any other MCP request (`initialize`, `tools/list`, a notification,
    /// a response to the server's request, the GET stream, a DELETE of the
    /// session): the method when a body named one, and the JSON-RPC id.
    Other { method: Option<String>, id: Value },
}

/// A `tools/call` as a session and a proposal.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The trusted session, not yet in a host's namespace.
    pub session: SessionRef,
    pub proposal: Proposal,
    /// The JSON-RPC id, echoed in a denied answer.
    pub id: Value,
}

type Refusable<T> = std::result::Result<T, Box<Refused>>;

fn refused(refusal: RequestRefusal, message: impl Into<String>, id: &Value) -> Box<Refused> {
    Box::new(Refused {
        refusal,
        message: message.into(),
        id: id.clone(),
        fingerprint: None,
    })
}

/// What `request` is, under the policy's `[ext_authz]` mapping. A POST must
/// carry the whole body as one JSON-RPC request, declared as UTF-8 JSON; a
/// `tools/call` must name its session, actor and workspace as the mapping
/// says. GET, DELETE, HEAD and OPTIONS without a body are other requests;
/// any other HTTP method is refused.
pub fn classify(settings: &ExtAuthzSettings, request: &impl HttpRequest) -> Refusable<McpRequest> {
    let none = Value::Null;
    let method = request.method();
    if BODYLESS_METHODS
        .iter()
        .any(|bodyless| method.eq_ignore_ascii_case(bodyless))
    {
        // Only a POST's body is decided: one elsewhere is refused, not
        // passed on for a lenient server to run.
        if request.body().is_some_and(|body| !body.is_empty()) {
            return Err(refused(
                RequestRefusal::MethodNotAllowed,
                format!(
                    "HTTP {:?} carries no JSON-RPC message in MCP's streamable HTTP, \
                     but this one has a body: a message comes in a POST",
                    shown(method)
                ),
                &none,
            ));
        }
        return Ok(McpRequest::Other {
            method: None,
            id: none,
        });
    }
    // Only a POST's body is decided, so no other method that a lenient
    // server might read one from (PUT, PATCH, …) passes as another request.
    if !method.eq_ignore_ascii_case("POST") {
        return Err(refused(
            RequestRefusal::MethodNotAllowed,
            format!(
                "HTTP {:?} is not a method of MCP's streamable HTTP: a JSON-RPC \
                 message comes in a POST (GET opens the stream, DELETE ends the session)",
                shown(method)
            ),
            &none,
        ));
    }
    // Any copy that says true (a client may have sent one that says false).
    if request.header(PARTIAL_BODY_HEADER).is_some_and(|value| {
        value
            .split(',')
            .any(|copy| copy.trim().eq_ignore_ascii_case("true"))
    }) {
        return Err(refused(
            RequestRefusal::BodyTruncated,
            "Envoy sent only part of the body (x-envoy-auth-partial-body: true): raise \
             with_request_body.max_request_bytes and keep allow_partial_message: false",
            &none,
        ));
    }
    let body = match request.body() {
        Some(body) if !body.is_empty() => body,
        _ => {
            return Err(refused(
                RequestRefusal::BodyMissing,
                "a POST must carry its JSON-RPC body: configure the ext_authz filter's \
                 with_request_body",
                &none,
            ));
        }
    };
    check_media_type(request)?;
    let mut message = match canonical::parse(body) {
        Ok(Value::Object(message)) => message,
        Ok(Value::Array(_)) => {
            return Err(refused(
                RequestRefusal::Batch,
                "a JSON-RPC batch is not decided; send one request per POST",
                &none,
            ));
        }
        Ok(other) => {
            return Err(refused(
                RequestRefusal::NotJsonRpc,
                format!(
                    "the body must be a JSON-RPC object, not {}",
                    other.kind_name()
                ),
                &none,
            ));
        }
        Err(error) => {
            return Err(refused(
                RequestRefusal::BodyNotJson,
                format!("the body is not JSON: {error}"),
                &none,
            ));
        }
    };
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    check_member_names(&message, &id)?;
    let Some(method) = json_rpc_method(&message, &id)? else {
        // A response to a server's request (sampling, elicitation, roots).
        if let Some(header) = request.header(MCP_METHOD_HEADER) {
            return Err(refused(
                RequestRefusal::HeaderMismatch,
                format!(
                    "header {MCP_METHOD_HEADER} says {:?} but the body is a JSON-RPC response",
                    shown(&header)
                ),
                &id,
            ));
        }
        return Ok(McpRequest::Other { method: None, id });
    };
    check_header(request, MCP_METHOD_HEADER, method, &id)?;
    if method != "tools/call" {
        return Ok(McpRequest::Other {
            method: Some(method.to_string()),
            id,
        });
    }
    let (name, arguments) = tool_call_params(&message, &id)?;
    check_header(request, MCP_NAME_HEADER, name, &id)?;
    let session = session_of(settings, request, &id)?;
    let call_id = call_id_of(request, &session.session_id, name, arguments);
    let name = name.to_string();
    let proposal = Proposal::with_arguments(
        call_id,
        session.actor.clone(),
        name,
        0,
        take_arguments(&mut message),
    )
    .map_err(|error| match error {
        Error::InvalidArgument { field, rule } => refused(
            RequestRefusal::InvalidToolCall,
            format!("params.{field}: {rule}"),
            &id,
        ),
        other => refused(RequestRefusal::InvalidToolCall, other.to_string(), &id),
    })?;
    Ok(McpRequest::ToolCall(Box::new(ToolCall {
        session,
        proposal,
        id,
    })))
}

/// A POST's body is read as the server will read it only when it is UTF-8
/// JSON as sent: `Content-Type: application/json` (case aside, with at most
/// a `charset=utf-8` parameter) and no content coding but `identity`.
/// Another charset would have a server decode the same bytes into another
/// message (in UTF-7, `+ACI-` is a quote), and a coding is bytes that are
/// not the message; an absent type is refused too, as MCP's servers do.
fn check_media_type(request: &impl HttpRequest) -> Refusable<()> {
    let unsupported = |message: String| {
        Err(refused(
            RequestRefusal::UnsupportedMediaType,
            message,
            &Value::Null,
        ))
    };
    let Some(content_type) = request.header(CONTENT_TYPE_HEADER) else {
        return unsupported(format!(
            "a POST's body must be declared {CONTENT_TYPE_HEADER}: application/json; \
             there is no {CONTENT_TYPE_HEADER} header"
        ));
    };
    let mut parts = content_type.split(';');
    let media_type = parts.next().unwrap_or_default().trim();
    let utf8_json = media_type.eq_ignore_ascii_case("application/json")
        && parts.all(|parameter| match parameter.split_once('=') {
            Some((name, value)) => {
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .and_then(|value| value.strip_suffix('"'))
                    .unwrap_or(value);
                name.trim().eq_ignore_ascii_case("charset") && value.eq_ignore_ascii_case("utf-8")
            }
            None => parameter.trim().is_empty(),
        });
    if !utf8_json {
        return unsupported(format!(
            "header {CONTENT_TYPE_HEADER} is {:?}: a POST's body must be application/json, \
             with no parameter but charset=utf-8 (one header, one value)",
            shown(&content_type)
        ));
    }
    if let Some(coding) = request.header(CONTENT_ENCODING_HEADER)
        && !coding
            .split(',')
            .all(|coding| coding.trim().eq_ignore_ascii_case("identity"))
    {
        return unsupported(format!(
            "header {CONTENT_ENCODING_HEADER} is {:?}: a body is decided only as it is \
             sent, with no content coding (decompress it before the ext_authz filter)",
            shown(&coding)
        ));
    }
    Ok(())
}

/// The members of the JSON-RPC envelope and of `params` that toolgate or a
/// server reads.
const ENVELOPE_MEMBERS: [&str; 6] = ["error", "id", "jsonrpc", "method", "params", "result"];
const PARAMS_MEMBERS: [&str; 3] = ["_meta", "arguments", "name"];

/// Member names are read as toolgate reads them only when no two of one
/// object fold equal: Go's `encoding/json` matches a struct's fields
/// case-insensitively (with Unicode folding: `ſ` is `s`, the Kelvin sign
/// `k`) and keeps the last member that matches, so `"params"` then
/// `"Params"` would have a Go server run the second while toolgate decides
/// the first (CVE-2026-27896). Refused anywhere in the message, and so is
/// a member of the envelope or of `params` that folds to a name toolgate
/// reads without being it (`"Method"` alone).
fn check_member_names(message: &Object, id: &Value) -> Refusable<()> {
    let ambiguous =
        |message: String| Err(refused(RequestRefusal::AmbiguousMemberNames, message, id));
    if let Some((first, second)) = folded_twice(message) {
        return ambiguous(format!(
            "members {:?} and {:?} of one object differ only in case, and some servers \
             (Go's encoding/json) read them as one",
            shown(first),
            shown(second)
        ));
    }
    let params = message.get("params").and_then(Value::as_object);
    for (object, names, path) in [
        (Some(message), &ENVELOPE_MEMBERS[..], ""),
        (params, &PARAMS_MEMBERS[..], "params."),
    ] {
        let Some(object) = object else { continue };
        for key in object.keys().filter(|key| !is_folded(key)) {
            if let Some(name) = names
                .iter()
                .find(|name| unicase::UniCase::unicode(*name) == unicase::UniCase::unicode(key))
            {
                return ambiguous(format!(
                    "{path}{:?}: write it {name:?}; some servers (Go's encoding/json) read \
                     it as {name:?}, toolgate does not",
                    shown(key)
                ));
            }
        }
    }
    Ok(())
}

/// Two member names of one object, `object` or one within it, that fold
/// equal.
fn folded_twice(object: &Object) -> Option<(&str, &str)> {
    if !object.keys().all(is_folded) {
        let mut folded: Vec<_> = object.keys().map(unicase::UniCase::unicode).collect();
        folded.sort_unstable();
        if let Some(pair) = folded.windows(2).find(|pair| pair[0] == pair[1]) {
            return Some((*pair[0], *pair[1]));
        }
    }
    object
        .iter()
        .find_map(|(_, value)| nested_folded_twice(value))
}

fn nested_folded_twice(value: &Value) -> Option<(&str, &str)> {
    match value {
        Value::Object(object) => folded_twice(object),
        Value::Array(items) => items.iter().find_map(nested_folded_twice),
        _ => None,
    }
}

/// A name that is its own folding: ASCII with no capital letter (two such
/// names fold equal only when they are equal, which the parser refuses).
fn is_folded(name: &str) -> bool {
    name.bytes()
        .all(|byte| byte.is_ascii() && !byte.is_ascii_uppercase())
}

/// The request's `method`, checked to be a JSON-RPC 2.0 request; `None`
/// for a JSON-RPC response (an `id` and one of `result` and `error`).
fn json_rpc_method<'m>(message: &'m Object, id: &Value) -> Refusable<Option<&'m str>> {
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(refused(
            RequestRefusal::NotJsonRpc,
            "jsonrpc: must be \"2.0\"",
            id,
        ));
    }
    match message.get("method") {
        Some(Value::String(method)) => Ok(Some(method)),
        Some(other) => Err(refused(
            RequestRefusal::NotJsonRpc,
            format!("method: must be a string, not {}", other.kind_name()),
            id,
        )),
        None if message.get("id").is_some()
            && (message.get("result").is_some() != message.get("error").is_some()) =>
        {
            Ok(None)
        }
        None => Err(refused(
            RequestRefusal::NotJsonRpc,
            "method: is required (or, for a response, an id and one of result and error)",
            id,
        )),
    }
}

/// A header, when present, must say what the body says.
fn check_header(
    request: &impl HttpRequest,
    header: &str,
    in_body: &str,
    id: &Value,
) -> Refusable<()> {
    match request.header(header) {
        Some(value) if value != in_body => Err(refused(
            RequestRefusal::HeaderMismatch,
            format!(
                "header {header} says {:?} but the body says {in_body:?}",
                shown(&value)
            ),
            id,
        )),
        _ => Ok(()),
    }
}

/// `params.name` and `params.arguments` (an absent `arguments` is `{}`),
/// the arguments' canonical text within Decide's [`MAX_ARGUMENTS_BYTES`].
/// The body's length does not bound that text: canonical JSON escapes a
/// one-byte DEL or a three-byte character to six.
fn tool_call_params<'m>(message: &'m Object, id: &Value) -> Refusable<(&'m str, &'m Object)> {
    static EMPTY: std::sync::LazyLock<Object> = std::sync::LazyLock::new(Object::new);
    let Some(params) = message.get("params").and_then(Value::as_object) else {
        return Err(refused(
            RequestRefusal::InvalidToolCall,
            "params: a tools/call needs a params object",
            id,
        ));
    };
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(refused(
            RequestRefusal::InvalidToolCall,
            "params.name: must be a string (the tool's name)",
            id,
        ));
    };
    let arguments = match params.get("arguments") {
        None => &EMPTY,
        Some(value @ Value::Object(_))
            if canonical::canonical_len_over(value, MAX_ARGUMENTS_BYTES).is_some() =>
        {
            return Err(refused(
                RequestRefusal::InvalidArguments,
                format!(
                    "params.arguments: must be at most {MAX_ARGUMENTS_BYTES} bytes \
                     (canonical JSON), as a Decide's arguments_json"
                ),
                id,
            ));
        }
        Some(Value::Object(arguments)) => arguments,
        Some(other) => {
            return Err(refused(
                RequestRefusal::InvalidToolCall,
                format!(
                    "params.arguments: must be an object, not {}",
                    other.kind_name()
                ),
                id,
            ));
        }
    };
    Ok((name, arguments))
}

/// `params.arguments`, moved out of a message [`tool_call_params`] accepted
/// (an object, or absent: `{}`), so that the proposal owns it uncopied.
fn take_arguments(message: &mut Object) -> Object {
    match message.get_mut("params") {
        Some(Value::Object(params)) => match params.remove("arguments") {
            Some(Value::Object(arguments)) => arguments,
            _ => Object::new(),
        },
        _ => Object::new(),
    }
}

/// The trusted session: actor, session id and workspace as the mapping says.
fn session_of(
    settings: &ExtAuthzSettings,
    request: &impl HttpRequest,
    id: &Value,
) -> Refusable<SessionRef> {
    let actor = actor_of(settings, request, id)?;
    let Some(session_header) = request.header(&settings.session_header) else {
        return Err(refused(
            RequestRefusal::SessionMissing,
            format!("no {} header", settings.session_header),
            id,
        ));
    };
    // MCP's session ids are visible ASCII; a comma is two copies of the
    // header joined, of which the server may read either.
    if session_header.is_empty()
        || !session_header
            .bytes()
            .all(|byte| (0x21..=0x7e).contains(&byte) && byte != b',')
    {
        return Err(refused(
            RequestRefusal::SessionMissing,
            format!(
                "header {}: {:?} is not one session id (visible ASCII, no comma; \
                 a repeated header counts as its copies joined with ',')",
                settings.session_header,
                shown(&session_header)
            ),
            id,
        ));
    }
    let session_id = as_identifier("s-", &session_header);
    let workspace = match &settings.workspace {
        WorkspaceSource::Fixed(workspace) => workspace.clone(),
        WorkspaceSource::Header(header) => match request.header(header) {
            Some(value) if check_identifier(header, &value).is_ok() => value.into_owned(),
            Some(value) => {
                return Err(refused(
                    RequestRefusal::WorkspaceMissing,
                    format!(
                        "header {header}: {:?} is not a workspace name ([A-Za-z][A-Za-z0-9_-]{{0,39}})",
                        shown(&value)
                    ),
                    id,
                ));
            }
            None => {
                return Err(refused(
                    RequestRefusal::WorkspaceMissing,
                    format!("no {header} header"),
                    id,
                ));
            }
        },
    };
    SessionRef::new(actor, session_id, workspace)
        .map_err(|error| refused(RequestRefusal::InvalidToolCall, error.to_string(), id))
}

/// The actor, from the header, the JWT claim or the principal.
fn actor_of(
    settings: &ExtAuthzSettings,
    request: &impl HttpRequest,
    id: &Value,
) -> Refusable<String> {
    let found = match &settings.actor {
        ActorSource::Header(header) => request
            .header(header)
            .map(Cow::into_owned)
            .ok_or_else(|| format!("no {header} header")),
        ActorSource::Claim { claim, payload } => request.jwt_claim(payload, claim),
        ActorSource::Principal(principals) => request
            .principal()
            .filter(|principal| !principal.is_empty())
            .ok_or_else(|| "no peer principal (attributes.source.principal)".to_string())
            .map(|principal| {
                principals
                    .get(principal)
                    .cloned()
                    .unwrap_or_else(|| principal.to_string())
            }),
        ActorSource::Unset => Err("[ext_authz] names no actor source (actor_header, \
             actor_claim or actor_from_principal): no tool call is decided"
            .to_string()),
    };
    let actor = found.map_err(|why| refused(RequestRefusal::ActorMissing, why, id))?;
    check_identifier("actor", &actor).map_err(|_| {
        refused(
            RequestRefusal::ActorMissing,
            format!(
                "{}: {:?} is not an actor name ([A-Za-z][A-Za-z0-9_-]{{0,39}})",
                settings.actor,
                shown(&actor)
            ),
            id,
        )
    })?;
    Ok(actor)
}

/// The call id: the `Idempotency-Key` when there is one, otherwise derived
/// from the session, the tool and the canonical arguments, so that a retry
/// with a new JSON-RPC id is the same action.
fn call_id_of(
    request: &impl HttpRequest,
    session_id: &str,
    name: &str,
    arguments: &Object,
) -> String {
    if let Some(key) = request.header(IDEMPOTENCY_KEY_HEADER) {
        return as_identifier("k-", &key);
    }
    let action = canonical::fingerprint_object(|action| {
        action.member_object("arguments", arguments);
        action.member_str("name", name);
        action.member_str("session_id", session_id);
    });
    prefixed_hex32("mcp-", &action)
}

/// `text` when it is an identifier; otherwise `prefix` and 32 hex digits of
/// its SHA-256 (MCP session ids and idempotency keys are often UUIDs, which
/// may start with a digit).
fn as_identifier(prefix: &str, text: &str) -> String {
    if check_identifier("", text).is_ok() {
        return text.to_string();
    }
    prefixed_hex32(prefix, &Fingerprint::of_bytes(text.as_bytes()))
}

/// `prefix` and the first 32 hex digits of `fingerprint`.
fn prefixed_hex32(prefix: &str, fingerprint: &Fingerprint) -> String {
    [prefix, &fingerprint.hex()[..32]].concat()
}

/// At most 64 characters of a client's text, for a message.
fn shown(text: &str) -> &str {
    first_chars(text, 64).0
}

/// The JSON-RPC error body of a denied answer: the request's `id`, the
/// code, the message, and `data` (the reason, fingerprint, approval id …).
pub fn error_body(id: &Value, code: i64, message: &str, data: Object) -> String {
    let mut error = Object::new();
    error.insert("code", Value::from(code));
    error.insert("message", Value::from(message));
    error.insert("data", Value::Object(data));
    let mut body = Object::new();
    body.insert("jsonrpc", Value::from("2.0"));
    body.insert("id", id.clone());
    body.insert("error", Value::Object(error));
    canonical::to_canonical(&Value::Object(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason a Check can be refused with is one the contract names
    /// (§9), and no two refusals share one.
    #[test]
    fn every_refusal_reason_is_in_the_contract_once() {
        let contract = include_str!("../../docs/contract.md");
        let mut reasons = std::collections::BTreeSet::new();
        for refusal in RequestRefusal::ALL {
            let reason = refusal.as_str();
            assert!(
                contract.contains(&format!("`{reason}`")),
                "docs/contract.md does not name {reason}"
            );
            assert!(reasons.insert(reason), "{reason} twice");
        }
    }

    struct Request {
        method: &'static str,
        headers: Vec<(&'static str, &'static str)>,
        body: Option<&'static str>,
    }

    impl HttpRequest for Request {
        fn method(&self) -> &str {
            self.method
        }
        fn header(&self, name: &str) -> Option<Cow<'_, str>> {
            self.headers
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| Cow::Borrowed(*value))
        }
        fn body(&self) -> Option<&[u8]> {
            self.body.map(str::as_bytes)
        }
        fn principal(&self) -> Option<&str> {
            None
        }
        fn jwt_claim(&self, _: &str, _: &str) -> Result<String, String> {
            Err("no JWT".into())
        }
    }

    /// The default settings, the actor from header `x-toolgate-actor`.
    fn header_settings() -> ExtAuthzSettings {
        ExtAuthzSettings {
            actor: ActorSource::Header("x-toolgate-actor".into()),
            ..ExtAuthzSettings::default()
        }
    }

    fn post(body: &'static str) -> Request {
        Request {
            method: "POST",
            headers: vec![
                ("x-toolgate-actor", "agent"),
                ("mcp-session-id", "s1"),
                (CONTENT_TYPE_HEADER, "application/json"),
            ],
            body: Some(body),
        }
    }

    fn refusal(request: &Request) -> RequestRefusal {
        classify(&header_settings(), request)
            .expect_err("refused")
            .refusal
    }

    #[test]
    fn a_retry_with_a_new_json_rpc_id_is_the_same_call() {
        let first = post(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"b":1,"a":2}}}"#,
        );
        let retry = post(
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t","arguments":{"a":2,"b":1}}}"#,
        );
        let settings = header_settings();
        let (Ok(McpRequest::ToolCall(first)), Ok(McpRequest::ToolCall(retry))) =
            (classify(&settings, &first), classify(&settings, &retry))
        else {
            panic!("both are tool calls");
        };
        assert_eq!(first.proposal.fingerprint, retry.proposal.fingerprint);
        assert!(first.proposal.call_id.starts_with("mcp-"));
        assert_eq!(first.id, Value::from(1i64));
    }

    #[test]
    fn malformed_bodies_are_refused_with_their_reason() {
        assert_eq!(refusal(&post("[]")), RequestRefusal::Batch);
        assert_eq!(refusal(&post("{")), RequestRefusal::BodyNotJson);
        assert_eq!(refusal(&post("{}")), RequestRefusal::NotJsonRpc);
        assert_eq!(
            refusal(&post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#)),
            RequestRefusal::InvalidToolCall
        );
        let mut partial = post("{}");
        partial.headers.push((PARTIAL_BODY_HEADER, "true"));
        assert_eq!(refusal(&partial), RequestRefusal::BodyTruncated);
        let mut mismatch =
            post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#);
        mismatch.headers.push((MCP_NAME_HEADER, "other"));
        assert_eq!(refusal(&mismatch), RequestRefusal::HeaderMismatch);
    }

    /// `post(body)` with one header set (replaced, or added), or removed.
    fn with_header(body: &'static str, name: &'static str, value: Option<&'static str>) -> Request {
        let mut request = post(body);
        request.headers.retain(|(key, _)| *key != name);
        request.headers.extend(value.map(|value| (name, value)));
        request
    }

    const TOOL_CALL: &str =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#;

    fn is_tool_call(request: &Request) -> bool {
        matches!(
            classify(&header_settings(), request),
            Ok(McpRequest::ToolCall(_))
        )
    }

    /// Only a body declared as UTF-8 JSON, with no content coding, is
    /// read: in another charset a server would decode the same bytes into
    /// another message.
    #[test]
    fn a_body_not_declared_as_utf8_json_is_refused() {
        for content_type in [
            "application/json",
            "Application/JSON; Charset=\"UTF-8\"",
            "application/json;charset=utf-8;",
        ] {
            let request = with_header(TOOL_CALL, CONTENT_TYPE_HEADER, Some(content_type));
            assert!(is_tool_call(&request), "{content_type}");
        }
        for content_type in [
            None,
            Some("application/json; charset=utf-7"),
            Some("application/json; charset=shift_jis"),
            Some("application/json; profile=x"),
            Some("text/plain"),
            Some("application/json,text/plain"),
            Some(""),
        ] {
            let request = with_header(TOOL_CALL, CONTENT_TYPE_HEADER, content_type);
            assert_eq!(
                refusal(&request),
                RequestRefusal::UnsupportedMediaType,
                "{content_type:?}"
            );
        }
        let identity = with_header(TOOL_CALL, CONTENT_ENCODING_HEADER, Some("identity"));
        assert!(is_tool_call(&identity));
        for coding in ["gzip", "br", "identity,gzip"] {
            let request = with_header(TOOL_CALL, CONTENT_ENCODING_HEADER, Some(coding));
            assert_eq!(refusal(&request), RequestRefusal::UnsupportedMediaType);
        }
    }

    /// One session id of visible ASCII: two copies of the header (joined
    /// with a comma) would let the call be counted in a session the server
    /// does not run it in.
    #[test]
    fn a_session_header_that_is_not_one_session_id_is_refused() {
        let uuid = with_header(
            TOOL_CALL,
            "mcp-session-id",
            Some("0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5"),
        );
        assert!(is_tool_call(&uuid));
        for session in ["s1,s1", "s1, s2", "", "s 1", "s\u{e9}"] {
            let request = with_header(TOOL_CALL, "mcp-session-id", Some(session));
            assert_eq!(
                refusal(&request),
                RequestRefusal::SessionMissing,
                "{session:?}"
            );
        }
    }

    /// A method that carries no message is another request only without a
    /// body: with one, it is refused whatever `other_methods` says.
    #[test]
    fn a_bodyless_method_with_a_body_is_refused() {
        for method in ["GET", "delete"] {
            let mut request = post(TOOL_CALL);
            request.method = method;
            assert_eq!(refusal(&request), RequestRefusal::MethodNotAllowed);
            request.body = None;
            assert!(matches!(
                classify(&header_settings(), &request),
                Ok(McpRequest::Other { method: None, .. })
            ));
        }
    }

    /// Member names a Go server (encoding/json: case-insensitive, Unicode
    /// folding, the last match kept) would read as one are refused, in the
    /// envelope, in `params` and anywhere in the arguments.
    #[test]
    fn member_names_that_fold_equal_are_refused() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"Params":{"name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"},"param\u017f":{"name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","Name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"amount":5,"Amount":50000}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"items":[{"\u212aey":1,"key":2}]}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"Method":"tools/call","result":{},"params":{"name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"NAME":"b"}}"#,
        ] {
            let request = with_header(body, CONTENT_TYPE_HEADER, Some("application/json"));
            assert_eq!(
                refusal(&request),
                RequestRefusal::AmbiguousMemberNames,
                "{body}"
            );
        }
        let camel = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"userId":1,"Zone":"eu","nested":{"X":1}}}}"#;
        assert!(is_tool_call(&post(camel)));
    }

    /// Owned bytes as a POST body, for the property below.    /// Owned bytes as a POST body, for the property below.
    struct Bytes(Vec<u8>);

    impl HttpRequest for Bytes {
        fn method(&self) -> &str {
            "POST"
        }
        fn header(&self, name: &str) -> Option<Cow<'_, str>> {
            match name {
                "x-toolgate-actor" => Some(Cow::Borrowed("agent")),
                "mcp-session-id" => Some(Cow::Borrowed("s1")),
                CONTENT_TYPE_HEADER => Some(Cow::Borrowed("application/json")),
                _ => None,
            }
        }
        fn body(&self) -> Option<&[u8]> {
            Some(&self.0)
        }
        fn principal(&self) -> Option<&str> {
            None
        }
        fn jwt_claim(&self, _: &str, _: &str) -> Result<String, String> {
            Err("no JWT".into())
        }
    }

    proptest::proptest! {
        /// Whatever the body, a request is classified or refused with a
        /// reason and a message: never a panic.
        #[test]
        fn any_body_is_classified_or_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            if let Err(refused) = classify(&header_settings(), &Bytes(body)) {
                proptest::prop_assert!(!refused.message.is_empty());
            }
        }

        /// A well-formed tools/call of any tool name and any arguments
        /// object is a tool call when the name is an identifier, and is
        /// refused `invalid-tool-call` otherwise.
        #[test]
        fn any_tool_call_is_classified_or_refused(
            name in ".{0,50}",
            arguments in proptest::collection::btree_map(".{0,12}", proptest::prelude::any::<i64>(), 0..4),
        ) {
            let body = serde_json::json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            });
            let classified = classify(&header_settings(), &Bytes(body.to_string().into_bytes()));
            match classified {
                Ok(McpRequest::ToolCall(call)) => {
                    proptest::prop_assert_eq!(&call.proposal.name, &name);
                    proptest::prop_assert_eq!(call.proposal.arguments.len(), arguments.len());
                }
                Ok(other) => proptest::prop_assert!(false, "not a tool call: {other:?}"),
                Err(refused) => {
                    proptest::prop_assert!(check_identifier("name", &name).is_err());
                    proptest::prop_assert_eq!(refused.refusal, RequestRefusal::InvalidToolCall);
                }
            }
        }
    }

    #[test]
    fn a_session_id_that_is_no_identifier_is_hashed() {
        assert_eq!(as_identifier("s-", "abc"), "abc");
        let hashed = as_identifier("s-", "0c1d-uuid");
        assert!(hashed.starts_with("s-") && hashed.len() == 34);
    }
}
