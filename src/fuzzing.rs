//! Fuzz harnesses: what the cargo-fuzz targets in `tests/fuzz/` run on every
//! generated input and what `tests/integration/fuzz_regressions.rs` runs on every saved
//! one, so CI replays exactly the checks the fuzzer made.
//!
//! A harness returns normally for any input a client or an operator could
//! send, valid or not, and panics only on a bug, with a message naming the
//! broken property. Not part of the product API (`#[doc(hidden)]`).

use std::sync::OnceLock;

use prost::Message;

use crate::domain::canonical::{
    self, CanonicalError, ErrorKind, Fingerprint, Number, Object, Value,
};
use crate::domain::clock::Timestamp;
use crate::domain::decision::DispatchStatus;
use crate::domain::error::Error;
use crate::domain::ids;
use crate::domain::ledger::Verdict;
use crate::domain::limits::{APPROVALS_PAGE, approval_page_token};
use crate::domain::manifest::Manifest;
use crate::domain::policy::{Effect, Policy};
use crate::domain::proposal::{self, Proposal, SessionRef};
use crate::domain::state::{Grants, State};
use crate::edge::convert;
use crate::pb;

/// The time every harness runs at (2026-11-29T00:00:00Z, as the tests).
const FUZZ_NOW: Timestamp = Timestamp(1_795_910_400_000);

// ---------------------------------------------------------------------------
// canonical_round_trip
// ---------------------------------------------------------------------------

/// SPEC §1 on arbitrary bytes. Parsing is deterministic and never panics; an
/// accepted value prints as printable ASCII that parses back to the same
/// value (floats bit for bit) and prints to the same bytes again
/// (`canonical(parse(canonical(x))) == canonical(x)`); the streamed
/// fingerprint is the SHA-256 of the printed text; every float prints with
/// Python's `repr` digits and layout. Differential check against
/// `serde_json`: text accepted here is JSON, text rejected as `invalid-json`
/// or `invalid-utf8` is not, and accepted values agree.
pub fn canonical_round_trip(data: &[u8]) {
    let parsed = canonical::parse(data);
    assert_eq!(
        parsed,
        canonical::parse(data),
        "parsing the same bytes twice gave different answers"
    );
    check_against_serde_json(data, &parsed);
    let value = match parsed {
        Ok(value) => value,
        Err(error) => {
            assert!(
                error.offset <= data.len(),
                "error offset {} past the end of {} bytes",
                error.offset,
                data.len()
            );
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let printed = canonical::to_canonical(&value);
    assert!(
        printed.bytes().all(|byte| (0x20..0x7f).contains(&byte)),
        "canonical text is not printable ASCII: {printed:?}"
    );
    let reparsed = match canonical::parse(printed.as_bytes()) {
        Ok(reparsed) => reparsed,
        Err(error) => panic!("canonical text {printed:?} does not parse: {error}"),
    };
    assert!(
        same_value(&value, &reparsed),
        "canonical text {printed:?} parses to a different value: {value:?} vs {reparsed:?}"
    );
    assert_eq!(
        canonical::to_canonical(&reparsed),
        printed,
        "printing the reparsed canonical text changed it"
    );
    assert_eq!(
        canonical::canonicalize(data).as_deref(),
        Ok(printed.as_str()),
        "canonicalize disagrees with parse + to_canonical"
    );
    assert_eq!(
        canonical::fingerprint(&value),
        Fingerprint::of_bytes(printed.as_bytes()),
        "the streamed fingerprint is not the SHA-256 of the canonical text"
    );
    visit_floats(&value, &mut check_float);
}

/// Structural equality with floats compared bit for bit (`-0.0 != 0.0`).
fn same_value(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(Number::Float(a)), Value::Number(Number::Float(b))) => {
            a.to_bits() == b.to_bits()
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|((ka, va), (kb, vb))| ka == kb && same_value(va, vb))
        }
        _ => left == right,
    }
}

fn visit_floats(value: &Value, check: &mut impl FnMut(f64)) {
    match value {
        Value::Number(Number::Float(float)) => check(*float),
        Value::Array(items) => items.iter().for_each(|item| visit_floats(item, check)),
        Value::Object(object) => object
            .iter()
            .for_each(|(_, item)| visit_floats(item, check)),
        _ => {}
    }
}

