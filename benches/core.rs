//! Criterion benches for the hot paths of the core (no gRPC).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

use std::sync::Arc;

use toolgate::domain::canonical;
use toolgate::domain::clock::{ManualClock, Timestamp};
use toolgate::domain::decision::DispatchStatus;
use toolgate::domain::decision::Outcome;
use toolgate::domain::ledger::Verdict;
use toolgate::domain::manifest::Manifest;
use toolgate::domain::policy::Policy;
use toolgate::domain::proposal::{Proposal, SessionRef};
use toolgate::engine::Engine;

/// A typical proposal envelope, about 200 bytes.
const PROPOSAL: &str = r#"{"call_id":"c-20261129-0042","actor":"Finance-Payments","name":"payment_execute","version":17,"arguments":{"amount":15000.5,"currency":"BRL","payee":"ACME Ltda","memo":"invoice 2026/11 \u00e9"}}"#;

/// A manifest of about 10 KB: 20 tools with descriptions, parameters and scopes.
fn manifest_10kb() -> String {
    let tools: Vec<String> = (0..20)
        .map(|index| {
            format!(
                r#"{{"tool":"tool_{index:02}","description":"{description}","parameters":["query","limit","cursor","filter_{index}"],"read_only":{read_only},"scopes":["docs:read","cache:read","scope_{index}"],"inputSchema":{{"type":"object","properties":{{"query":{{"type":"string","maxLength":256}},"limit":{{"type":"integer","minimum":1,"maximum":50}}}},"required":["query"]}}}}"#,
                description = "Searches the documentation index and returns ranked passages. ".repeat(3),
                read_only = index % 2 == 0,
            )
        })
        .collect();
    format!(
        r#"{{"server":"docs-search","revision":"2026-11-01","tools":[{}]}}"#,
        tools.join(",")
    )
}

fn canonical_benches(criterion: &mut Criterion) {
    assert!(
        (180..=260).contains(&PROPOSAL.len()),
        "proposal is {} bytes",
        PROPOSAL.len()
    );
    criterion.bench_function("canonicalize+fingerprint/proposal_200B", |bench| {
        bench.iter(|| {
            let value = canonical::parse(black_box(PROPOSAL.as_bytes())).expect("valid");
            black_box(canonical::fingerprint(&value))
        })
    });
    let manifest_json = manifest_10kb();
    assert!(
        (9_000..=12_000).contains(&manifest_json.len()),
        "manifest is {} bytes",
        manifest_json.len()
    );
    criterion.bench_function("canonicalize+fingerprint/manifest_10KB", |bench| {
        bench.iter(|| {
            let value = canonical::parse(black_box(manifest_json.as_bytes())).expect("valid");
            black_box(canonical::fingerprint(&value))
        })
    });
    criterion.bench_function("manifest/parse+fingerprint_10KB", |bench| {
        bench.iter(|| {
            let manifest = Manifest::from_json(black_box(manifest_json.as_bytes())).expect("valid");
            black_box(manifest.fingerprint())
        })
    });
    // The fingerprint alone: streamed from the manifest (what AssessManifest
    // does), and through the canonical tree it used to build first.
    let manifest = Manifest::from_json(manifest_json.as_bytes()).expect("valid");
    criterion.bench_function("manifest/fingerprint_10KB", |bench| {
        bench.iter(|| black_box(black_box(&manifest).fingerprint()))
    });
    criterion.bench_function("manifest/fingerprint_via_tree_10KB", |bench| {
        bench.iter(|| black_box(canonical::fingerprint(&black_box(&manifest).to_value())))
    });
}

/// Runs an engine operation to its answer on this thread. The engine's
/// operations commit to the memory store in place (no writer thread), as a
/// `--store memory` server's calls do.
fn run<F: std::future::Future>(operation: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
    }
    RUNTIME.with(|runtime| runtime.block_on(operation))
}

