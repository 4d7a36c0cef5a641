//! Envoy's external authorization, `envoy.service.auth.v3.Authorization/Check`
//! (issue 17): the edge maps Envoy's Check onto the MCP request it carries
//! (`domain::mcp`), asks the engine about a `tools/call` as Decide would —
//! consuming a grant at once ([`Engine::authorize`]) — and maps the answer
//! back: an OK response with `x-toolgate-*` headers upstream, or a denied
//! one (HTTP 403, a JSON-RPC error body with the request's id); dynamic
//! metadata on every answer.

use std::borrow::Cow;
use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::auth::v3::attribute_context;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value as ProtoValue, value::Kind};
use envoy_types::pb::google::rpc;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::domain::canonical::{Object, Value};
use crate::domain::decision::{Decision, Outcome};
use crate::domain::error::{Error, Result};
use crate::domain::mcp::{self, HttpRequest as _, McpRequest, Refused, RequestRefusal};
use crate::edge::auth::{Caller, Reach};
use crate::edge::status::{audit_rejected, note_session};
use crate::edge::unary::unary;
use crate::engine::Engine;
use crate::pb::envoy_auth::authorization_server::Authorization;

/// The metadata namespace of Envoy's JWT filter, where `actor_claim` is read.
const JWT_AUTHN: &str = "envoy.filters.http.jwt_authn";
/// The headers an allowed request carries upstream.
pub(crate) const DECISION_ID_HEADER: &str = "x-toolgate-decision-id";
pub(crate) const FINGERPRINT_HEADER: &str = "x-toolgate-fingerprint";

#[derive(Debug, Clone)]
pub(crate) struct ExtAuthzService {
    engine: Engine,
}

impl ExtAuthzService {
    pub(crate) fn new(engine: Engine) -> Self {
        ExtAuthzService { engine }
    }

    /// The answer to one Check: what the request is, and for a
    /// `tools/call` the engine's decision.
    async fn answer(&self, caller: &Caller, check: &CheckRequest) -> Result<Answer> {
        let policy = self.engine.policy();
        let settings = &policy.ext_authz;
        if let Some(identity) = &settings.host_credential
            && &caller.identity != identity
        {
            return Err(Error::PermissionDenied(format!(
                "ext_authz acts with host credential {identity:?}; this call authenticated as {:?}",
                caller.identity
            )));
        }
        let decision_id = Uuid::new_v4();
        let request = CheckView::of(check);
        let call = match mcp::classify(settings, &request) {
            Ok(McpRequest::ToolCall(call)) => call,
            Ok(McpRequest::Other { .. }) if settings.allow_other_methods => {
                return Ok(Answer::OtherAllowed { decision_id });
            }
            Ok(McpRequest::Other { method, id }) => {
                let what = match &method {
                    Some(method) => format!("{:?}", method.chars().take(64).collect::<String>()),
                    None if request.method().eq_ignore_ascii_case("POST") => {
                        "a JSON-RPC response".to_string()
                    }
                    None => format!("{:?}", request.method()),
                };
                return Ok(refused(
                    decision_id,
                    Refused {
                        refusal: RequestRefusal::MethodNotAllowed,
                        message: format!(
                            "only tools/call is let through ([ext_authz] other_methods = \"deny\"), not {what}"
                        ),
                        id,
                        fingerprint: None,
                    },
                ));
            }
            Err(refusal) => return Ok(refused(decision_id, *refusal)),
        };
        // The actor comes from the request (a header, a claim, the peer
        // principal): one the host credential may not assert is the
        // client's to hear of, as a denied answer, not a failed Check.
        if !caller.may_assert(&call.session.actor) {
            return Ok(refused(
                decision_id,
                Refused {
                    refusal: RequestRefusal::ActorNotPermitted,
                    message: caller.may_not_act_for(&call.session.actor),
                    id: call.id,
                    fingerprint: None,
                },
            ));
        }
        let session = call.session.for_host(&caller.identity);
        match self
            .engine
            .authorize(&session, &call.proposal, decision_id)
            .await
            .inspect_err(|_| note_session(&session))
        {
            Ok((decision, _revision)) => Ok(Answer::Decided {
                decision_id,
                decision,
                id: call.id,
            }),
            // Decide's INVALID_ARGUMENT: a denied answer with the field
            // and the rule, its reason by the field (the session's binding,
            // or the arguments: the tool's schema, the size of a request
            // for approval).
            Err(Error::InvalidArgument { field, rule }) => {
                let refusal = match field.starts_with("session.") {
                    true => RequestRefusal::SessionConflict,
                    false => RequestRefusal::InvalidArguments,
                };
                Ok(refused(
                    decision_id,
                    Refused {
                        refusal,
                        message: format!("{field}: {rule}"),
                        id: call.id,
                        fingerprint: Some(call.proposal.fingerprint),
                    },
                ))
            }
            // A limit of the state: the client's to hear of (it may retry
            // later), like a refusal, not a failed Check.
            Err(Error::ResourceExhausted(message)) => Ok(refused(
                decision_id,
                Refused {
                    refusal: RequestRefusal::ResourceExhausted,
                    message,
                    id: call.id,
                    fingerprint: Some(call.proposal.fingerprint),
                },
            )),
            Err(other) => Err(other),
        }
    }
}

