//! Calls on `tests/fixtures/policies/recovery.toml` (`set_item` always needs
//! approval; `post` appends to the queue `queue` without), for the tests
//! that run `toolgate serve` processes on one store.

use super::spawn::Spawned;
use super::{pb, proposal, session};

pub const RECOVERY: &str = "tests/fixtures/policies/recovery.toml";

/// Sets the resource `note` (needs approval).
pub fn set_note(call_id: &str, value: &str) -> pb::Proposal {
    let arguments = serde_json::json!({ "item": "note", "value": value }).to_string();
    proposal(call_id, "agent", "set_item", 0, &arguments)
}

/// Appends `text` to the queue `queue` at `version` (no approval).
pub fn post(call_id: &str, version: u64, text: &str) -> pb::Proposal {
    let arguments = serde_json::json!({ "text": text }).to_string();
    proposal(call_id, "agent", "post", version, &arguments)
}

/// Decide of `call` in session `s1` of `agent`.
pub async fn decide(server: &Spawned, call: &pb::Proposal) -> pb::DecideResponse {
    let request = super::decide_request(session("agent", "s1", "w"), call.clone());
    server
        .pdp()
        .await
        .decide(request)
        .await
        .expect("Decide answers")
        .into_inner()
}

/// Dispatch of `call` in session `s1` of `agent`.
pub async fn dispatch(
    server: &Spawned,
    call: &pb::Proposal,
) -> Result<pb::DispatchResponse, tonic::Status> {
    let request = super::dispatch_request(session("agent", "s1", "w"), call.clone());
    server
        .pdp()
        .await
        .dispatch(request)
        .await
        .map(tonic::Response::into_inner)
}
