//! Routes each call to its service. The per-call services (the decision
//! point and Envoy's `Authorization`: every tool call passes one of them)
//! are reached by one comparison of the path's service name; the others
//! (approvals, pins, resources, health, reflection) through tonic's
//! router, whose axum route lookup and boxed service cost about half a
//! microsecond of server CPU per call (BENCHMARKS.md, "tonic's router off
//! the per-call path").
//!
//! A path reaches a service here exactly when tonic's router would send it
//! there (`/{service}/{method}`, the method not empty); the service itself
//! answers an unknown method, and tonic's router an unknown service.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::Either;
use http::{Request, Response};
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;
use tonic::service::Routes;
use tower::Service;

use crate::edge::ext_authz::ExtAuthzService;
use crate::edge::pdp::PdpService;
use crate::engine::Engine;
use crate::pb::envoy_auth::authorization_server::AuthorizationServer;
use crate::pb::policy_decision_point_server::PolicyDecisionPointServer;

type Pdp = PolicyDecisionPointServer<PdpService>;
type Authorization = AuthorizationServer<ExtAuthzService>;

/// The services of one listener (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Router {
    /// `None` on `--ext-authz-listen`, which serves `Authorization` alone.
    pdp: Option<Pdp>,
    authorization: Authorization,
    others: Routes,
}

impl Router {
    /// The decision point and `Authorization` on `engine`, decoding messages
    /// of up to `limit` bytes, and `others`: every other service.
    pub(crate) fn new(engine: &Engine, limit: usize, others: Routes) -> Self {
        Router {
            pdp: Some(Pdp::new(PdpService::new(engine.clone())).max_decoding_message_size(limit)),
            others: others.prepare(),
            ..Router::ext_authz(engine, limit)
        }
    }

    /// `Authorization` alone, for `--ext-authz-listen`.
    pub(crate) fn ext_authz(engine: &Engine, limit: usize) -> Self {
        Router {
            pdp: None,
            authorization: Authorization::new(ExtAuthzService::new(engine.clone()))
                .max_decoding_message_size(limit),
            others: Routes::default().prepare(),
        }
    }
}

impl Service<Request<Body>> for Router {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future =
        Either<BoxFuture<Response<Body>, Infallible>, <Routes as Service<Request<Body>>>::Future>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated servers and its router are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        match (service_of(request.uri().path()), &mut self.pdp) {
            (Some(Pdp::NAME), Some(pdp)) => Either::Left(pdp.call(request)),
            (Some(Authorization::NAME), _) => Either::Left(self.authorization.call(request)),
            _ => Either::Right(self.others.call(request)),
        }
    }
}

/// The service of `/{service}/{method}`, when the method is not empty.
fn service_of(path: &str) -> Option<&str> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!method.is_empty()).then_some(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_service_and_a_method_name_a_service() {
        let pdp = "/toolgate.v1.PolicyDecisionPoint/Decide";
        assert_eq!(service_of(pdp), Some("toolgate.v1.PolicyDecisionPoint"));
        assert_eq!(service_of("/a/b/c"), Some("a"));
        for path in [
            "",
            "/",
            "//Decide",
            "toolgate.v1.PolicyDecisionPoint/Decide",
            "/toolgate.v1.PolicyDecisionPoint",
            "/toolgate.v1.PolicyDecisionPoint/",
        ] {
            assert!(
                matches!(service_of(path), None | Some("")),
                "{path:?} names no service"
            );
        }
    }
}