/// The embedded default policy with the docs-search manifest assessed (so
/// its read tool is open) and one warm session per actor.
fn warm_engine() -> Engine {
    let policy = Policy::embedded_default().expect("embedded policy");
    let engine = Engine::new(
        policy,
        Arc::new(ManualClock::starting_at(Timestamp(1_795_910_400_000))),
    )
    .expect("engine");
    let manifest_json = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/manifests/docs-search.json"
    ))
    .expect("example manifest");
    let manifest = Manifest::from_json(&manifest_json).expect("valid manifest");
    assert!(
        run(engine.assess_manifest(&manifest))
            .expect("assess")
            .accepted
    );
    engine
}

fn decide_benches(criterion: &mut Criterion) {
    let engine = warm_engine();
    let support =
        SessionRef::new("support-agent".into(), "bench-s1".into(), "acme".into()).expect("session");
    let payments = SessionRef::new("payments-agent".into(), "bench-s2".into(), "acme".into())
        .expect("session");
    let decide = |session: &SessionRef, call_id: &str, actor: &str, tool: &str, arguments: &str| {
        let proposal =
            Proposal::new(call_id.into(), actor.into(), tool.into(), 0, arguments).expect("valid");
        run(engine.decide(session, &proposal)).expect("decide").0
    };
    let read_args = r#"{"query":"how do I reset the sensor on a lamp that keeps blinking after a firmware update?","limit":10}"#;
    let pay_args = r#"{"amount":15000,"currency":"BRL","account_number":"00123456789","memo":"invoice 2026/11"}"#;
    assert_eq!(
        decide(
            &support,
            "read-1",
            "support-agent",
            "search_docs",
            read_args
        )
        .outcome,
        Outcome::Allow
    );
    let pending = decide(
        &payments,
        "pay-1",
        "payments-agent",
        "payment_execute",
        pay_args,
    );
    assert_eq!(pending.outcome, Outcome::RequireApproval);
    let granted_call = decide(
        &payments,
        "pay-2",
        "payments-agent",
        "payment_execute",
        pay_args,
    );
    let (granted_id, _) = granted_call.approval.expect("approval");
    run(engine.review(granted_id, Verdict::Grant, "admin", String::new())).expect("grant");

    criterion.bench_function("decide/read_tool_warm_session", |bench| {
        bench.iter(|| {
            black_box(decide(
                &support,
                "read-1",
                "support-agent",
                "search_docs",
                black_box(read_args),
            ))
        })
    });
    criterion.bench_function("decide/threshold_existing_pending", |bench| {
        bench.iter(|| {
            black_box(decide(
                &payments,
                "pay-1",
                "payments-agent",
                "payment_execute",
                black_box(pay_args),
            ))
        })
    });
    criterion.bench_function("decide/approved", |bench| {
        bench.iter(|| {
            let decision = decide(
                &payments,
                "pay-2",
                "payments-agent",
                "payment_execute",
                black_box(pay_args),
            );
            assert_eq!(decision.reason.as_str(), "approved");
            black_box(decision)
        })
    });
}

/// The tickets policy with room for a long benchmark run.
fn tickets_engine() -> Engine {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tickets.toml"))
        .expect("tickets policy")
        .replace("receipt_capacity = 1000", "receipt_capacity = 100000000\nmax_approval_records = 100000000\nmax_pending_total = 100000000")
        .replace("max_decisions = 1000", "max_decisions = 100000000")
        .replace("max_tool_calls = 1000", "max_tool_calls = 100000000");
    let policy = Policy::parse(&text, "tickets-bench.toml", None).expect("policy");
    Engine::new(
        policy,
        Arc::new(ManualClock::starting_at(Timestamp(1_795_910_400_000))),
    )
    .expect("engine")
}

