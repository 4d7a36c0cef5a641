//! The embedded default policy's reviewer token: that policy declares a
//! reviewer ([`REVIEWER`]) but no credential for it, so `toolgate serve`
//! without a policy file makes a random token, valid until exit, and
//! prints it once.

use rand::RngCore;

use crate::domain::canonical::Fingerprint;
use crate::domain::policy::{Credential, CredentialKind};
use crate::engine::Engine;

/// The embedded default policy's reviewer.
pub const REVIEWER: &str = "admin";

/// When `engine` has no reviewer credential: makes a random token for
/// [`REVIEWER`], registers its digest (a runtime credential, never in a
/// policy file) and returns the token. `None` when a reviewer credential
/// exists. The caller shows the token to the operator; it never goes
/// through tracing.
pub fn reviewer_token(engine: &Engine) -> Option<String> {
    if engine.has_credentials(CredentialKind::Reviewer) {
        return None;
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!("tgr_{}", hex::encode(bytes));
    engine.add_runtime_credential(
        Fingerprint::of_bytes(token.as_bytes()),
        Credential {
            kind: CredentialKind::Reviewer,
            identity: REVIEWER.to_string(),
            actors: Vec::new(),
            client_identity: None,
        },
    );
    Some(token)
}
