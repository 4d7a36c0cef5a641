//! Prometheus metrics: RPC latency by method and status code, decisions by
//! outcome and reason, dispatches by status, ledger transitions, load shed,
//! and, computed at scrape time, pending approvals, sessions, receipts and
//! the policy revision.
//!
//! Each server owns its own recorder (nothing global), and every handle the
//! hot path touches is registered up front, so recording is an atomic
//! update on a handle found in an immutable map: no lock is taken.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::domain::decision::{DispatchStatus, Reason};
use crate::domain::state::Stats;
use crate::ops::logwriter::SinkStatus;
use crate::ops::methods::METHODS;

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

/// The registered handles.
pub struct Metrics {
    handle: PrometheusHandle,
    rpc_latency: HashMap<(&'static str, i32), Histogram>,
    /// Every reason Decide answers, with the outcome it comes with.
    decisions: HashMap<Reason, Counter>,
    dispatches: HashMap<DispatchStatus, Counter>,
    transitions: HashMap<&'static str, Counter>,
    load_shed: Counter,
    audit_coalesced: HashMap<&'static str, Counter>,
    connections_open: Gauge,
    connections_closed: HashMap<&'static str, Counter>,
    log_refused: Counter,
    transport_refused: HashMap<&'static str, Counter>,
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
        let metadata = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let mut rpc_latency = HashMap::new();
        for method in METHODS {
            for (code, name) in CODES.iter().enumerate() {
                let histogram = recorder.register_histogram(
                    &key(
                        "toolgate_rpc_duration_seconds",
                        &[("method", method), ("code", name)],
                    ),
                    &metadata,
                );
                rpc_latency.insert((method, code as i32), histogram);
            }
        }
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
        Arc::new(Metrics {
            handle: recorder.handle(),
            store_batch_operations,
            store_sync_seconds,
            store_bytes,
            rpc_latency,
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
        })
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

    pub fn rpc(&self, method: &'static str, code: i32, seconds: f64) {
        let histogram = self
            .rpc_latency
            .get(&(method, code))
            .or_else(|| self.rpc_latency.get(&("other", code)));
        if let Some(histogram) = histogram {
            histogram.record(seconds);
        }
    }

    /// Moves the latency samples recorded so far into the histograms'
    /// buckets, so that they stop taking memory.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The exposition text: recorded metrics plus the gauges of the state's
    /// `stats` (when they could be read) and the policy `revision` now.
    pub fn render(&self, stats: Option<Stats>, revision: &str) -> String {
        let mut text = self.handle.render();
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
