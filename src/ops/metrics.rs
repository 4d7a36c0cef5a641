//! Prometheus metrics: the conventional gRPC server families
//! (`grpc_server_started_total`, `grpc_server_handled_total`,
//! `grpc_server_handling_seconds`, the names go-grpc-prometheus and the
//! dashboards built on it read), decisions by outcome and reason,
//! dispatches by status, ledger transitions, load shed, the store's group
//! commits, policy reloads, the build, and, computed at scrape time,
//! pending approvals, sessions, receipts, the policy revision and the
//! `process_*` figures.
//!
//! Each server owns its own recorder (nothing global). Every family is
//! described, so each has `# HELP` and `# TYPE`. toolgate's own families
//! have small, fixed label sets and are registered up front (a zero is
//! shown, so `rate()` works from the first scrape). The gRPC families'
//! labels are a cross product (19 methods by 17 codes), so each of their
//! series is created when first observed, bounded by the method table and
//! the code enum: a slot per method (and code) holds the handle once made,
//! so recording after the first call is an atomic update, with no lock.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::domain::decision::{DispatchStatus, Reason};
use crate::domain::state::Stats;
use crate::domain::table::OwnKeys;
use crate::ops::build_info;
use crate::ops::logwriter::SinkStatus;
use crate::ops::methods::{METHODS, grpc_labels};
use crate::ops::process::ProcessFigures;

/// gRPC status code names, indexed by code.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Ledger transitions (audit event names).
pub const TRANSITIONS: [&str; 6] = [
    "tool_call_require_approval",
    "approval_granted",
    "approval_denied",
    "approval_revoked",
    "approval_expired",
    "approval_consumed",
];

/// Latency buckets in seconds: 50 µs to 5 s.
const BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// Buckets of `toolgate_store_batch_operations`: operations per batch.
const BATCH_BUCKETS: [f64; 13] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

/// Every family the recorder holds, with its type and help text (the
/// families computed at scrape time write their own).
const FAMILIES: [(&str, &str, &str); 19] = [
    (
        "grpc_server_started_total",
        "counter",
        "Total number of RPCs started on the server.",
    ),
    (
        "grpc_server_handled_total",
        "counter",
        "Total number of RPCs completed on the server, regardless of success or failure.",
    ),
    (
        "grpc_server_handling_seconds",
        "histogram",
        "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
    ),
    (
        "toolgate_decisions_total",
        "counter",
        "Decide answers by outcome and reason.",
    ),
    (
        "toolgate_dispatches_total",
        "counter",
        "Dispatch answers by status.",
    ),
    (
        "toolgate_approval_transitions_total",
        "counter",
        "Approval ledger transitions by audit event.",
    ),
    (
        "toolgate_load_shed_total",
        "counter",
        "Calls refused because the server was at its concurrency limit.",
    ),
    (
        "toolgate_audit_coalesced_total",
        "counter",
        "Audit lines coalesced instead of written, by event.",
    ),
    (
        "toolgate_connections_open",
        "gauge",
        "Open client connections.",
    ),
    (
        "toolgate_connections_closed_total",
        "counter",
        "Connections closed by toolgate, by reason.",
    ),
    (
        "toolgate_log_stall_refused_total",
        "counter",
        "Calls refused because the log sink is stalled.",
    ),
    (
        "toolgate_transport_refused_total",
        "counter",
        "Calls refused by a transport check, by reason.",
    ),
    (
        "toolgate_store_batch_operations",
        "histogram",
        "Operations made durable per group commit of the store.",
    ),
    (
        "toolgate_store_sync_seconds",
        "histogram",
        "Seconds one group commit's transaction and sync took.",
    ),
    (
        "toolgate_store_bytes",
        "gauge",
        "Size of the store in bytes.",
    ),
    (
        "toolgate_config_last_reload_successful",
        "gauge",
        "1 when the last policy reload succeeded (or none was tried), 0 when it failed.",
    ),
    (
        "toolgate_config_last_reload_success_timestamp_seconds",
        "gauge",
        "Unix time of the last successful policy load (the start, or a reload).",
    ),
    (
        "toolgate_config_reloads_total",
        "counter",
        "Policy reloads tried, by result (success, failure).",
    ),
    (
        "toolgate_build_info",
        "gauge",
        "The version and commit toolgate was built from (always 1).",
    ),
];

/// The gRPC series of one method: made when first observed.
struct RpcSeries {
    labels: [Label; 3],
    started: OnceLock<Counter>,
    handling: OnceLock<Histogram>,
    /// By status code (`CODES`); a code outside the enum counts as UNKNOWN.
    handled: [OnceLock<Counter>; CODES.len()],
}

/// Counters by label, looked up on every call: the keys are this
/// program's own (reasons, statuses, event names), so [`OwnKeys`].
type Counters<K> = HashMap<K, Counter, OwnKeys>;

