//! The `/metrics` exposition as a scraper and a dashboard see it (issue 18):
//! parsed as Prometheus text, every family with HELP and TYPE, the
//! conventional gRPC server families made on first use with bounded labels,
//! `process_*`, build and reload metrics, an idle scrape under 50 KB, gzip
//! when asked, and the Grafana dashboard in `examples/` querying only
//! families that exist.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use tonic::Code;
use toolgate::domain::policy::Serving;

use crate::support::metrics::{Family, parse_exposition, scrape, scrape_raw};
use crate::support::policies::{decide_policy, repo_path};
use crate::support::proposal;
use crate::support::session;
use crate::support::tokens::{ALICE, HOST};
use crate::support::{TestServer, authed, pb};

/// The families a scrape of an idle server must hold.
const IDLE_FAMILIES: [&str; 11] = [
    "toolgate_build_info",
    "toolgate_config_last_reload_successful",
    "toolgate_config_last_reload_success_timestamp_seconds",
    "toolgate_config_reloads_total",
    "toolgate_decisions_total",
    "toolgate_store_batch_operations",
    "toolgate_policy_info",
    "toolgate_state_sizes_read",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
];

fn checked(text: &str) -> BTreeMap<String, Family> {
    let families = parse_exposition(text);
    for (name, family) in &families {
        assert!(
            family.help.as_deref().is_some_and(|help| !help.is_empty()),
            "{name} has no HELP"
        );
        assert!(family.kind.is_some(), "{name} has no TYPE");
    }
    families
}

fn value(
    families: &BTreeMap<String, Family>,
    sample: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let family = sample
        .strip_suffix("_count")
        .filter(|base| families.contains_key(*base))
        .unwrap_or(sample);
    families
        .get(family)?
        .samples
        .iter()
        .find_map(|(name, have, value)| {
            let wanted: BTreeSet<(String, String)> = labels
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect();
            let have: BTreeSet<(String, String)> = have.iter().cloned().collect();
            (name == sample && have == wanted).then_some(*value)
        })
}

#[tokio::test]
async fn an_idle_scrape_is_small_and_every_family_is_described() {
    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let addr = server.metrics_addr.expect("metrics listener");
    let text = scrape(addr).await;
    assert!(
        text.len() <= 50 * 1024,
        "idle scrape is {} bytes",
        text.len()
    );
    let families = checked(&text);
    for name in IDLE_FAMILIES {
        assert!(families.contains_key(name), "{name} missing:\n{text}");
    }
    let series: usize = families.values().map(|family| family.samples.len()).sum();
    assert!(series < 400, "{series} series at idle");
    // Nothing was called: no gRPC series exist yet (none pre-registered).
    assert!(!text.contains("grpc_server_handled_total{"), "{text}");
    let build = &families["toolgate_build_info"].samples[0];
    let labels: BTreeMap<_, _> = build.1.iter().cloned().collect();
    assert_eq!(labels["version"], env!("CARGO_PKG_VERSION"));
    assert!(!labels["commit"].is_empty());
    assert_eq!(build.2, 1.0);
    assert_eq!(
        value(&families, "toolgate_config_last_reload_successful", &[]),
        Some(1.0)
    );
    assert_eq!(
        (
            value(&families, "toolgate_state_sizes_read", &[]),
            value(&families, "toolgate_approvals_pending", &[])
        ),
        (Some(1.0), Some(0.0))
    );
    let loaded = value(
        &families,
        "toolgate_config_last_reload_success_timestamp_seconds",
        &[],
    );
    assert!(loaded.is_some_and(|seconds| seconds > 1.0e9), "{loaded:?}");
    assert_eq!(
        families["process_cpu_seconds_total"].kind.as_deref(),
        Some("counter")
    );
    assert!(
        value(&families, "process_resident_memory_bytes", &[]).is_some_and(|bytes| bytes > 0.0)
    );

    // gzip when asked, the same exposition once decoded.
    let (head, body) = scrape_raw(addr, "Accept-Encoding: gzip\r\n").await;
    assert!(
        head.to_ascii_lowercase().contains("content-encoding: gzip"),
        "{head}"
    );
    let mut decoded = String::new();
    flate2::read::GzDecoder::new(body.as_slice())
        .read_to_string(&mut decoded)
        .expect("gzip body");
    let unzipped = checked(&decoded);
    assert_eq!(
        unzipped.keys().collect::<Vec<_>>(),
        families.keys().collect::<Vec<_>>()
    );
    assert!(
        body.len() < decoded.len() / 3,
        "{} of {}",
        body.len(),
        decoded.len()
    );
    // And plain text when not.
    let (head, _) = scrape_raw(addr, "Accept-Encoding: br\r\n").await;
    assert!(
        !head.to_ascii_lowercase().contains("content-encoding"),
        "{head}"
    );
    server.stop().await;
}

