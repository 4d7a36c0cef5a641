//! Assembles the gRPC server: toolgate's services behind the metrics,
//! overload and authentication layers, plus health and reflection; and the
//! optional metrics listener.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;
use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};

use crate::domain::policy::ServerSettings;
use crate::edge::approvals::ApprovalsService;
use crate::edge::auth::AuthLayer;
use crate::edge::connections::{ConnectionSettings, Connections};
use crate::edge::metrics_layer::{MetricsLayer, serve_metrics};
use crate::edge::overload::{OverloadLayer, OverloadSettings, PROBE_MESSAGE_BYTES};
use crate::edge::pins::PinsService;
use crate::edge::resources::ResourcesService;
use crate::edge::router::Router;
use crate::engine::Engine;
use crate::ops::logwriter::SinkStatus;
use crate::ops::methods;
use crate::ops::metrics::Metrics;
use crate::ops::tls::ServerTls;
use crate::pb;
use crate::pb::approvals_server::ApprovalsServer;
use crate::pb::manifest_pins_server::ManifestPinsServer;
use crate::pb::resources_server::ResourcesServer;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection descriptors: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("error-detail descriptors: {0}")]
    ErrorDetailDescriptors(#[from] prost::DecodeError),
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("metrics listener: {0}")]
    Metrics(#[from] std::io::Error),
    #[error(transparent)]
    Tls(#[from] crate::ops::tls::TlsError),
}

/// The gRPC listener and, optionally, the Prometheus one.
#[derive(Debug)]
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: Option<TcpListener>,
    /// `--ext-authz-listen`: Envoy's `Authorization` alone, without a
    /// token, acting as `[ext_authz] host_credential`.
    pub ext_authz: Option<TcpListener>,
}

/// How often expired approvals are swept when nothing else touches them
/// (and the log sink is looked at).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How long the stop waits for scrapes still being answered once the calls'
/// grace is over.
const METRICS_DRAIN: Duration = Duration::from_secs(1);

/// What the binary adds to a server beyond its listeners and engine.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// The log sink audit lines go to: while it is stalled, health is
    /// NOT_SERVING and calls fail fast with UNAVAILABLE.
    pub log_sink: Option<SinkStatus>,
    /// The TLS the gRPC listener serves (the binary loads it first, to
    /// refuse bad files before anything is announced, and reloads it on
    /// SIGHUP). Without it, the policy's `[server.tls]` is loaded here, if
    /// there is one; else the listener is plaintext.
    pub tls: Option<ServerTls>,
}

/// Serves toolgate on an already-bound listener until `shutdown` resolves.
/// Tests bind `127.0.0.1:0` and hand the listener in, so there is no race
/// between choosing a port and using it.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with(
        Listeners {
            grpc: listener,
            metrics: None,
            ext_authz: None,
        },
        engine,
        shutdown,
    )
    .await
}

/// Serves until `shutdown` resolves, then shuts down gracefully: health turns
/// NOT_SERVING first, watch streams end with a final status, no new calls are
/// accepted, and in-flight calls get the policy's grace period to finish.
pub async fn serve_with(
    listeners: Listeners,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_with_options(listeners, engine, ServeOptions::default(), shutdown).await
}

