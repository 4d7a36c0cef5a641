//! Every bearer token the tests present. Policies store only a token's
//! SHA-256 ([`digest`]); `fixtures::every_digest_in_the_fixtures_is_a_known_token`
//! checks that each digest in `tests/fixtures/` is one of these.

use sha2::{Digest, Sha256};

/// Host `agent-host` of `decide.toml` and `hostile.toml` (and host `h` of
/// `roomy.toml`).
pub const HOST: &str = "host-secret";
/// Host `other-host`, which may assert only actor `someone-else`.
pub const OTHER_HOST: &str = "other-host-secret";
/// Reviewer `alice`: finance-approver in acme (`decide.toml`); the reviewer
/// of most small policies.
pub const ALICE: &str = "alice-secret";
/// Reviewer `bob`: support-lead, approves nothing.
pub const BOB: &str = "bob-secret";
/// Reviewer `carol`: finance-approver everywhere (and an actor).
pub const CAROL: &str = "carol-secret";
/// Reviewer `dave`: finance-approver in globex.
pub const DAVE: &str = "dave-secret";
/// The reviewer of `examples/tickets.toml` (and of `torture.toml`).
pub const EXAMPLE_REVIEWER: &str = "example-reviewer-token";
/// The host of the spawned floods' policies.
pub const FLOOD_HOST: &str = "flood-host-secret";
/// Hosts `host-a` and `host-b` of `two_hosts.toml`.
pub const HOST_A: &str = "host-a-secret";
pub const HOST_B: &str = "host-b-secret";
/// Reviewer `lead` of `budget.toml`.
pub const BUDGET_REVIEWER: &str = "budget-reviewer-secret";
/// Reviewer `erin`, added to `decide.toml` by a test.
pub const ERIN: &str = "erin-secret";

pub const ALL: [&str; 12] = [
    HOST,
    OTHER_HOST,
    ALICE,
    BOB,
    CAROL,
    DAVE,
    EXAMPLE_REVIEWER,
    FLOOD_HOST,
    HOST_A,
    HOST_B,
    BUDGET_REVIEWER,
    ERIN,
];

/// What a policy stores of `token`: its SHA-256, in lower-case hex.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}