/// A refusal before any decision, audited as `request_rejected` (field: the
/// reason, rule: what is wrong).
fn refused(decision_id: Uuid, refused: Refused) -> Answer {
    audit_rejected(refused.refusal.as_str(), &refused.message);
    Answer::Refused {
        decision_id,
        refused,
    }
}

/// What a Check is answered with.
enum Answer {
    /// A tool call the engine decided.
    Decided {
        decision_id: Uuid,
        decision: Decision,
        id: Value,
    },
    /// Another MCP request, let through by `other_methods = "allow"`.
    OtherAllowed { decision_id: Uuid },
    /// Refused before any decision.
    Refused { decision_id: Uuid, refused: Refused },
}

#[tonic::async_trait]
impl Authorization for ExtAuthzService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn check(
        &self,
        request: Request<CheckRequest>,
    ) -> std::result::Result<Response<CheckResponse>, Status> {
        unary(request, Reach::Host, |caller, message| async move {
            let answer = self.answer(&caller, &message).await?;
            Ok(check_response(answer))
        })
        .await
    }
}

/// The Check's HTTP request as `domain::mcp` reads it.
struct CheckView<'a> {
    http: Option<&'a attribute_context::HttpRequest>,
    source: Option<&'a attribute_context::Peer>,
    metadata: Option<&'a HashMap<String, Struct>>,
}

impl<'a> CheckView<'a> {
    fn of(check: &'a CheckRequest) -> Self {
        let attributes = check.attributes.as_ref();
        CheckView {
            http: attributes
                .and_then(|attributes| attributes.request.as_ref())
                .and_then(|request| request.http.as_ref()),
            source: attributes.and_then(|attributes| attributes.source.as_ref()),
            metadata: attributes
                .and_then(|attributes| attributes.metadata_context.as_ref())
                .map(|metadata| &metadata.filter_metadata),
        }
    }
}

impl mcp::HttpRequest for CheckView<'_> {
    fn method(&self) -> &str {
        self.http.map_or("", |http| http.method.as_str())
    }

    /// From `headers`, or from `header_map` (Envoy's `encode_raw_headers`),
    /// read the way Envoy fills `headers`: every copy, joined with `,`.
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        let http = self.http?;
        if let Some(value) = http.headers.get(name) {
            return Some(Cow::Borrowed(value));
        }
        let mut copies: Vec<Cow<'_, str>> = http
            .header_map
            .as_ref()?
            .headers
            .iter()
            .filter(|header| header.key.eq_ignore_ascii_case(name))
            .map(|header| match header.value.as_str() {
                "" => String::from_utf8_lossy(&header.raw_value),
                value => Cow::Borrowed(value),
            })
            .collect();
        // Joined once: a fold of `format!`s copied every copy again for
        // each one after it (quadratic in a Check of many copies).
        match copies.len() {
            0 => None,
            1 => copies.pop(),
            _ => Some(Cow::Owned(copies.join(","))),
        }
    }

    /// `raw_body` (Envoy's `pack_as_bytes`) or `body`.
    fn body(&self) -> Option<&[u8]> {
        let http = self.http?;
        match (http.raw_body.as_slice(), http.body.as_bytes()) {
            ([], []) => None,
            ([], body) => Some(body),
            (raw, _) => Some(raw),
        }
    }

    fn principal(&self) -> Option<&str> {
        self.source.map(|source| source.principal.as_str())
    }

    fn jwt_claim(&self, payload: &str, claim: &str) -> std::result::Result<String, String> {
        let claims = self
            .metadata
            .and_then(|metadata| metadata.get(JWT_AUTHN))
            .and_then(|jwt| jwt.fields.get(payload))
            .and_then(|payload| match &payload.kind {
                Some(Kind::StructValue(claims)) => Some(claims),
                _ => None,
            })
            .ok_or_else(|| {
                format!(
                    "no verified JWT payload {payload:?} in metadata_context {JWT_AUTHN:?} \
                     (jwt_authn payload_in_metadata, ext_authz metadata_context_namespaces)"
                )
            })?;
        match claims
            .fields
            .get(claim)
            .and_then(|value| value.kind.as_ref())
        {
            Some(Kind::StringValue(value)) => Ok(value.clone()),
            Some(_) => Err(format!("JWT claim {claim:?} is not a string")),
            None => Err(format!("the JWT has no claim {claim:?}")),
        }
    }
}