/// The registered handles.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    metadata: Metadata<'static>,
    /// By index in [`METHODS`].
    rpcs: Vec<RpcSeries>,
    reload_successful: Gauge,
    reload_success_timestamp: Gauge,
    /// By result: success, failure.
    reloads: [Counter; 2],
    /// Every reason Decide answers, with the outcome it comes with.
    decisions: Counters<Reason>,
    dispatches: Counters<DispatchStatus>,
    transitions: Counters<&'static str>,
    load_shed: Counter,
    audit_coalesced: Counters<&'static str>,
    connections_open: Gauge,
    connections_closed: Counters<&'static str>,
    log_refused: Counter,
    transport_refused: Counters<&'static str>,
    log_sink: std::sync::OnceLock<SinkStatus>,
    store_batch_operations: Histogram,
    store_sync_seconds: Histogram,
    store_bytes: Gauge,
}

/// Calls refused by the transport checks (the `reason` label of
/// `toolgate_transport_refused_total`).
pub const TRANSPORT_REFUSALS: [&str; 5] = [
    "read-timeout",
    "request-buffer-full",
    "response-buffer-full",
    "write-timeout",
    "malformed",
];

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn key(name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(key, value)| Label::new(*key, *value))
        .collect();
    Key::from_parts(name, labels)
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        let builder = PrometheusBuilder::new();
        // The buckets are valid constants; without them latency falls back to a summary.
        let builder = match builder.set_buckets(&BUCKETS).and_then(|builder| {
            builder.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(
                    "toolgate_store_batch_operations".into(),
                ),
                &BATCH_BUCKETS,
            )
        }) {
            Ok(with_buckets) => with_buckets,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder: PrometheusRecorder = builder.build_recorder();
        for (name, kind, help) in FAMILIES {
            let (name, help) = (KeyName::from_const_str(name), SharedString::const_str(help));
            match kind {
                "counter" => recorder.describe_counter(name, None, help),
                "gauge" => recorder.describe_gauge(name, None, help),
                _ => recorder.describe_histogram(name, None, help),
            }
        }
        let metadata = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let rpcs = METHODS
            .iter()
            .map(|&method| {
                let (service, name, kind) = grpc_labels(method);
                RpcSeries {
                    labels: [
                        Label::new("grpc_service", service),
                        Label::new("grpc_method", name),
                        Label::new("grpc_type", kind),
                    ],
                    started: OnceLock::new(),
                    handling: OnceLock::new(),
                    handled: std::array::from_fn(|_| OnceLock::new()),
                }
            })
            .collect();
        recorder
            .register_gauge(
                &key(
                    "toolgate_build_info",
                    &[
                        ("version", build_info::VERSION),
                        ("commit", build_info::COMMIT),
                    ],
                ),
                &metadata,
            )
            .set(1.0);
        let reload_successful = recorder.register_gauge(
            &key("toolgate_config_last_reload_successful", &[]),
            &metadata,
        );
        let reload_success_timestamp = recorder.register_gauge(
            &key("toolgate_config_last_reload_success_timestamp_seconds", &[]),
            &metadata,
        );
        let reloads = ["success", "failure"].map(|result| {
            recorder.register_counter(
                &key("toolgate_config_reloads_total", &[("result", result)]),
                &metadata,
            )
        });
        let decisions = Reason::ALL
            .into_iter()
            .filter_map(|reason| Some((reason.outcome()?, reason)))
            .map(|(outcome, reason)| {
                let counter = recorder.register_counter(
                    &key(
                        "toolgate_decisions_total",
                        &[("outcome", outcome.as_str()), ("reason", reason.as_str())],
                    ),
                    &metadata,
                );
                (reason, counter)
            })
            .collect();
        let dispatches = DispatchStatus::ALL
            .into_iter()
            .map(|status| {
                let counter = recorder.register_counter(
                    &key("toolgate_dispatches_total", &[("status", status.as_str())]),
                    &metadata,
                );
                (status, counter)
            })
            .collect();
        let transitions = TRANSITIONS
            .iter()
            .map(|&event| {
                let counter = recorder.register_counter(
                    &key("toolgate_approval_transitions_total", &[("event", event)]),
                    &metadata,
                );
                (event, counter)
            })
            .collect();
        let load_shed = recorder.register_counter(&key("toolgate_load_shed_total", &[]), &metadata);
        let audit_coalesced = crate::ops::audit::Rejection::ALL
            .iter()
            .map(|kind| {
                let event = kind.event_name();
                let counter = recorder.register_counter(
                    &key("toolgate_audit_coalesced_total", &[("event", event)]),
                    &metadata,
                );
                (event, counter)
            })
            .collect();
        let connections_open =
            recorder.register_gauge(&key("toolgate_connections_open", &[]), &metadata);
        let connections_closed = CloseReason::ALL
            .iter()
            .map(|reason| {
                let counter = recorder.register_counter(
                    &key(
                        "toolgate_connections_closed_total",
                        &[("reason", reason.as_str())],
                    ),
                    &metadata,
                );
                (reason.as_str(), counter)
            })
            .collect();
        let log_refused =
            recorder.register_counter(&key("toolgate_log_stall_refused_total", &[]), &metadata);
        let transport_refused = TRANSPORT_REFUSALS
            .iter()
            .map(|&reason| {
                let counter = recorder.register_counter(
                    &key("toolgate_transport_refused_total", &[("reason", reason)]),
                    &metadata,
                );
                (reason, counter)
            })
            .collect();
        let store_batch_operations =
            recorder.register_histogram(&key("toolgate_store_batch_operations", &[]), &metadata);
        let store_sync_seconds =
            recorder.register_histogram(&key("toolgate_store_sync_seconds", &[]), &metadata);
        let store_bytes = recorder.register_gauge(&key("toolgate_store_bytes", &[]), &metadata);
        let metrics = Metrics {
            handle: recorder.handle(),
            recorder,
            metadata,
            rpcs,
            reload_successful,
            reload_success_timestamp,
            reloads,
            store_batch_operations,
            store_sync_seconds,
            store_bytes,
            decisions,
            dispatches,
            transitions,
            load_shed,
            audit_coalesced,
            connections_open,
            connections_closed,
            log_refused,
            transport_refused,
            log_sink: std::sync::OnceLock::new(),
        };
        // The policy in force was loaded just now, at the start.
        metrics.policy_loaded(true);
        Arc::new(metrics)
    }

    /// A policy load: the start's (successful by then) or a reload's.
    /// A failed reload keeps the old policy, and the time of the last
    /// success stays.
    pub fn policy_loaded(&self, successful: bool) {
        self.reload_successful.set(f64::from(u8::from(successful)));
        if successful {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|since| since.as_secs_f64())
                .unwrap_or(0.0);
            self.reload_success_timestamp.set(now);
        }
    }

    /// A SIGHUP reload (or one asked for otherwise) and whether it took.
    pub fn reload(&self, successful: bool) {
        self.reloads[usize::from(!successful)].increment(1);
        self.policy_loaded(successful);
    }

    fn rpc_key(&self, name: &'static str, series: &RpcSeries, code: Option<&'static str>) -> Key {
        let mut labels = series.labels.to_vec();
        if let Some(code) = code {
            labels.push(Label::new("grpc_code", code));
        }
        Key::from_parts(name, labels)
    }

    /// A call to the method at `method` (an index in [`METHODS`]) started.
    pub fn rpc_started(&self, method: usize) {
        let Some(series) = self.rpcs.get(method) else {
            return;
        };
        series
            .started
            .get_or_init(|| {
                self.recorder.register_counter(
                    &self.rpc_key("grpc_server_started_total", series, None),
                    &self.metadata,
                )
            })
            .increment(1);
    }

    /// A call to the method at `method` (an index in [`METHODS`]) was
    /// answered with `code` after `seconds`.
    pub fn rpc_handled(&self, method: usize, code: i32, seconds: f64) {
        let Some(series) = self.rpcs.get(method) else {
            return;
        };
        let code = usize::try_from(code)
            .ok()
            .filter(|code| *code < CODES.len())
            .unwrap_or(2);
        series.handled[code]
            .get_or_init(|| {
                self.recorder.register_counter(
                    &self.rpc_key("grpc_server_handled_total", series, Some(CODES[code])),
                    &self.metadata,
                )
            })
            .increment(1);
        series
            .handling
            .get_or_init(|| {
                self.recorder.register_histogram(
                    &self.rpc_key("grpc_server_handling_seconds", series, None),
                    &self.metadata,
                )
            })
            .record(seconds);
    }

    /// One group commit of the store: the operations it made durable, how
    /// long its transaction and sync took, and the store's size after it.
    pub fn store_batch(&self, operations: usize, sync_seconds: f64, store_bytes: u64) {
        self.store_batch_operations.record(operations as f64);
        self.store_sync_seconds.record(sync_seconds);
        self.store_bytes.set(store_bytes as f64);
    }

    /// Reports the log sink's state at scrape time (once per server).
    pub fn attach_log_sink(&self, sink: SinkStatus) {
        let _ = self.log_sink.set(sink);
    }

    /// Whether the attached log sink is stalled (none attached: no).
    pub fn log_sink_stalled(&self) -> bool {
        self.log_sink.get().is_some_and(SinkStatus::stalled)
    }

    pub fn connections_open(&self, open: usize) {
        self.connections_open.set(open as f64);
    }

    pub fn connection_closed(&self, reason: CloseReason) {
        if let Some(counter) = self.connections_closed.get(reason.as_str()) {
            counter.increment(1);
        }
    }

    /// A call refused because the log sink is stalled.
    pub fn log_refused(&self) {
        self.log_refused.increment(1);
    }

    /// A call refused by a transport check (`TRANSPORT_REFUSALS`).
    pub fn transport_refused(&self, reason: &'static str) {
        if let Some(counter) = self.transport_refused.get(reason) {
            counter.increment(1);
        }
    }

    /// One Decide answered for this reason (counted under the outcome the
    /// reason comes with; every reason Decide answers has its counter).
    pub fn decision(&self, reason: Reason) {
        if let Some(counter) = self.decisions.get(&reason) {
            counter.increment(1);
        }
    }

    pub fn dispatch(&self, status: DispatchStatus) {
        if let Some(counter) = self.dispatches.get(&status) {
            counter.increment(1);
        }
    }

    pub fn transition(&self, event: &'static str) {
        if let Some(counter) = self.transitions.get(event) {
            counter.increment(1);
        }
    }

    pub fn load_shed(&self) {
        self.load_shed.increment(1);
    }

    /// One audit line of `event` coalesced instead of written.
    pub fn audit_coalesced(&self, event: &'static str) {
        if let Some(counter) = self.audit_coalesced.get(event) {
            counter.increment(1);
        }
    }

    /// Moves the latency samples recorded so far into the histograms'
    /// buckets, so that they stop taking memory.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The exposition text: recorded metrics plus the gauges of the state's
    /// `stats` (when they could be read), the policy `revision` now and the
    /// process's figures.
    pub fn render(&self, stats: Option<Stats>, revision: &str) -> String {
        let mut text = self.handle.render();
        ProcessFigures::read().write_to(&mut text);
        let sizes_read = stats.is_some();
        if let Some(stats) = stats {
            let gauges = [
                (
                    "toolgate_approvals_pending",
                    "Pending approval requests.",
                    stats.pending_approvals,
                ),
                (
                    "toolgate_approvals",
                    "Approval records held (all statuses).",
                    stats.approvals,
                ),
                ("toolgate_sessions", "Agent sessions held.", stats.sessions),
                (
                    "toolgate_receipts",
                    "Receipts in the receipt log.",
                    stats.receipts,
                ),
                (
                    "toolgate_api_pins",
                    "Manifest pins made through the API.",
                    stats.api_pins,
                ),
            ];
            for (name, help, value) in gauges {
                let _ = writeln!(
                    text,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
                );
            }
        }
        let _ = writeln!(
            text,
            "# HELP toolgate_state_sizes_read 1 when this scrape holds the state's sizes \
             (toolgate_approvals, toolgate_sessions, …); 0 when the store did not give them in time (or failed).\n\
             # TYPE toolgate_state_sizes_read gauge\ntoolgate_state_sizes_read {}",
            u8::from(sizes_read)
        );
        if let Some(sink) = self.log_sink.get() {
            let _ = writeln!(
                text,
                "# HELP toolgate_log_sink_stalled 1 while the log sink is stalled.\n# TYPE toolgate_log_sink_stalled gauge\ntoolgate_log_sink_stalled {}\n# HELP toolgate_log_sink_stalls_total Times the log sink stalled.\n# TYPE toolgate_log_sink_stalls_total counter\ntoolgate_log_sink_stalls_total {}\n# HELP toolgate_log_buffered_bytes Log bytes waiting for the sink.\n# TYPE toolgate_log_buffered_bytes gauge\ntoolgate_log_buffered_bytes {}",
                u8::from(sink.stalled()),
                sink.stalls(),
                sink.buffered(),
            );
        }
        let _ = writeln!(
            text,
            "# HELP toolgate_policy_info The policy in force.\n# TYPE toolgate_policy_info gauge\ntoolgate_policy_info{{revision=\"{revision}\"}} 1"
        );
        text
    }
}

/// Why toolgate closed a connection (the `reason` label of
/// `toolgate_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No preface and first request within the handshake timeout.
    HandshakeTimeout,
    /// Closed to make room for a new connection at a cap.
    Evicted,
    /// Refused at a cap: every open connection had a call in flight.
    Refused,
    /// A socket write made no progress within the write timeout.
    WriteTimeout,
}

impl CloseReason {
    pub const ALL: [CloseReason; 4] = [
        CloseReason::HandshakeTimeout,
        CloseReason::Evicted,
        CloseReason::Refused,
        CloseReason::WriteTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::HandshakeTimeout => "handshake-timeout",
            CloseReason::Evicted => "evicted",
            CloseReason::Refused => "refused",
            CloseReason::WriteTimeout => "write-timeout",
        }
    }
}
