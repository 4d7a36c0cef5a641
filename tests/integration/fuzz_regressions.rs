//! Replays every saved fuzz input through the harness its cargo-fuzz target
//! runs (`toolgate::fuzzing`), so CI checks exactly what the fuzzer checked:
//! `tests/fuzz/regressions/<target>/*` (inputs that once found a bug) and
//! `tests/fuzz/seeds/<target>/*` (the hand-written seed corpus). The fuzzers
//! themselves run by hand (README "Fuzzing").

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use prost::Message;

use crate::support::policies::repo_path;
use crate::support::{Manifest, decide_request, dispatch_request, fuzzing, pb};
use crate::support::{deny_request, grant_request, revoke_request};

type Harness = fn(&[u8]);

const TARGETS: [(&str, Harness); 3] = [
    ("canonical_round_trip", fuzzing::canonical_round_trip),
    ("request_conversion", fuzzing::request_conversion),
    ("policy_load", fuzzing::policy_load),
];

/// Saved inputs (`<target>/<file>`) of bugs not fixed yet. The directory
/// replays skip them; each has its own `#[ignore = "bug: …"]` test below
/// that asserts the correct behaviour. To close one: fix the bug, delete its
/// line here and its test's `#[ignore]`.
const OPEN_BUGS: &[&str] = &[];

fn fuzz_dir(kind: &str, target: &str) -> PathBuf {
    repo_path("tests/fuzz").join(kind).join(target)
}

fn harness(target: &str) -> Harness {
    match TARGETS.iter().find(|(name, _)| *name == target) {
        Some((_, harness)) => *harness,
        None => panic!("no fuzz target {target:?}"),
    }
}

/// Runs one saved input; `Err` carries the panic message.
fn replay(target: &str, path: &Path) -> Result<(), String> {
    let data = std::fs::read(path).map_err(|error| format!("cannot read: {error}"))?;
    let run = harness(target);
    catch_unwind(AssertUnwindSafe(|| run(&data))).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
            .unwrap_or_else(|| "panicked".to_string())
    })
}

/// `.gitkeep` and other dotfiles are not inputs.
fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'))
}