/// [`serve_with`], with the binary's options.
pub async fn serve_with_options(
    listeners: Listeners,
    engine: Engine,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let settings = engine.policy().server.clone();
    let tls = match (options.tls, &settings.tls) {
        (Some(tls), _) => Some(tls),
        (None, Some(files)) => Some(ServerTls::load(files.clone())?),
        (None, None) => None,
    };
    let metrics = attach_metrics(&engine, options.log_sink.as_ref());
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&health_reporter, ServingStatus::Serving).await;

    // One signal, watched by the gRPC server, the metrics listener, the
    // sink's health and the grace timer.
    let (stopping, stop_signal) = watch::channel(false);
    // Built (and refused, on bad descriptors) before any task is spawned;
    // nothing is accepted until it is polled.
    // The external authorizer's listener speaks TLS when the gRPC one does
    // (the same material, reloaded together).
    let ext_authz = listeners.ext_authz.map(|listener| {
        let grpc = Grpc {
            settings: &settings,
            engine: engine.clone(),
            metrics: Arc::clone(&metrics),
            log_sink: options.log_sink.clone(),
            tls: tls.clone(),
        };
        grpc.serve_ext_authz(listener, stopped(&stop_signal))
    });
    let grpc = Grpc {
        settings: &settings,
        engine: engine.clone(),
        metrics: Arc::clone(&metrics),
        log_sink: options.log_sink.clone(),
        tls,
    };
    let served = grpc.serve(listeners.grpc, health_service, stopped(&stop_signal))?;
    let served = async move {
        match ext_authz {
            None => served.await,
            Some(ext_authz) => {
                let (served, ext_authz) = tokio::join!(served, ext_authz);
                served.and(ext_authz)
            }
        }
    };
    let health = HealthFollower {
        sink: options.log_sink,
        reporter: health_reporter.clone(),
        stopping: stop_signal.clone(),
        stalled: false,
        store_failed: false,
        store_out: false,
    };
    tokio::spawn(stop_on(shutdown, health_reporter, engine.clone(), stopping));
    let metrics_server = listeners.metrics.map(|listener| {
        let stopped = stopped(&stop_signal);
        tokio::spawn(serve_metrics(
            listener,
            engine.clone(),
            Arc::clone(&metrics),
            stopped,
        ))
    });
    let sweeper = tokio::spawn(housekeeping(engine, metrics, health));
    let result = within_grace(served, stopped(&stop_signal), settings.shutdown_grace).await;
    sweeper.abort();
    // A scrape still being answered gets a second more, no longer: the
    // stop is bounded (the listener stopped taking connections at the
    // signal).
    if let Some(mut metrics_server) = metrics_server {
        match tokio::time::timeout(METRICS_DRAIN, &mut metrics_server).await {
            Ok(Ok(Err(error))) => tracing::warn!(%error, "metrics listener failed"),
            Ok(_) => {}
            Err(_) => {
                tracing::debug!("a scrape still being answered was cut at the stop");
                metrics_server.abort();
            }
        }
    }
    result
}

/// The server's own metrics, counting the engine's decisions and watching
/// the log sink.
fn attach_metrics(engine: &Engine, log_sink: Option<&SinkStatus>) -> Arc<Metrics> {
    let metrics = Metrics::new();
    if let Some(sink) = log_sink {
        metrics.attach_log_sink(sink.clone());
    }
    engine.attach_metrics(Arc::clone(&metrics));
    metrics
}

/// Resolves once the stop signal is given.
fn stopped(signal: &watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut signal = signal.clone();
    async move {
        let _ = signal.wait_for(|stopping| *stopping).await;
    }
}

/// Health of the whole server ("") and of each of toolgate's services.
async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    for service in std::iter::once("").chain(methods::SERVICES) {
        reporter.set_service_status(service, status).await;
    }
}

/// Once `shutdown` resolves: health NOT_SERVING, watch streams closing,
/// then the stop signal.
async fn stop_on(
    shutdown: impl Future<Output = ()>,
    health_reporter: HealthReporter,
    engine: Engine,
    stopping: watch::Sender<bool>,
) {
    shutdown.await;
    tracing::info!("shutting down: health NOT_SERVING, watch streams closing");
    set_health(&health_reporter, ServingStatus::NotServing).await;
    engine.begin_shutdown();
    let _ = stopping.send(true);
}

/// Runs `served` until it ends, or until the grace period after the stop
/// signal is over (the calls still open are then dropped).
async fn within_grace(
    served: impl Future<Output = Result<(), tonic::transport::Error>>,
    stopped: impl Future<Output = ()>,
    grace: Duration,
) -> Result<(), ServeError> {
    let grace_over = async move {
        stopped.await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = served => result.map_err(ServeError::from),
        () = grace_over => {
            tracing::warn!(grace_seconds = grace.as_secs(), "grace period over; closing the calls still open");
            Ok(())
        }
    }
}

/// What the gRPC server is made of.
struct Grpc<'a> {
    settings: &'a ServerSettings,
    engine: Engine,
    metrics: Arc<Metrics>,
    log_sink: Option<SinkStatus>,
    tls: Option<ServerTls>,
}

/// The layers every listener's calls go through (tower's `Stack` names
/// the innermost first): metrics, authentication, then the overload bounds.
type Layers = ServiceBuilder<Stack<OverloadLayer, Stack<AuthLayer, Stack<MetricsLayer, Identity>>>>;