/// The Check's answer for Envoy.
fn check_response(answer: Answer) -> CheckResponse {
    match answer {
        Answer::Decided {
            decision_id,
            decision,
            id,
        } => {
            let approval_id = decision.approval.map(|(approval, _)| approval.to_string());
            let fingerprint = decision.fingerprint.to_hex();
            let metadata = dynamic_metadata(
                decision_id,
                decision.outcome.as_str(),
                decision.reason.as_str(),
                approval_id.as_deref(),
                Some(&fingerprint),
            );
            if decision.outcome == Outcome::Allow {
                return allowed(decision_id, Some(&fingerprint), metadata);
            }
            let code = match decision.outcome {
                Outcome::RequireApproval => mcp::APPROVAL_REQUIRED,
                _ => mcp::DENIED,
            };
            let message = match &approval_id {
                Some(approval) if decision.outcome == Outcome::RequireApproval => {
                    format!("{}: waiting for approval {approval}", decision.message)
                }
                _ => decision.message.clone(),
            };
            let mut data = Object::new();
            data.insert("decision_id", Value::from(decision_id.to_string()));
            data.insert("outcome", Value::from(decision.outcome.as_str()));
            data.insert("reason", Value::from(decision.reason.as_str()));
            data.insert("fingerprint", Value::from(fingerprint));
            if let Some(approval) = approval_id {
                data.insert("approval_id", Value::from(approval));
            }
            denied(decision_id, &id, code, &message, data, metadata, 403)
        }
        Answer::OtherAllowed { decision_id } => {
            let metadata = dynamic_metadata(
                decision_id,
                Outcome::Allow.as_str(),
                "method-allowed",
                None,
                None,
            );
            allowed(decision_id, None, metadata)
        }
        Answer::Refused {
            decision_id,
            refused,
        } => {
            let reason = refused.refusal.as_str();
            let fingerprint = refused.fingerprint.map(|fingerprint| fingerprint.to_hex());
            let metadata = dynamic_metadata(
                decision_id,
                Outcome::Deny.as_str(),
                reason,
                None,
                fingerprint.as_deref(),
            );
            let mut data = Object::new();
            data.insert("decision_id", Value::from(decision_id.to_string()));
            data.insert("outcome", Value::from(Outcome::Deny.as_str()));
            data.insert("reason", Value::from(reason));
            if let Some(fingerprint) = fingerprint {
                data.insert("fingerprint", Value::from(fingerprint));
            }
            denied(
                decision_id,
                &refused.id,
                refused.refusal.json_rpc_code(),
                &refused.message,
                data,
                metadata,
                refused.refusal.http_status(),
            )
        }
    }
}

/// OK: the request goes upstream with the decision id (and the proposal's
/// fingerprint), overwriting whatever a client sent under those names; a
/// request without a proposal loses any fingerprint a client sent.
fn allowed(decision_id: Uuid, fingerprint: Option<&str>, metadata: Struct) -> CheckResponse {
    let mut headers = vec![header(DECISION_ID_HEADER, &decision_id.to_string())];
    let mut headers_to_remove = Vec::new();
    match fingerprint {
        Some(fingerprint) => headers.push(header(FINGERPRINT_HEADER, fingerprint)),
        None => headers_to_remove.push(FINGERPRINT_HEADER.to_string()),
    }
    CheckResponse {
        status: Some(rpc::Status {
            code: tonic::Code::Ok as i32,
            ..Default::default()
        }),
        dynamic_metadata: Some(metadata),
        http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
            headers,
            headers_to_remove,
            ..Default::default()
        })),
    }
}

/// Denied: HTTP `http_status` (403, or 429 for a limit) with the JSON-RPC
/// error body.
fn denied(
    decision_id: Uuid,
    id: &Value,
    code: i64,
    message: &str,
    data: Object,
    metadata: Struct,
    http_status: u16,
) -> CheckResponse {
    CheckResponse {
        status: Some(rpc::Status {
            code: tonic::Code::PermissionDenied as i32,
            message: message.to_string(),
            ..Default::default()
        }),
        dynamic_metadata: Some(metadata),
        http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
            // Envoy's StatusCode values are the HTTP codes themselves.
            status: Some(HttpStatus {
                code: i32::from(http_status),
            }),
            headers: vec![
                header("content-type", "application/json"),
                header(DECISION_ID_HEADER, &decision_id.to_string()),
            ],
            body: mcp::error_body(id, code, message, data),
        })),
    }
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: value.to_string(),
            ..Default::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// Dynamic metadata of every answer (Envoy stores it under the ext_authz
/// filter's namespace, for access logs to join on).
fn dynamic_metadata(
    decision_id: Uuid,
    outcome: &str,
    reason: &str,
    approval_id: Option<&str>,
    fingerprint: Option<&str>,
) -> Struct {
    let text = |text: &str| ProtoValue {
        kind: Some(Kind::StringValue(text.to_string())),
    };
    let mut fields = HashMap::from([
        ("decision_id".to_string(), text(&decision_id.to_string())),
        ("outcome".to_string(), text(outcome)),
        ("reason".to_string(), text(reason)),
        ("approval_id".to_string(), text(approval_id.unwrap_or(""))),
    ]);
    if let Some(fingerprint) = fingerprint {
        fields.insert("fingerprint".to_string(), text(fingerprint));
    }
    Struct { fields }
}
