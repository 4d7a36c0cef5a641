//! The Envoy example (`examples/envoy/envoy.yaml`) checked mechanically: it
//! is decoded into `envoy.config.bootstrap.v3.Bootstrap`, every
//! `typed_config` into the type its `@type` names, with unknown fields
//! refused, using Envoy's protos as the envoy-types crate ships them
//! (compiled here with protox); and its ext_authz filter is configured as
//! toolgate needs it. The Istio example is checked for the keys toolgate
//! relies on (no Istio schema is at hand: its MeshConfig is not verified).

use std::path::PathBuf;

use prost_reflect::{DescriptorPool, DynamicMessage};

use crate::support::policies::repo_path;

/// The include roots of the Envoy protos in the envoy-types crate's source
/// (where build.rs found them).
fn envoy_proto_roots() -> Vec<PathBuf> {
    let proto = PathBuf::from(env!("TOOLGATE_ENVOY_PROTO_DIR"));
    [
        "data-plane-api",
        "xds",
        "protoc-gen-validate",
        "googleapis",
        "cel-spec/proto",
        "opentelemetry-proto",
        "client_model",
    ]
    .iter()
    .map(|root| proto.join(root))
    .collect()
}

fn bootstrap_pool() -> DescriptorPool {
    let files = [
        "envoy/config/bootstrap/v3/bootstrap.proto",
        "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
        "envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto",
        "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
        "envoy/extensions/filters/http/router/v3/router.proto",
        "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
    ];
    let descriptors = protox::compile(files, envoy_proto_roots()).expect("Envoy's protos compile");
    DescriptorPool::from_file_descriptor_set(descriptors).expect("a descriptor pool")
}

fn yaml_as_json(relative: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(repo_path(relative)).expect("example file");
    serde_yaml::from_str(&text).expect("valid YAML")
}

fn decode_bootstrap(
    pool: &DescriptorPool,
    json: serde_json::Value,
) -> Result<DynamicMessage, String> {
    let bootstrap = pool
        .get_message_by_name("envoy.config.bootstrap.v3.Bootstrap")
        .expect("Bootstrap");
    DynamicMessage::deserialize(bootstrap, json).map_err(|error| error.to_string())
}

#[test]
fn the_envoy_example_decodes_as_envoys_bootstrap() {
    let pool = bootstrap_pool();
    let example = yaml_as_json("examples/envoy/envoy.yaml");
    decode_bootstrap(&pool, example.clone()).expect("the example is a Bootstrap");

    // The ext_authz filter as toolgate needs it.
    let filters = &example["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"];
    let ext_authz = filters
        .as_array()
        .expect("http filters")
        .iter()
        .find(|filter| filter["name"] == "envoy.filters.http.ext_authz")
        .expect("an ext_authz filter");
    let config = &ext_authz["typed_config"];
    assert_eq!(config["with_request_body"]["allow_partial_message"], false);
    let body_limit = config["with_request_body"]["max_request_bytes"]
        .as_u64()
        .expect("max_request_bytes");
    assert!(
        body_limit < default_max_message_bytes(),
        "a body at the limit must still fit in toolgate's Check message"
    );
    assert_eq!(config["failure_mode_allow"], false);
    assert_eq!(
        config["grpc_service"]["envoy_grpc"]["cluster_name"],
        "toolgate"
    );
    let names: Vec<&str> = filters
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|filter| filter["name"].as_str())
        .collect();
    assert_eq!(
        names.last(),
        Some(&"envoy.filters.http.router"),
        "{names:?}"
    );

    // The check is strict: a misspelt key inside a typed_config is refused.
    let mut misspelt = example;
    misspelt["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"][1]["typed_config"]["with_request_body"]["allow_partial_mesage"] =
        serde_json::Value::Bool(false);
    let refused = decode_bootstrap(&pool, misspelt).expect_err("an unknown field");
    assert!(refused.contains("allow_partial_mesage"), "{refused}");
}

/// toolgate's default `[server] max_message_bytes`.
fn default_max_message_bytes() -> u64 {
    let policy = toolgate::domain::policy::Policy::embedded_default().expect("the default policy");
    policy.server.max_message_bytes as u64
}

/// The value of `key: N` in the example's comments (the MeshConfig part).
fn commented_number(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| line.trim_start_matches(['#', ' ']).strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in the example"))
}

#[test]
fn the_istio_example_sends_checks_to_toolgate() {
    let text = std::fs::read_to_string(repo_path("examples/istio/ext-authz.yaml")).expect("file");
    let policy: serde_json::Value = serde_yaml::from_str(&text).expect("valid YAML");
    assert_eq!(policy["kind"], "AuthorizationPolicy");
    assert_eq!(policy["spec"]["action"], "CUSTOM");
    assert_eq!(policy["spec"]["provider"]["name"], "toolgate");
    // One empty rule: every request to the workload is checked.
    assert_eq!(policy["spec"]["rules"], serde_json::json!([{}]));
    for needed in [
        "envoyExtAuthzGrpc",
        "includeRequestBodyInCheck",
        "allowPartialMessage: false",
        "--ext-authz-listen 0.0.0.0:50052",
        "host_credential = ",
    ] {
        assert!(text.contains(needed), "{needed}");
    }
    assert_eq!(commented_number(&text, "port:"), 50052);
    assert!(commented_number(&text, "maxRequestBytes:") < default_max_message_bytes());
    assert!(!text.contains("open_host_api"));
}
