//! Every RPC toolgate serves, named once: the service names are the
//! generated `SERVICE_NAME`s (toolgate's from its proto, health's and
//! reflection's from their crates), and the `service/method` labels that
//! metrics and audit lines carry are made from them at compile time.

use crate::pb;

pub const POLICY_DECISION_POINT: &str = pb::policy_decision_point_server::SERVICE_NAME;
pub const APPROVALS: &str = pb::approvals_server::SERVICE_NAME;
pub const MANIFEST_PINS: &str = pb::manifest_pins_server::SERVICE_NAME;
pub const RESOURCES: &str = pb::resources_server::SERVICE_NAME;
/// Envoy's external authorization (issue 17), from the server toolgate
/// generates for it (`pb::envoy_auth`).
pub const AUTHORIZATION: &str = pb::envoy_auth::authorization_server::SERVICE_NAME;
pub const HEALTH: &str = tonic_health::pb::health_server::SERVICE_NAME;
pub const REFLECTION_V1: &str = tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME;
pub const REFLECTION_V1ALPHA: &str =
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME;

/// toolgate's own services (each reported by health).
pub const SERVICES: [&str; 5] = [
    POLICY_DECISION_POINT,
    APPROVALS,
    MANIFEST_PINS,
    RESOURCES,
    AUTHORIZATION,
];

/// The label of every call to a method not in [`METHODS`].
pub const OTHER: &str = "other";

/// `service/method`, as a `&'static str` made at compile time.
macro_rules! method {
    ($service:expr, $method:literal) => {{
        const LEN: usize = $service.len() + 1 + $method.len();
        const BYTES: [u8; LEN] = join::<LEN>($service, $method);
        match std::str::from_utf8(&BYTES) {
            Ok(label) => label,
            Err(_) => panic!("service and method names are UTF-8"),
        }
    }};
}

const fn join<const LEN: usize>(service: &str, method: &str) -> [u8; LEN] {
    let (service, method) = (service.as_bytes(), method.as_bytes());
    let mut out = [b'/'; LEN];
    let mut at = 0;
    while at < service.len() {
        out[at] = service[at];
        at += 1;
    }
    let mut at = 0;
    while at < method.len() {
        out[service.len() + 1 + at] = method[at];
        at += 1;
    }
    out
}

/// Every RPC toolgate serves, as `service/method` labels, and [`OTHER`].
pub const METHODS: [&str; 20] = [
    method!(POLICY_DECISION_POINT, "Decide"),
    method!(POLICY_DECISION_POINT, "Dispatch"),
    method!(POLICY_DECISION_POINT, "AssessManifest"),
    method!(POLICY_DECISION_POINT, "GetSession"),
    method!(APPROVALS, "GetApproval"),
    method!(APPROVALS, "ListApprovals"),
    method!(APPROVALS, "GrantApproval"),
    method!(APPROVALS, "DenyApproval"),
    method!(APPROVALS, "RevokeApproval"),
    method!(APPROVALS, "WatchApprovals"),
    method!(MANIFEST_PINS, "PinManifest"),
    method!(MANIFEST_PINS, "ListPins"),
    method!(MANIFEST_PINS, "RemovePin"),
    method!(RESOURCES, "GetResource"),
    method!(RESOURCES, "ListResources"),
    method!(HEALTH, "Check"),
    method!(HEALTH, "Watch"),
    method!(REFLECTION_V1, "ServerReflectionInfo"),
    method!(AUTHORIZATION, "Check"),
    OTHER,
];

/// The label of a request path (`/service/method`): one of [`METHODS`].
pub fn method_label(path: &str) -> &'static str {
    METHODS[method_index(path)]
}

/// The index in [`METHODS`] of a request path (`/service/method`); the
/// index of [`OTHER`] for a method toolgate does not serve.
pub fn method_index(path: &str) -> usize {
    let trimmed = path.trim_start_matches('/');
    METHODS
        .iter()
        .position(|method| *method == trimmed)
        .unwrap_or(METHODS.len() - 1)
}

/// The labels of the conventional gRPC server metrics for a [`METHODS`]
/// label: `grpc_service`, `grpc_method` and `grpc_type` (`unary`,
/// `server_stream`, `bidi_stream`). [`OTHER`] is `unknown` for all three,
/// so a caller's made-up names never become series.
pub fn grpc_labels(label: &'static str) -> (&'static str, &'static str, &'static str) {
    let Some((service, method)) = label.split_once('/') else {
        return ("unknown", "unknown", "unknown");
    };
    let kind = match method {
        "WatchApprovals" | "Watch" => "server_stream",
        "ServerReflectionInfo" => "bidi_stream",
        _ => "unary",
    };
    (service, method, kind)
}

/// The service a request path (`/service/method`) calls.
pub fn service_of(path: &str) -> &str {
    path.trim_start_matches('/').split('/').next().unwrap_or("")
}

/// Health and reflection: open to every caller, and exempt from load
/// shedding so that probes still answer under load.
pub fn is_probe(service: &str) -> bool {
    matches!(service, HEALTH | REFLECTION_V1 | REFLECTION_V1ALPHA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_service_slash_method() {
        assert_eq!(METHODS[0], "toolgate.v1.PolicyDecisionPoint/Decide");
        assert_eq!(METHODS[14], "toolgate.v1.Resources/ListResources");
        assert_eq!(
            METHODS[17],
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        );
        assert_eq!(
            method_label("/toolgate.v1.Approvals/WatchApprovals"),
            "toolgate.v1.Approvals/WatchApprovals"
        );
        assert_eq!(method_label("/toolgate.v1.Approvals/Nope"), OTHER);
        assert_eq!(service_of("/grpc.health.v1.Health/Check"), HEALTH);
        assert_eq!(method_index("/nope/Nope"), METHODS.len() - 1);
    }

    #[test]
    fn grpc_labels_split_the_method_and_name_its_streaming() {
        assert_eq!(
            grpc_labels(METHODS[0]),
            ("toolgate.v1.PolicyDecisionPoint", "Decide", "unary")
        );
        assert_eq!(
            grpc_labels(method_label("/toolgate.v1.Approvals/WatchApprovals")),
            ("toolgate.v1.Approvals", "WatchApprovals", "server_stream")
        );
        assert_eq!(
            grpc_labels(method_label("/grpc.health.v1.Health/Watch")),
            ("grpc.health.v1.Health", "Watch", "server_stream")
        );
        assert_eq!(grpc_labels(METHODS[17]).2, "bidi_stream");
        assert_eq!(grpc_labels(OTHER), ("unknown", "unknown", "unknown"));
    }
}
