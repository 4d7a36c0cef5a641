//! The no-op baseline: a tonic server implementing the same
//! `PolicyDecisionPoint` service (and Envoy's `Authorization`, for the
//! ext-authz scenario) whose handlers return a fixed answer.
//! Same transport settings as `toolgate serve` (HTTP/2 keepalive, streams
//! per connection, TCP_NODELAY) and the same runtime (tokio's default multi-thread
//! runtime, whose worker count `TOKIO_WORKER_THREADS` sets; transparent
//! huge pages off). It decodes each
//! request and encodes a response of about the size toolgate sends, and
//! does nothing else: it is the ceiling for any gRPC PDP on the machine.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use envoy_types::pb::envoy::service::auth::v3::{CheckRequest, CheckResponse};
use toolgate::pb;
use toolgate::pb::envoy_auth::authorization_server::{Authorization, AuthorizationServer};
use toolgate::pb::policy_decision_point_server::{PolicyDecisionPoint, PolicyDecisionPointServer};

use crate::BoxResult;

#[derive(Debug, Clone)]
struct NoopPdp {
    decide: pb::DecideResponse,
    dispatch: pb::DispatchResponse,
    assess: pb::AssessManifestResponse,
    session: pb::SessionInfo,
}

impl NoopPdp {
    fn new() -> Self {
        let fingerprint = "0".repeat(64);
        let policy_revision = "000000000000".to_string();
        NoopPdp {
            decide: pb::DecideResponse {
                outcome: pb::Outcome::Allow.into(),
                reason: "allowed".into(),
                message: "\"search_docs\" may run".into(),
                fingerprint: fingerprint.clone(),
                policy_revision: policy_revision.clone(),
                approval_id: String::new(),
                approval_expires_at: None,
            },
            dispatch: pb::DispatchResponse {
                status: pb::DispatchStatus::Ok.into(),
                reason: "committed".into(),
                message: "\"set_ticket\" committed".into(),
                fingerprint: fingerprint.clone(),
                version: 1,
                resource: "t-000000".into(),
                value_json: "\"done\"".into(),
                receipt_id: "00000000-0000-4000-8000-000000000000".into(),
                replayed: false,
                approval_id: String::new(),
                policy_revision,
                appended_index: None,
            },
            assess: pb::AssessManifestResponse {
                accepted: true,
                reason: pb::AssessReason::Matched.into(),
                fingerprint: fingerprint.clone(),
                pinned_fingerprint: fingerprint,
                diffs: Vec::new(),
                diff_available: true,
                pinned_revision: "2026-11-01".into(),
            },
            session: pb::SessionInfo {
                session_id: "s".into(),
                actor: "a".into(),
                workspace: "w".into(),
                ..pb::SessionInfo::default()
            },
        }
    }
}

#[tonic::async_trait]
impl PolicyDecisionPoint for NoopPdp {
    async fn decide(
        &self,
        _request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        Ok(Response::new(self.decide.clone()))
    }

    async fn dispatch(
        &self,
        _request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::DispatchResponse>, Status> {
        Ok(Response::new(self.dispatch.clone()))
    }

    async fn assess_manifest(
        &self,
        _request: Request<pb::AssessManifestRequest>,
    ) -> Result<Response<pb::AssessManifestResponse>, Status> {
        Ok(Response::new(self.assess.clone()))
    }

    async fn get_session(
        &self,
        _request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        Ok(Response::new(self.session.clone()))
    }
}

/// Envoy's Authorization, answering every Check with a fixed OK of the
/// shape toolgate sends (two headers upstream, four metadata fields).
#[derive(Debug, Clone)]
struct NoopAuthorization {
    allowed: CheckResponse,
}

impl NoopAuthorization {
    fn new() -> Self {
        use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
        use envoy_types::pb::envoy::service::auth::v3::OkHttpResponse;
        use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

        let header = |key: &str, value: &str| HeaderValueOption {
            header: Some(HeaderValue {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            }),
            append_action: 2,
            ..Default::default()
        };
        let text = |text: &str| Value {
            kind: Some(Kind::StringValue(text.into())),
        };
        let decision_id = "00000000-0000-4000-8000-000000000000";
        let fingerprint = "0".repeat(64);
        NoopAuthorization {
            allowed: CheckResponse {
                status: Some(envoy_types::pb::google::rpc::Status::default()),
                dynamic_metadata: Some(Struct {
                    fields: [
                        ("decision_id", text(decision_id)),
                        ("outcome", text("allow")),
                        ("reason", text("allowed")),
                        ("approval_id", text("")),
                        ("fingerprint", text(&fingerprint)),
                    ]
                    .into_iter()
                    .map(|(key, value)| (key.to_string(), value))
                    .collect(),
                }),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    headers: vec![
                        header("x-toolgate-decision-id", decision_id),
                        header("x-toolgate-fingerprint", &fingerprint),
                    ],
                    ..Default::default()
                })),
            },
        }
    }
}

#[tonic::async_trait]
impl Authorization for NoopAuthorization {
    async fn check(
        &self,
        _request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        Ok(Response::new(self.allowed.clone()))
    }
}

/// Runs the baseline on `listen` until killed; prints
/// `toolgate listening on ADDR` like `toolgate serve`.
pub fn run(listen: SocketAddr, workers: Option<usize>) -> BoxResult<()> {
    // As `toolgate serve` does, and like it serving anyway when refused.
    if let Err(error) = toolgate::ops::process::disable_transparent_huge_pages() {
        eprintln!("toolgate-load: cannot turn transparent huge pages off: {error}");
    }
    // Without `--workers`: tokio's default multi-thread runtime, exactly as
    // `toolgate serve` builds it (so `TOKIO_WORKER_THREADS` applies to both).
    let runtime = match workers {
        None => tokio::runtime::Runtime::new()?,
        Some(workers) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .enable_all()
            .build()?,
    };
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        println!("toolgate listening on {}", listener.local_addr()?);
        // The defaults of toolgate's `[server]` section.
        Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .max_concurrent_streams(Some(1024))
            .add_service(
                PolicyDecisionPointServer::new(NoopPdp::new())
                    .max_decoding_message_size(1024 * 1024),
            )
            .add_service(
                AuthorizationServer::new(NoopAuthorization::new())
                    .max_decoding_message_size(1024 * 1024),
            )
            // TCP_NODELAY on accepted connections, as `toolgate serve`.
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
            .await?;
        Ok(())
    })
}
