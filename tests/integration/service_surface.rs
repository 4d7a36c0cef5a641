//! Health, reflection and the RPCs that later issues implement.

use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

use crate::support::TestServer;
use crate::support::policies::policy_text;

#[tokio::test]
async fn health_answers_serving_for_the_server_and_each_service() {
    let server = TestServer::start(&policy_text("open")).await;
    let mut health = HealthClient::new(server.channel.clone());
    for service in [
        "",
        "toolgate.v1.PolicyDecisionPoint",
        "toolgate.v1.Approvals",
        "toolgate.v1.ManifestPins",
    ] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .expect("health check")
            .into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope.Service".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn reflection_lists_every_service() {
    let server = TestServer::start(&policy_text("open")).await;
    let mut reflection = ServerReflectionClient::new(server.channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses.next().await.expect("one answer").expect("ok");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let mut names: Vec<String> = list
        .service
        .into_iter()
        .map(|service| service.name)
        .collect();
    names.sort();
    for expected in [
        "grpc.health.v1.Health",
        "toolgate.v1.Approvals",
        "toolgate.v1.ManifestPins",
        "toolgate.v1.PolicyDecisionPoint",
        "toolgate.v1.Resources",
        "envoy.service.auth.v3.Authorization",
    ] {
        assert!(
            names.iter().any(|name| name == expected),
            "{expected} missing from {names:?}"
        );
    }
    server.stop().await;
}
