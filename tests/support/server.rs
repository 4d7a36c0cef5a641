//! A real toolgate server in the test process, on `127.0.0.1:0`, driven
//! through generated gRPC clients. The bound listener is handed to
//! `serve_with`, so the port cannot be lost to a race and no sleep is
//! needed before connecting.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use super::pb::approvals_client::ApprovalsClient;
use super::pb::manifest_pins_client::ManifestPinsClient;
use super::pb::policy_decision_point_client::PolicyDecisionPointClient;
use super::pb::resources_client::ResourcesClient;
use super::{
    Engine, Listeners, ManualClock, Policy, Timestamp, authed, decide_request, dispatch_request,
    pb, policies, serve_with, session,
};

/// 2026-11-29T00:00:00Z: tests start every clock here.
pub const EPOCH: Timestamp = Timestamp(1_795_910_400_000);

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub channel: Channel,
    pub clock: ManualClock,
    pub engine: Engine,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server on a policy given as TOML text; relative paths in it
    /// resolve against the repository root.
    pub async fn start(policy_toml: &str) -> TestServer {
        TestServer::start_with(policies::parse(policy_toml)).await
    }

    /// Starts a server on a policy file of the repository (`tests/fixtures/…`).
    pub async fn start_file(relative: &str) -> TestServer {
        let policy =
            Policy::load(&policies::repo_path(relative)).expect("test policy file is valid");
        TestServer::start_with(policy).await
    }

    pub async fn start_with(policy: Policy) -> TestServer {
        TestServer::start_with_options(policy, false).await
    }

    /// Starts a server, with a metrics listener on `127.0.0.1:0` when asked.
    pub async fn start_with_options(policy: Policy, with_metrics: bool) -> TestServer {
        let clock = ManualClock::starting_at(EPOCH);
        let engine = Engine::new(policy, Arc::new(clock.clone())).expect("engine");
        TestServer::serve(engine, clock, with_metrics).await
    }

    /// Starts a server on the state `store` holds (a restart), at the time
    /// `clock` shows.
    pub async fn start_on(
        policy: Policy,
        store: Box<dyn toolgate::store::Store>,
        clock: ManualClock,
    ) -> TestServer {
        let engine = Engine::open(policy, Arc::new(clock.clone()), store).expect("recovered");
        TestServer::serve(engine, clock, false).await
    }

    async fn serve(engine: Engine, clock: ManualClock, with_metrics: bool) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let metrics_listener = match with_metrics {
            true => Some(
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind loopback"),
            ),
            false => None,
        };
        let metrics_addr = metrics_listener
            .as_ref()
            .map(|listener| listener.local_addr().expect("local addr"));
        let (shutdown, shutdown_signal) = oneshot::channel::<()>();
        let server_engine = engine.clone();
        let listeners = Listeners {
            grpc: listener,
            metrics: metrics_listener,
            ext_authz: None,
        };
        let handle = tokio::spawn(async move {
            serve_with(listeners, server_engine, async {
                let _ = shutdown_signal.await;
            })
            .await
            .expect("server runs");
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to test server");
        TestServer {
            addr,
            metrics_addr,
            channel,
            clock,
            engine,
            shutdown: Some(shutdown),
            handle: Some(handle),
        }
    }

    pub fn pdp(&self) -> PolicyDecisionPointClient<Channel> {
        PolicyDecisionPointClient::new(self.channel.clone())
    }

    pub fn pins(&self) -> ManifestPinsClient<Channel> {
        ManifestPinsClient::new(self.channel.clone())
    }

    pub fn approvals(&self) -> ApprovalsClient<Channel> {
        ApprovalsClient::new(self.channel.clone())
    }

    pub fn resources(&self) -> ResourcesClient<Channel> {
        ResourcesClient::new(self.channel.clone())
    }

    /// Dispatch by `agent` in session `s1` of workspace `w`, with no host
    /// token (the default host).
    pub async fn dispatch_agent(
        &self,
        proposal: &pb::Proposal,
    ) -> Result<pb::DispatchResponse, tonic::Status> {
        self.dispatch("", &session("agent", "s1", "w"), proposal)
            .await
    }

    /// Decide as host `token` for a session and proposal.
    pub async fn decide(
        &self,
        token: &str,
        session: &pb::Session,
        proposal: &pb::Proposal,
    ) -> Result<pb::DecideResponse, tonic::Status> {
        let request = decide_request(session.clone(), proposal.clone());
        self.pdp()
            .decide(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Decide that must answer OK (refusals included).
    pub async fn decide_ok(
        &self,
        token: &str,
        session: &pb::Session,
        proposal: &pb::Proposal,
    ) -> pb::DecideResponse {
        self.decide(token, session, proposal)
            .await
            .expect("Decide answers")
    }

    /// `count` read_balance calls of payer (call ids `x0`, `x1`, …, session
    /// `s1` of acme) by host `token`: each is answered, and allowed.
    pub async fn reads_are_allowed(&self, token: &str, count: usize) {
        let payer = session("payer", "s1", "acme");
        for index in 0..count {
            let call_id = format!("x{index}");
            let read = super::proposal(&call_id, "payer", "read_balance", 0, "{}");
            let answer = self.decide_ok(token, &payer, &read).await;
            assert_eq!(answer.reason, "allowed", "{call_id}: {answer:?}");
        }
    }

    /// Dispatch as host `token` for a session and proposal.
    pub async fn dispatch(
        &self,
        token: &str,
        session: &pb::Session,
        proposal: &pb::Proposal,
    ) -> Result<pb::DispatchResponse, tonic::Status> {
        let request = dispatch_request(session.clone(), proposal.clone());
        self.pdp()
            .dispatch(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    /// GetSession as host `token`.
    pub async fn get_session(
        &self,
        token: &str,
        session_id: &str,
    ) -> Result<pb::SessionInfo, tonic::Status> {
        let request = pb::GetSessionRequest {
            session_id: session_id.to_string(),
        };
        self.pdp()
            .get_session(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn grant(
        &self,
        token: &str,
        approval_id: &str,
    ) -> Result<pb::Approval, tonic::Status> {
        let request = pb::GrantApprovalRequest {
            approval_id: approval_id.to_string(),
            comment: "looks right".to_string(),
        };
        self.approvals()
            .grant_approval(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn get_approval(
        &self,
        token: &str,
        approval_id: &str,
    ) -> Result<pb::Approval, tonic::Status> {
        let request = pb::GetApprovalRequest {
            approval_id: approval_id.to_string(),
        };
        self.approvals()
            .get_approval(authed(request, token))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Every approval, all pages.
    pub async fn all_approvals(&self, token: &str) -> Vec<pb::Approval> {
        let mut approvals = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = pb::ListApprovalsRequest {
                page_size: 500,
                page_token: page_token.clone(),
                ..Default::default()
            };
            let page = self
                .approvals()
                .list_approvals(authed(request, token))
                .await
                .expect("list approvals")
                .into_inner();
            approvals.extend(page.approvals);
            if page.next_page_token.is_empty() {
                return approvals;
            }
            page_token = page.next_page_token;
        }
    }

    /// A `WatchApprovals` stream that its caller means never to read, on a
    /// connection of its own with small HTTP/2 windows, so that the client
    /// cannot buffer everything the server sends it.
    pub async fn stalled_watcher(&self, token: &str) -> tonic::Streaming<pb::ApprovalEvent> {
        let small_windows = Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .initial_stream_window_size(Some(16 * 1024))
            .initial_connection_window_size(Some(16 * 1024))
            .connect()
            .await
            .expect("connect");
        ApprovalsClient::new(small_windows)
            .watch_approvals(authed(pb::WatchApprovalsRequest {}, token))
            .await
            .expect("watch")
            .into_inner()
    }

    /// The overall health status (`grpc.health.v1`, service "").
    pub async fn health(&self) -> tonic_health::pb::health_check_response::ServingStatus {
        overall_health(self.channel.clone()).await
    }

    /// A resource's value and version, read with `token`.
    pub async fn resource(&self, token: &str, name: &str) -> pb::Resource {
        self.resources()
            .get_resource(authed(
                pb::GetResourceRequest {
                    name: name.into(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .expect("get resource")
            .into_inner()
    }

    /// GET /metrics of the metrics listener: the samples by `name{labels}`.
    pub async fn metrics(&self) -> HashMap<String, f64> {
        super::metrics::samples(
            &super::metrics::scrape(self.metrics_addr.expect("metrics listener")).await,
        )
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle.await.expect("server task ends cleanly");
        }
    }
}

/// The overall health status (`grpc.health.v1`, service "") asked on `channel`.
pub async fn overall_health(
    channel: Channel,
) -> tonic_health::pb::health_check_response::ServingStatus {
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health")
        .into_inner()
        .status()
}
