//! Assembles the gRPC server: toolgate's services, health and reflection.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::auth::AuthLayer;
use crate::engine::Engine;
use crate::grpc::approvals::ApprovalsService;
use crate::grpc::pdp::PdpService;
use crate::grpc::pins::PinsService;
use crate::grpc::resources::ResourcesService;
use crate::pb;
use crate::pb::approvals_server::ApprovalsServer;
use crate::pb::manifest_pins_server::ManifestPinsServer;
use crate::pb::policy_decision_point_server::PolicyDecisionPointServer;
use crate::pb::resources_server::ResourcesServer;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection descriptors: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves toolgate on an already-bound listener until `shutdown` resolves.
/// Tests bind `127.0.0.1:0` and hand the listener in, so there is no race
/// between choosing a port and using it.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<PolicyDecisionPointServer<PdpService>>()
        .await;
    health_reporter
        .set_serving::<ApprovalsServer<ApprovalsService>>()
        .await;
    health_reporter
        .set_serving::<ManifestPinsServer<PinsService>>()
        .await;
    health_reporter
        .set_serving::<ResourcesServer<ResourcesService>>()
        .await;

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let sweeper = tokio::spawn(sweep_periodically(engine.clone()));
    let closing_engine = engine.clone();
    let shutdown = async move {
        shutdown.await;
        // Health turns NOT_SERVING first, then long-lived streams end so
        // that in-flight calls can drain.
        health_reporter
            .set_not_serving::<PolicyDecisionPointServer<PdpService>>()
            .await;
        health_reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        closing_engine.begin_shutdown();
    };
    let served = Server::builder()
        .layer(AuthLayer::new(engine.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(PolicyDecisionPointServer::new(PdpService::new(
            engine.clone(),
        )))
        .add_service(ManifestPinsServer::new(PinsService::new(engine.clone())))
        .add_service(ApprovalsServer::new(ApprovalsService::new(engine.clone())))
        .add_service(ResourcesServer::new(ResourcesService::new(engine)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    sweeper.abort();
    served?;
    Ok(())
}

/// How often expired approvals are swept when nothing else touches them.
pub const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

async fn sweep_periodically(engine: Engine) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = engine.sweep() {
            tracing::error!(%error, "approval sweep failed");
        }
    }
}