/// Every file of `tests/fuzz/<kind>/<target>/` except open bugs; returns how
/// many ran and fails naming every input that broke a property.
fn replay_dir(kind: &str, target: &str) -> usize {
    let dir = fuzz_dir(kind, target);
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.is_file())
            .filter(|path| !is_hidden(path))
            .collect(),
        Err(error) => panic!("cannot list {}: {error}", dir.display()),
    };
    paths.sort();
    let mut failures = Vec::new();
    let mut ran = 0;
    for path in paths {
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        let key = format!("{target}/{}", name.unwrap_or_default());
        if OPEN_BUGS.contains(&key.as_str()) {
            continue;
        }
        ran += 1;
        if let Err(message) = replay(target, &path) {
            failures.push(format!("{kind}/{key}: {message}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    ran
}

/// A known bug's input: must pass once the bug is fixed.
fn open_bug(key: &str) {
    let Some((target, file)) = key.split_once('/') else {
        panic!("bad key {key:?}");
    };
    if let Err(message) = replay(target, &fuzz_dir("regressions", target).join(file)) {
        panic!("{key}: {message}");
    }
}

#[test]
fn canonical_round_trip_regressions() {
    replay_dir("regressions", "canonical_round_trip");
}

#[test]
fn request_conversion_regressions() {
    replay_dir("regressions", "request_conversion");
}

#[test]
fn policy_load_regressions() {
    replay_dir("regressions", "policy_load");
}

#[test]
fn seeds_pass_their_harness() {
    for (target, _) in TARGETS {
        assert!(replay_dir("seeds", target) > 0, "no seeds for {target}");
    }
}

/// The inputs of the canonical JSON vectors pass the round-trip
/// harness too (the fuzzer's corpus starts from them; they are not copied).
#[test]
fn canonical_vectors_pass_the_round_trip_harness() {
    let path = repo_path("tests/fixtures/canonical_json.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
    let mut ran = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let vector: serde_json::Value = serde_json::from_str(line).expect("vector is JSON");
        let input = vector["input"].as_str().expect("vector has an input");
        fuzzing::canonical_round_trip(input.as_bytes());
        ran += 1;
    }
    assert!(ran > 0);
}

/// The encoded request seeds: file name `<Message>-<what>.pb`.
fn request_seeds() -> Vec<(String, Vec<u8>)> {
    let session = |actor: &str| pb::Session {
        actor: actor.into(),
        session_id: "s1".into(),
        workspace: "desk".into(),
    };
    let proposal = |actor: &str, name: &str, arguments: &str| pb::Proposal {
        call_id: "c1".into(),
        actor: actor.into(),
        name: name.into(),
        version: 0,
        arguments_json: arguments.into(),
    };
    let proposals = [
        (
            "set-ticket",
            session("learner"),
            proposal(
                "learner",
                "set_ticket",
                r#"{"ticket":"lamp","status":"done"}"#,
            ),
        ),
        (
            "send-reply",
            session("learner"),
            proposal(
                "learner",
                "send_reply",
                r#"{"recipient":"customer-42","text":"caf\u00e9 fixed"}"#,
            ),
        ),
        (
            "payment",
            session("payments-agent"),
            proposal(
                "payments-agent",
                "payment_execute",
                r#"{"amount":12500.5,"currency":"EUR","account_number":"12345678"}"#,
            ),
        ),
        (
            "search",
            session("support-agent"),
            proposal(
                "support-agent",
                "search_docs",
                r#"{"query":"refund policy","limit":5}"#,
            ),
        ),
    ];
    let mut seeds = Vec::new();
    for (what, session, proposal) in proposals {
        let decide = decide_request(session.clone(), proposal.clone());
        seeds.push((format!("DecideRequest-{what}.pb"), decide.encode_to_vec()));
        let dispatch = dispatch_request(session, proposal);
        seeds.push((
            format!("DispatchRequest-{what}.pb"),
            dispatch.encode_to_vec(),
        ));
    }
    let manifest_json =
        std::fs::read(repo_path("examples/manifests/docs-search.json")).expect("example manifest");
    let manifest = Manifest::from_json(&manifest_json).expect("manifest");
    let mut message = pb::Manifest::from(&manifest);
    if let Some(tool) = message.tools.first_mut() {
        tool.input_schema_json = r#"{"type":"object","properties":{"q":{"type":"string"}}}"#.into();
    }
    seeds.push((
        "AssessManifestRequest-docs-search.pb".into(),
        pb::AssessManifestRequest {
            manifest: Some(message.clone()),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "PinManifestRequest-docs-search.pb".into(),
        pb::PinManifestRequest {
            manifest: Some(message),
            expected_fingerprint: manifest.fingerprint().to_hex(),
        }
        .encode_to_vec(),
    ));
    let id = "6f1c2a4e-8b1d-4c3e-9f7a-2b5d8e0c1a93";
    seeds.push((
        "GetSessionRequest.pb".into(),
        pb::GetSessionRequest {
            session_id: "s1".into(),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "GetApprovalRequest.pb".into(),
        pb::GetApprovalRequest {
            approval_id: id.into(),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "ListApprovalsRequest.pb".into(),
        pb::ListApprovalsRequest {
            status: pb::ApprovalStatus::Pending.into(),
            actor: "learner".into(),
            tool: "set_ticket".into(),
            page_size: 20,
            page_token: format!("1795910400000.{id}"),
            approval_id_prefix: String::new(),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "GrantApprovalRequest.pb".into(),
        grant_request(id, "looks right").encode_to_vec(),
    ));
    seeds.push((
        "DenyApprovalRequest.pb".into(),
        deny_request(id, "wrong customer").encode_to_vec(),
    ));
    seeds.push((
        "RevokeApprovalRequest.pb".into(),
        revoke_request(id, "changed my mind").encode_to_vec(),
    ));
    seeds.push((
        "RemovePinRequest.pb".into(),
        pb::RemovePinRequest {
            server_id: "docs-search".into(),
        }
        .encode_to_vec(),
    ));
    seeds.push((
        "GetResourceRequest.pb".into(),
        pb::GetResourceRequest {
            name: "lamp".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    ));
    seeds
}

/// The committed request seeds are exactly what `request_seeds` makes, so
/// they stay valid messages as the proto evolves. After a proto change run
/// `cargo test --test integration fuzz_regressions::regenerate_request_seeds -- --ignored`.
#[test]
fn request_seeds_are_current() {
    for (name, bytes) in request_seeds() {
        let path = fuzz_dir("seeds", "request_conversion").join(&name);
        let committed =
            std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert_eq!(committed, bytes, "{name} is stale: regenerate the seeds");
    }
}

#[test]
#[ignore = "writes tests/fuzz/seeds/request_conversion/; run by hand after a proto change"]
fn regenerate_request_seeds() {
    let dir = fuzz_dir("seeds", "request_conversion");
    std::fs::create_dir_all(&dir).expect("seed dir");
    for (name, bytes) in request_seeds() {
        std::fs::write(dir.join(name), bytes).expect("write seed");
    }
}

#[test]
fn open_bugs_have_inputs() {
    for key in OPEN_BUGS {
        let (target, file) = key.split_once('/').expect("target/file");
        assert!(
            fuzz_dir("regressions", target).join(file).is_file(),
            "{key}"
        );
    }
}

/// SPEC §1/§3: `nan` (or `inf`) as a state resource must be refused with
/// the key (found by the policy_load fuzzer, which loaded it as `null`).
#[test]
fn policy_nan_resource_is_refused() {
    open_bug("policy_load/nan-resource.toml");
}