/// A float prints like Python's `repr`: the shortest digits that round-trip
/// (as many as Rust's shortest `{:e}`; ties may differ in the last digit),
/// fixed notation for decimal exponents -4..=15, else `d[.ddd]e±XX`.
fn check_float(float: f64) {
    let text = canonical::to_canonical(&Value::Number(Number::Float(float)));
    match text.parse::<f64>() {
        Ok(back) if back.to_bits() == float.to_bits() => {}
        other => panic!("float {float:e} printed as {text:?}, which reads back as {other:?}"),
    }
    let shortest = format!("{:e}", float.abs());
    let (rust_mantissa, rust_exponent) = shortest.split_once('e').unwrap_or((&shortest, "0"));
    let exponent: i32 = rust_exponent.parse().unwrap_or(0);
    let significant = |mantissa: &str| {
        mantissa
            .chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .trim_matches('0')
            .len()
    };
    let (mantissa, printed_exponent) = match text.split_once('e') {
        Some((mantissa, printed_exponent)) => (mantissa, Some(printed_exponent)),
        None => (text.as_str(), None),
    };
    assert_eq!(
        significant(mantissa),
        significant(rust_mantissa),
        "float {float:e} printed as {text:?}: not the shortest round-trip digits"
    );
    let fixed = float == 0.0 || (-4..=15).contains(&exponent);
    match printed_exponent {
        None => assert!(
            fixed && mantissa.contains('.'),
            "float {float:e} printed as {text:?}: expected exponent notation"
        ),
        Some(printed_exponent) => {
            let sign = if exponent < 0 { '-' } else { '+' };
            let expected = format!("{sign}{:02}", exponent.unsigned_abs());
            assert!(
                !fixed && printed_exponent == expected,
                "float {float:e} printed as {text:?}: expected fixed notation or exponent {expected}"
            );
        }
    }
}

/// `serde_json` as an independent reference for what is JSON at all.
fn check_against_serde_json(data: &[u8], parsed: &Result<Value, CanonicalError>) {
    let reference = serde_json::from_slice::<serde_json::Value>(data);
    match (parsed, &reference) {
        (Ok(value), Ok(expected)) => assert!(
            agrees_with_serde(value, expected),
            "parsed {value:?} but serde_json reads {expected:?}"
        ),
        (Ok(value), Err(error)) => {
            panic!("accepted {value:?} from text that serde_json rejects: {error}")
        }
        (Err(error), Ok(expected))
            if matches!(error.kind, ErrorKind::InvalidJson | ErrorKind::InvalidUtf8) =>
        {
            panic!("rejected ({error}) text that serde_json reads as {expected:?}")
        }
        _ => {}
    }
}

