//! Criterion benches for the hot paths of the core (no gRPC).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};

use toolgate::canonical;
use toolgate::manifest::Manifest;

/// A typical proposal envelope, about 200 bytes.
const PROPOSAL: &str = r#"{"call_id":"c-20261129-0042","actor":"Finance-Payments","name":"payment_execute","version":17,"arguments":{"amount":15000.5,"currency":"BRL","payee":"ACME Ltda","memo":"invoice 2026/11 \u00e9"}}"#;

/// A manifest of about 10 KB: 20 tools with descriptions, parameters and scopes.
fn manifest_10kb() -> String {
    let tools: Vec<String> = (0..20)
        .map(|index| {
            format!(
                r#"{{"name":"tool_{index:02}","description":"{description}","parameters":["query","limit","cursor","filter_{index}"],"read_only":{read_only},"scopes":["docs:read","cache:read","scope_{index}"],"input_schema":{{"type":"object","properties":{{"query":{{"type":"string","maxLength":256}},"limit":{{"type":"integer","minimum":1,"maximum":50}}}},"required":["query"]}}}}"#,
                description = "Searches the documentation index and returns ranked passages. ".repeat(3),
                read_only = index % 2 == 0,
            )
        })
        .collect();
    format!(
        r#"{{"server_id":"docs-search","revision":"2026-11-01","tools":[{}]}}"#,
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
}

criterion_group!(benches, canonical_benches);
criterion_main!(benches);