#[tokio::test]
async fn grpc_families_count_each_call_by_method_and_code() {
    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let payer = session("payer", "s1", "acme");
    for index in 0..2 {
        let read = proposal(&format!("r{index}"), "payer", "read_balance", 0, "{}");
        assert_eq!(
            server.decide_ok(HOST, &payer, &read).await.reason,
            "allowed"
        );
    }
    let read = proposal("r9", "payer", "read_balance", 0, "{}");
    let refused = server
        .decide("wrong-token", &payer, &read)
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::Unauthenticated);
    server.health().await;
    let text = scrape(server.metrics_addr.expect("metrics listener")).await;
    let families = checked(&text);
    let decide = [
        ("grpc_service", "toolgate.v1.PolicyDecisionPoint"),
        ("grpc_method", "Decide"),
        ("grpc_type", "unary"),
    ];
    let with_code = |code| {
        let mut labels = decide.to_vec();
        labels.push(("grpc_code", code));
        labels
    };
    assert_eq!(
        value(&families, "grpc_server_started_total", &decide),
        Some(3.0)
    );
    assert_eq!(
        value(&families, "grpc_server_handled_total", &with_code("OK")),
        Some(2.0)
    );
    assert_eq!(
        value(
            &families,
            "grpc_server_handled_total",
            &with_code("UNAUTHENTICATED")
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&families, "grpc_server_handling_seconds_count", &decide),
        Some(3.0)
    );
    assert_eq!(
        families["grpc_server_handling_seconds"].kind.as_deref(),
        Some("histogram")
    );
    // Only what was observed: Decide's two codes and health's OK.
    let handled = &families["grpc_server_handled_total"].samples;
    assert_eq!(handled.len(), 3, "{handled:?}");
    assert!(!text.contains("UNIMPLEMENTED"), "{text}");
    for (_, labels, _) in handled {
        let names: Vec<&str> = labels.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["grpc_service", "grpc_method", "grpc_type", "grpc_code"]
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_stream_is_handled_when_it_ends_not_when_it_starts() {
    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let watch = [
        ("grpc_service", "toolgate.v1.Approvals"),
        ("grpc_method", "WatchApprovals"),
        ("grpc_type", "server_stream"),
    ];
    let cancelled = {
        let mut labels = watch.to_vec();
        labels.push(("grpc_code", "CANCELLED"));
        labels
    };
    let stream = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
        .await
        .expect("watch")
        .into_inner();
    let families = checked(&scrape(server.metrics_addr.expect("metrics listener")).await);
    assert_eq!(
        value(&families, "grpc_server_started_total", &watch),
        Some(1.0)
    );
    assert_eq!(
        value(&families, "grpc_server_handled_total", &cancelled),
        None
    );
    assert_eq!(
        value(&families, "grpc_server_handling_seconds_count", &watch),
        None
    );
    // The client goes away: the stream ends, and is handled, CANCELLED.
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let families = checked(&scrape(server.metrics_addr.expect("metrics listener")).await);
        if value(&families, "grpc_server_handled_total", &cancelled) == Some(1.0) {
            assert_eq!(
                value(&families, "grpc_server_handling_seconds_count", &watch),
                Some(1.0)
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ended stream was never counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_failed_reload_shows_in_the_reload_metrics() {
    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let addr = server.metrics_addr.expect("metrics listener");
    let before = checked(&scrape(addr).await);
    let missing = Path::new("/nonexistent/toolgate-policy.toml");
    let reloaded =
        toolgate::engine::reload::reload_once(&server.engine, missing, Serving::plain(server.addr))
            .await;
    assert!(reloaded.is_err(), "{reloaded:?}");
    let after = checked(&scrape(addr).await);
    assert_eq!(
        value(&after, "toolgate_config_last_reload_successful", &[]),
        Some(0.0)
    );
    assert_eq!(
        value(
            &after,
            "toolgate_config_reloads_total",
            &[("result", "failure")]
        ),
        Some(1.0)
    );
    let stamp = "toolgate_config_last_reload_success_timestamp_seconds";
    assert_eq!(value(&after, stamp, &[]), value(&before, stamp, &[]));
    server.stop().await;
}

/// The metric names a PromQL expression reads: the identifiers of toolgate's,
/// the gRPC and the process families (a histogram's `_bucket`, `_sum` and
/// `_count` are its family's).
fn queried_families(expression: &str) -> Vec<String> {
    expression
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| {
            ["toolgate_", "grpc_server_", "process_"]
                .iter()
                .any(|prefix| word.starts_with(prefix))
        })
        .map(|word| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(word)
                .to_string()
        })
        .collect()
}

fn expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr" | "query", serde_json::Value::String(text)) => out.push(text.clone()),
                    _ => expressions(inner, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| expressions(item, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_grafana_dashboard_queries_only_families_that_exist() {
    let path = repo_path("examples/grafana/toolgate-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("json");
    let mut queries = Vec::new();
    expressions(&dashboard, &mut queries);
    assert!(queries.len() >= 8, "{queries:?}");

    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let payer = session("payer", "s1", "acme");
    let read = proposal("r1", "payer", "read_balance", 0, "{}");
    server.decide_ok(HOST, &payer, &read).await;
    let families = checked(&scrape(server.metrics_addr.expect("metrics listener")).await);
    let mut queried = BTreeSet::new();
    for query in &queries {
        for family in queried_families(query) {
            assert!(
                families.contains_key(&family),
                "{family} (in {query:?}) is not exported"
            );
            queried.insert(family);
        }
    }
    for family in [
        "grpc_server_handled_total",
        "grpc_server_handling_seconds",
        "toolgate_build_info",
        "toolgate_config_last_reload_successful",
        "process_resident_memory_bytes",
    ] {
        assert!(
            queried.contains(family),
            "the dashboard does not show {family}"
        );
    }
    server.stop().await;
}