fn dispatch_benches(criterion: &mut Criterion) {
    let engine = tickets_engine();
    let learner =
        SessionRef::new("learner".into(), "bench".into(), "desk".into()).expect("session");
    let mut counter = 0u64;
    let mut version = 0u64;
    // Setup (not timed): a fresh proposal against the current version, decided and granted.
    let mut approved_proposal = || {
        counter += 1;
        let status = if counter.is_multiple_of(2) {
            "open"
        } else {
            "done"
        };
        let arguments = format!(r#"{{"ticket":"lamp","status":"{status}"}}"#);
        let proposal = Proposal::new(
            format!("c{counter}"),
            "learner".into(),
            "set_ticket".into(),
            version,
            &arguments,
        )
        .expect("valid");
        let (decision, _) = run(engine.decide(&learner, &proposal)).expect("decide");
        let (approval, _) = decision.approval.expect("approval requested");
        run(engine.review(approval, Verdict::Grant, "reviewer", String::new())).expect("grant");
        version += 1;
        proposal
    };
    criterion.bench_function("dispatch/commit_approved", |bench| {
        bench.iter_batched(
            &mut approved_proposal,
            |proposal| {
                let (dispatched, _) = run(engine.dispatch(&learner, &proposal)).expect("dispatch");
                assert_eq!(dispatched.status, DispatchStatus::Ok);
                assert!(!dispatched.replayed);
                dispatched
            },
            BatchSize::SmallInput,
        )
    });
    let replay = Proposal::new(
        "c1".into(),
        "learner".into(),
        "set_ticket".into(),
        0,
        r#"{"ticket":"lamp","status":"done"}"#,
    )
    .expect("valid");
    criterion.bench_function("dispatch/replay", |bench| {
        bench.iter(|| {
            let (dispatched, _) =
                run(engine.dispatch(&learner, black_box(&replay))).expect("dispatch");
            assert!(dispatched.replayed);
            black_box(dispatched)
        })
    });
}

/// AssessManifest of a 20-tool manifest (the 10 KB one above) against an
/// API pin of the same manifest: the RPC's core from the gRPC message on
/// (validation, schema parsing, fingerprint, comparison), and the variant
/// where one tool changed so a per-tool diff is computed.
fn assess_manifest_benches(criterion: &mut Criterion) {
    let engine = Engine::new(
        Policy::embedded_default().expect("embedded policy"),
        Arc::new(ManualClock::starting_at(Timestamp(1_795_910_400_000))),
    )
    .expect("engine");
    let manifest_json = manifest_10kb();
    let pinned = Manifest::from_json(manifest_json.as_bytes()).expect("valid");
    assert_eq!(pinned.tools.len(), 20);
    run(engine.pin_manifest("admin", pinned.clone(), None)).expect("pin");
    let message = toolgate::pb::Manifest::from(&pinned);
    let mut changed = pinned.clone();
    changed.tools[3].scopes.push("docs:write".into());
    changed.tools[3].scopes.sort();

    criterion.bench_function("assess_manifest/20_tools_matched_from_message", |bench| {
        bench.iter_batched(
            || message.clone(),
            |message| {
                let manifest = Manifest::try_from(message).expect("valid");
                let assessment = run(engine.assess_manifest(&manifest)).expect("assess");
                assert!(assessment.accepted);
                assessment
            },
            BatchSize::SmallInput,
        )
    });
    criterion.bench_function("assess_manifest/20_tools_matched", |bench| {
        bench.iter(|| {
            let assessment = run(engine.assess_manifest(black_box(&pinned))).expect("assess");
            assert!(assessment.accepted);
            assessment
        })
    });
    criterion.bench_function("assess_manifest/20_tools_one_changed", |bench| {
        bench.iter(|| {
            let assessment = run(engine.assess_manifest(black_box(&changed))).expect("assess");
            assert_eq!(assessment.diffs.len(), 1);
            assessment
        })
    });
}

criterion_group!(
    benches,
    canonical_benches,
    decide_benches,
    dispatch_benches,
    assess_manifest_benches
);
criterion_main!(benches);