/// Same structure, strings and integers; floats within one unit in the last
/// place (serde_json's default float parsing is not always correctly rounded).
fn agrees_with_serde(value: &Value, expected: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match (value, expected) {
        (Value::Null, J::Null) => true,
        (Value::Bool(a), J::Bool(b)) => a == b,
        (Value::String(a), J::String(b)) => a == b,
        (Value::Number(Number::Int(a)), J::Number(b)) => {
            b.as_i64().map(i128::from) == Some(*a)
                || b.as_u64().map(i128::from) == Some(*a)
                // serde_json reads `-0` as the float -0.0; SPEC §1 says integer 0.
                || (*a == 0 && b.as_f64() == Some(0.0))
        }
        (Value::Number(Number::Float(a)), J::Number(b)) => b.as_f64().is_some_and(|b| {
            a == &b
                || (a.is_sign_negative() == b.is_sign_negative()
                    && a.to_bits().abs_diff(b.to_bits()) <= 1)
        }),
        (Value::Array(a), J::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| agrees_with_serde(x, y))
        }
        (Value::Object(a), J::Object(b)) => {
            a.len() == b.len()
                && a.iter().all(|(key, item)| {
                    b.get(key)
                        .is_some_and(|other| agrees_with_serde(item, other))
                })
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// request_conversion
// ---------------------------------------------------------------------------

/// Every request message of `toolgate.v1` decoded from the same bytes and run
/// through the conversions its handler uses. Conversions never panic and
/// fail only with `INVALID_ARGUMENT`; what converts round-trips (manifests,
/// page tokens, approval ids). A converted Decide/Dispatch proposal is also
/// run through Decide, Dispatch, a grant and Dispatch again on a fresh state
/// for the example policies: never an internal error, never a commit of an
/// approval-requiring tool without a consumed grant, a replay is identical.
pub fn request_conversion(data: &[u8]) {
    if let Ok(request) = pb::DecideRequest::decode(data) {
        proposal_request(request.session, request.proposal);
    }
    if let Ok(request) = pb::DispatchRequest::decode(data) {
        proposal_request(request.session, request.proposal);
    }
    if let Ok(request) = pb::AssessManifestRequest::decode(data) {
        match convert::required(request.manifest, "manifest") {
            Ok(manifest) => manifest_request(manifest),
            Err(error) => expect_invalid(&error, "manifest"),
        }
    }
    if let Ok(request) = pb::PinManifestRequest::decode(data) {
        match convert::optional_fingerprint(&request.expected_fingerprint, "expected_fingerprint") {
            Ok(Some(fingerprint)) => assert_eq!(
                Fingerprint::from_hex(&fingerprint.to_hex()),
                Some(fingerprint)
            ),
            Ok(None) => assert!(request.expected_fingerprint.is_empty()),
            Err(error) => expect_invalid(&error, "expected_fingerprint"),
        }
        if let Some(manifest) = request.manifest {
            manifest_request(manifest);
        }
    }
    if let Ok(request) = pb::GetSessionRequest::decode(data)
        && let Err(error) = ids::check_identifier("session_id", &request.session_id)
    {
        expect_invalid(&error, "session_id");
    }
    if let Ok(request) = pb::GetApprovalRequest::decode(data) {
        approval_id_field(&request.approval_id);
    }
    if let Ok(request) = pb::GrantApprovalRequest::decode(data) {
        approval_id_field(&request.approval_id);
    }
    if let Ok(request) = pb::DenyApprovalRequest::decode(data) {
        approval_id_field(&request.approval_id);
    }
    if let Ok(request) = pb::RevokeApprovalRequest::decode(data) {
        approval_id_field(&request.approval_id);
    }
    if let Ok(request) = pb::ListApprovalsRequest::decode(data) {
        list_request(request);
    }
    if let Ok(request) = pb::RemovePinRequest::decode(data)
        && let Err(error) = ids::check_server_id("server_id", &request.server_id)
    {
        expect_invalid(&error, "server_id");
    }
    // The reviewer notes of Grant/Deny/Revoke, GetResource's name: a length
    // checked by their domain constructors (`limits`); ListPins and
    // WatchApprovals carry nothing. Decoding must still never panic.
    let _ = pb::GetResourceRequest::decode(data);
    let _ = pb::ListPinsRequest::decode(data);
    let _ = pb::WatchApprovalsRequest::decode(data);
}

/// A conversion error must be INVALID_ARGUMENT naming a field under `prefix`.
fn expect_invalid(error: &Error, prefix: &str) {
    match error {
        Error::InvalidArgument { field, .. } if field.starts_with(prefix) => {}
        other => panic!("conversion failed with {other:?}, not INVALID_ARGUMENT under {prefix:?}"),
    }
}

fn approval_id_field(text: &str) {
    match ids::approval_id("approval_id", text) {
        Ok(id) => assert_eq!(
            ids::approval_id("approval_id", &id.to_string()),
            Ok(id),
            "approval id {text:?} does not round-trip"
        ),
        Err(error) => expect_invalid(&error, "approval_id"),
    }
}

fn list_request(request: pb::ListApprovalsRequest) {
    let template = pb::ListApprovalsRequest {
        page_token: String::new(),
        ..request.clone()
    };
    match convert::list_query(request) {
        Ok(query) => {
            assert!(query.page_size >= 1 && query.page_size <= APPROVALS_PAGE.max as usize);
            if let Some(key) = query.after {
                let again = convert::list_query(pb::ListApprovalsRequest {
                    page_token: approval_page_token(key),
                    ..template
                });
                match again {
                    Ok(again) => assert_eq!(again.after, Some(key), "page token round trip"),
                    Err(error) => panic!("a page token we made is refused: {error:?}"),
                }
            }
        }
        Err(error) => match error {
            Error::InvalidArgument { field, .. }
                if ["status", "page_size", "page_token", "approval_id_prefix"]
                    .contains(&field.as_str()) => {}
            other => panic!("list_query failed with {other:?}"),
        },
    }
}

/// `Manifest::try_from`, then: converting back to the message and again
/// gives the same manifest and fingerprint, and so does its JSON form.
fn manifest_request(message: pb::Manifest) {
    let manifest = match Manifest::try_from(message) {
        Ok(manifest) => manifest,
        Err(error) => {
            expect_invalid(&error.under("manifest"), "manifest");
            return;
        }
    };
    let fingerprint = manifest.fingerprint();
    match Manifest::try_from(pb::Manifest::from(&manifest)) {
        Ok(again) => {
            assert_eq!(again, manifest, "manifest → message → manifest changed it");
            assert_eq!(again.fingerprint(), fingerprint);
        }
        Err(error) => panic!("a converted manifest's own message is refused: {error:?}"),
    }
    let json = canonical::to_canonical(&manifest.to_value());
    match Manifest::from_json(json.as_bytes()) {
        Ok(again) => {
            assert_eq!(again, manifest, "manifest → JSON → manifest changed it");
            assert_eq!(again.fingerprint(), fingerprint);
        }
        Err(error) => panic!("a manifest's canonical JSON is refused: {error:?}"),
    }
}

fn proposal_request(session: Option<pb::Session>, proposal: Option<pb::Proposal>) {
    match convert::session_and_proposal(session, proposal) {
        Ok((session, proposal)) => {
            respelled_arguments_keep_the_fingerprint(&proposal);
            for policy in example_policies() {
                exercise_core(policy, &session, &proposal);
            }
        }
        Err(Error::InvalidArgument { field, .. })
            if field.starts_with("session") || field.starts_with("proposal") => {}
        Err(other) => panic!("session_and_proposal failed with {other:?}"),
    }
}

/// SPEC §2: the fingerprint is the SHA-256 of the canonical JSON of exactly
/// the five keys (computed here the plain way, as a reference), so the
/// canonical spelling of the arguments gives the same proposal.
fn respelled_arguments_keep_the_fingerprint(proposal: &Proposal) {
    let mut envelope = Object::new();
    envelope.insert("call_id", Value::from(proposal.call_id.as_str()));
    envelope.insert("actor", Value::from(proposal.actor.as_str()));
    envelope.insert("name", Value::from(proposal.name.as_str()));
    envelope.insert("version", Value::from(proposal.version));
    envelope.insert("arguments", Value::Object(proposal.arguments.clone()));
    assert_eq!(
        proposal.fingerprint,
        canonical::fingerprint(&Value::Object(envelope)),
        "the proposal fingerprint is not that of the canonical five-key envelope"
    );
    let canonical_arguments = canonical::to_canonical(&Value::Object(proposal.arguments.clone()));
    match Proposal::new(
        proposal.call_id.clone(),
        proposal.actor.clone(),
        proposal.name.clone(),
        proposal.version,
        &canonical_arguments,
    ) {
        Ok(respelled) => assert_eq!(
            respelled.fingerprint, proposal.fingerprint,
            "canonical respelling changed the fingerprint"
        ),
        Err(other) => panic!("canonical respelling refused: {other:?}"),
    }
}

/// The embedded default and the two-ticket policy, parsed once.
fn example_policies() -> &'static [Policy] {
    static POLICIES: OnceLock<Vec<Policy>> = OnceLock::new();
    POLICIES.get_or_init(|| {
        [
            (crate::domain::policy::EMBEDDED_DEFAULT, "<embedded>"),
            (
                include_str!("../examples/tickets.toml"),
                "examples/tickets.toml",
            ),
        ]
        .into_iter()
        .filter_map(|(text, name)| Policy::parse(text, name, None).ok())
        .collect()
    })
}

fn exercise_core(policy: &Policy, session: &SessionRef, proposal: &Proposal) {
    let mut state = State::new(policy);
    let screen = || proposal::screen(policy, session, proposal);
    match state.decide(policy, FUZZ_NOW, session, proposal, screen(), Grants::Keep) {
        Ok((decision, _)) => assert_eq!(decision.fingerprint, proposal.fingerprint),
        Err(Error::Internal(message)) => panic!("decide failed internally: {message}"),
        Err(_) => {}
    }
    let mut answer = dispatch_checked(&mut state, policy, session, proposal);
    // Grant the request Dispatch pointed at and try again.
    if let Some((approval_id, DispatchStatus::ApprovalRequired)) = answer
        .as_ref()
        .and_then(|answer| answer.approval_id.map(|id| (id, answer.status)))
        && let Some(reviewer) = policy.reviewers.keys().min()
    {
        let granted = state.review(
            policy,
            FUZZ_NOW,
            approval_id,
            Verdict::Grant,
            reviewer,
            String::new(),
        );
        if let Err(Error::Internal(message)) = granted {
            panic!("grant failed internally: {message}");
        }
        answer = dispatch_checked(&mut state, policy, session, proposal);
    }
    let Some(first) = answer else { return };
    if first.status != DispatchStatus::Ok {
        return;
    }
    let Some(replay) = dispatch_checked(&mut state, policy, session, proposal) else {
        panic!("a replay of a committed proposal was refused");
    };
    assert!(replay.replayed, "the second dispatch was not a replay");
    assert_eq!(
        (replay.status, &replay.result, replay.receipt_id),
        (first.status, &first.result, first.receipt_id),
        "a replay differs from the commit"
    );
}

/// One Dispatch on a state: never an internal error; a commit of a tool that
/// needs approval names the grant it consumed.
fn dispatch_checked(
    state: &mut State,
    policy: &Policy,
    session: &SessionRef,
    proposal: &Proposal,
) -> Option<crate::domain::decision::Dispatched> {
    let screened = proposal::screen(policy, session, proposal);
    let needs_approval = proposal::admit(policy, session, proposal)
        .ok()
        .and_then(|admitted| {
            proposal::approval_reason(admitted.tool, admitted.profile, &proposal.arguments)
        })
        .is_some();
    match state.dispatch(policy, FUZZ_NOW, session, proposal, screened) {
        Ok((answer, events)) => {
            assert_eq!(answer.fingerprint, proposal.fingerprint);
            if answer.status == DispatchStatus::Ok && !answer.replayed && needs_approval {
                let consumed = events.iter().any(|event| {
                    event.kind == crate::domain::ledger::EventKind::Consumed
                        && Some(event.approval.id) == answer.approval_id
                });
                assert!(consumed, "committed without consuming a grant: {answer:?}");
            }
            Some(answer)
        }
        Err(Error::Internal(message)) => panic!("dispatch failed internally: {message}"),
        Err(_) => None,
    }
}

// ---------------------------------------------------------------------------
// policy_load
// ---------------------------------------------------------------------------

/// The policy loader on arbitrary text: `Policy::parse` never panics; an
/// error names its source; a loaded policy is consistent (revision, append
/// effects on list resources), its compiled schemas can be used and its
/// resources hold exactly the values written in the file.
pub fn policy_load(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policy = match Policy::parse(text, "fuzz", None) {
        Ok(policy) => policy,
        Err(error) => {
            assert_eq!(error.source_name, "fuzz");
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    assert_eq!(policy.revision.len(), 12);
    for tool in policy.tools.values() {
        if let Effect::Append { resource } = &tool.effect {
            assert!(
                matches!(policy.state.resources.get(resource), Some(Value::Array(_))),
                "tool {:?} appends to {resource:?}, which is not a list",
                tool.name
            );
        }
        for instance in ["{}", r#"{"a": 1, "b": "x", "c": [1.5, null, true]}"#] {
            if let Ok(Value::Object(instance)) = canonical::parse_str(instance) {
                let _ = proposal::check_arguments(tool, &instance);
            }
        }
    }
    let written = toml::from_str::<toml::Table>(text).ok();
    let written = written
        .as_ref()
        .and_then(|table| table.get("state"))
        .and_then(|state| state.get("resources"))
        .and_then(toml::Value::as_table);
    for (name, value) in &policy.state.resources {
        let printed = canonical::to_canonical(value);
        assert!(
            canonical::parse(printed.as_bytes()).is_ok(),
            "resource value {printed:?} does not reparse"
        );
        // SPEC §1/§3: what cannot be represented is rejected with the key,
        // never silently changed.
        if let Some(written) = written.and_then(|resources| resources.get(name)) {
            assert!(
                same_as_written(written, value),
                "state.resources.{name} = {written} was loaded as {printed}"
            );
        }
    }
    let _ = State::new(&policy);
}

/// A resource value is the TOML value as written: the same strings,
/// integers, finite floats (bit for bit), booleans, arrays and tables; a
/// date-time becomes its RFC 3339 text.
fn same_as_written(written: &toml::Value, loaded: &Value) -> bool {
    match (written, loaded) {
        (toml::Value::String(a), Value::String(b)) => a == b,
        (toml::Value::Integer(a), Value::Number(Number::Int(b))) => i128::from(*a) == *b,
        (toml::Value::Float(a), Value::Number(Number::Float(b))) => a.to_bits() == b.to_bits(),
        (toml::Value::Boolean(a), Value::Bool(b)) => a == b,
        (toml::Value::Datetime(a), Value::String(b)) => a.to_string() == *b,
        (toml::Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_as_written(x, y))
        }
        (toml::Value::Table(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, x)| b.get(key).is_some_and(|y| same_as_written(x, y)))
        }
        _ => false,
    }
}
