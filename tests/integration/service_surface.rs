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

/// toolgate routes its per-call services itself and the others through
/// tonic's router (`edge::router`); both answer a method or a service the
/// server does not have with UNIMPLEMENTED, and still route what it has.
#[tokio::test]
async fn an_unknown_method_or_service_is_unimplemented_on_every_route() {
    use crate::support::authed;
    use crate::support::policies::decide_text;
    use crate::support::tokens::{ALICE, HOST};

    let server = TestServer::start(&decide_text("")).await;
    let call = |token: &'static str, path: &'static str| {
        let channel = server.channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("channel ready");
            grpc.unary(
                authed((), token),
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<(), ()>::default(),
            )
            .await
            .map(tonic::Response::into_inner)
        }
    };
    for (token, path) in [
        (HOST, "/toolgate.v1.PolicyDecisionPoint/Nope"),
        (HOST, "/envoy.service.auth.v3.Authorization/Nope"),
        (ALICE, "/toolgate.v1.Approvals/Nope"),
        (HOST, "/toolgate.v1.Nope/Decide"),
        (HOST, "/toolgate.v1.PolicyDecisionPoint/Decide/"),
    ] {
        let refused = call(token, path).await.expect_err(path);
        assert_eq!(refused.code(), Code::Unimplemented, "{path}: {refused:?}");
    }
    // The same routes reach their services: an empty Decide is the PDP's
    // refusal, an empty ListApprovals the approvals' answer.
    let empty = call(HOST, "/toolgate.v1.PolicyDecisionPoint/Decide")
        .await
        .expect_err("an empty Decide");
    assert_eq!(empty.code(), Code::InvalidArgument, "{empty:?}");
    call(ALICE, "/toolgate.v1.Approvals/ListApprovals")
        .await
        .expect("an empty ListApprovals lists");
    server.stop().await;
}