impl Grpc<'_> {
    /// The server's transport settings behind the metrics, authentication
    /// (`auth`) and overload layers, and its connections under the
    /// policy's caps.
    fn transport(
        self,
        auth: impl FnOnce(Engine) -> AuthLayer,
    ) -> (Server<Stack<Layers, Identity>>, Connections) {
        let Grpc {
            settings,
            engine,
            metrics,
            log_sink,
            tls,
        } = self;
        let connections = Connections::new(
            ConnectionSettings::from(settings),
            tls,
            Arc::clone(&metrics),
        );
        // Authentication reads only the headers, so it runs before the
        // overload layer reads the message: a call without a credential is
        // refused at once, and never holds request-buffer bytes, a permit
        // or its connection's in-flight count.
        let layers = ServiceBuilder::new()
            .layer(MetricsLayer::new(Arc::clone(&metrics)))
            .layer(auth(engine))
            .layer(OverloadLayer::new(
                OverloadSettings::from(settings),
                metrics,
                log_sink,
            ));
        let server = Server::builder()
            .http2_keepalive_interval(Some(settings.http2_keepalive_interval))
            .http2_keepalive_timeout(Some(settings.http2_keepalive_timeout))
            .max_concurrent_streams(Some(settings.max_concurrent_streams))
            .layer(layers);
        (server, connections)
    }

    /// toolgate's services behind the metrics, authentication and overload
    /// layers, plus health and reflection, on `listener` until `stopped`.
    fn serve(
        self,
        listener: TcpListener,
        health: HealthServer<impl Health>,
        stopped: impl Future<Output = ()> + Send + 'static,
    ) -> Result<impl Future<Output = Result<(), tonic::transport::Error>>, ServeError> {
        let (engine, limit) = (self.engine.clone(), self.settings.max_message_bytes);
        let (server, connections) = self.transport(AuthLayer::new);
        let others = Routes::new(health.max_decoding_message_size(PROBE_MESSAGE_BYTES))
            .add_service(
                reflection()?
                    .build_v1()?
                    .max_decoding_message_size(PROBE_MESSAGE_BYTES),
            )
            .add_service(
                reflection()?
                    .build_v1alpha()?
                    .max_decoding_message_size(PROBE_MESSAGE_BYTES),
            )
            .add_service(
                ManifestPinsServer::new(PinsService::new(engine.clone()))
                    .max_decoding_message_size(limit),
            )
            .add_service(
                ApprovalsServer::new(ApprovalsService::new(engine.clone()))
                    .max_decoding_message_size(limit),
            )
            .add_service(
                ResourcesServer::new(ResourcesService::new(engine.clone()))
                    .max_decoding_message_size(limit),
            );
        let router = Router::new(&engine, limit, others);
        Ok(server.serve_with_incoming_shutdown(router, connections.incoming(listener), stopped))
    }

    /// `--ext-authz-listen`: Envoy's `Authorization` alone, behind the
    /// same layers, its callers acting as `[ext_authz] host_credential`.
    fn serve_ext_authz(
        self,
        listener: TcpListener,
        stopped: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = Result<(), tonic::transport::Error>> {
        let (engine, limit) = (self.engine.clone(), self.settings.max_message_bytes);
        let (server, connections) = self.transport(AuthLayer::ext_authz_listener);
        let router = Router::ext_authz(&engine, limit);
        server.serve_with_incoming_shutdown(router, connections.incoming(listener), stopped)
    }
}

/// Reflection over toolgate's, health's, the error details' and Envoy's
/// external authorization descriptors.
fn reflection() -> Result<tonic_reflection::server::Builder<'static>, ServeError> {
    let error_details = error_detail_descriptors()?;
    let envoy = envoy_auth_descriptors(&error_details)?;
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_file_descriptor_set(error_details)
        .register_file_descriptor_set(envoy))
}

/// `envoy.service.auth.v3` and its imports, less the files another set
/// already serves (`google/rpc/status.proto`): one file per name.
fn envoy_auth_descriptors(
    served: &prost_types::FileDescriptorSet,
) -> Result<prost_types::FileDescriptorSet, prost::DecodeError> {
    use prost::Message;

    let mut set = prost_types::FileDescriptorSet::decode(pb::ENVOY_AUTH_DESCRIPTOR_SET)?;
    let toolgate = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET)?;
    let health = prost_types::FileDescriptorSet::decode(tonic_health::pb::FILE_DESCRIPTOR_SET)?;
    let taken: std::collections::HashSet<String> = [served, &toolgate, &health]
        .into_iter()
        .flat_map(|set| set.file.iter().filter_map(|file| file.name.clone()))
        .collect();
    set.file
        .retain(|file| file.name.as_ref().is_none_or(|name| !taken.contains(name)));
    Ok(set)
}

/// The `google.rpc` error-detail types (`Status`, `BadRequest`, `ErrorInfo`,
/// …) for reflection, so that grpcurl and other reflection clients can decode
/// the details of an error (the field and rule of every `INVALID_ARGUMENT`).
///
/// tonic-types compiles them as `status.proto` and `error_details.proto`;
/// they are served under their canonical googleapis names
/// (`google/rpc/status.proto`, `google/rpc/error_details.proto`) so that a
/// client which also carries the googleapis files sees one file per name.
fn error_detail_descriptors() -> Result<prost_types::FileDescriptorSet, prost::DecodeError> {
    use prost::Message;

    fn canonical(name: &str) -> String {
        match name {
            "status.proto" | "error_details.proto" => format!("google/rpc/{name}"),
            other => other.to_owned(),
        }
    }
    let mut set = prost_types::FileDescriptorSet::decode(tonic_types::pb::FILE_DESCRIPTOR_SET)?;
    for file in &mut set.file {
        file.name = file.name.as_deref().map(canonical);
        for dependency in &mut file.dependency {
            *dependency = canonical(dependency);
        }
    }
    Ok(set)
}

/// Periodic upkeep: expires approvals, and folds the latency samples
/// recorded since the last tick into the histograms' buckets (the recorder
/// keeps every sample until then: without this, memory would grow with every
/// call when nobody scrapes `/metrics`).
async fn housekeeping(engine: Engine, metrics: Arc<Metrics>, mut health: HealthFollower) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        health.update(&engine).await;
        // While the store is out, a sweep would only be refused.
        if engine.store_outage().is_none()
            && let Err(error) = engine.sweep().await
        {
            tracing::error!(%error, "approval sweep failed");
        }
        metrics.upkeep();
    }
}

/// Health follows the log sink and the store: NOT_SERVING while the sink
/// is stalled, SERVING again once it drains (unless the server is shutting
/// down); NOT_SERVING while the store is unreachable and asked to resume,
/// SERVING again once it is back; NOT_SERVING for good once the store failed (or an operation
/// panicked under the state lock), for every call is then refused until a restart (an
/// orchestrator's cue to restart it).
struct HealthFollower {
    sink: Option<SinkStatus>,
    reporter: HealthReporter,
    stopping: watch::Receiver<bool>,
    stalled: bool,
    store_failed: bool,
    store_out: bool,
}

impl HealthFollower {
    async fn update(&mut self, engine: &Engine) {
        if *self.stopping.borrow() {
            return;
        }
        let stalled = self.sink.as_ref().is_some_and(SinkStatus::check);
        let failure = engine.failure();
        let store_failed = self.store_failed || failure.is_some();
        let store_out = engine.store_outage().is_some();
        if (stalled, store_failed, store_out) == (self.stalled, self.store_failed, self.store_out) {
            return;
        }
        if store_failed && !self.store_failed {
            let why = failure.unwrap_or_default();
            tracing::error!(%why, "every call is refused: health NOT_SERVING until a restart");
        } else if store_out != self.store_out {
            match store_out {
                true => {
                    tracing::warn!("the store is unreachable: health NOT_SERVING until it is back")
                }
                false => tracing::warn!("the store is back: serving again"),
            }
        } else if let (Some(sink), false) = (&self.sink, stalled) {
            // Said to stderr only when it drains: a stalled sink takes no lines.
            tracing::warn!(stalls = sink.stalls(), "log sink drained; serving again");
        }
        (self.stalled, self.store_failed, self.store_out) = (stalled, store_failed, store_out);
        let status = match stalled || store_failed || store_out {
            true => ServingStatus::NotServing,
            false => ServingStatus::Serving,
        };
        set_health(&self.reporter, status).await;
    }
}
