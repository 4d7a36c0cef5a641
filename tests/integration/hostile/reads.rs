//! Hostile resource and session reads.

use super::*;

/// GetResource and GetSession with bad names and ids.
pub(super) fn resources_and_sessions_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    let resource = |name: String| {
        Call::GetResource(
            HOST,
            pb::GetResourceRequest {
                name,
                ..Default::default()
            },
        )
    };
    add(case(
        "resource with an empty name",
        resource(String::new()),
        invalid("name", "must be 1 to 64 bytes"),
    ));
    add(case(
        "resource with a 65-byte name",
        resource("r".repeat(65)),
        invalid("name", "must be 1 to 64 bytes"),
    ));
    add(case(
        "unknown resource",
        resource(format!("l{CYRILLIC_A}mp")),
        error(Code::NotFound, "no resource"),
    ));
    let get_session = |session_id: &str| {
        Call::GetSession(
            HOST,
            pb::GetSessionRequest {
                session_id: session_id.to_string(),
            },
        )
    };
    add(case(
        "session id with a look-alike",
        get_session(&format!("s-b{CYRILLIC_A}se")),
        invalid("session_id", "must match"),
    ));
    add(case(
        "get session with an empty id",
        get_session(""),
        invalid("session_id", "must not be empty"),
    ));
    add(case(
        "unknown session",
        get_session("s-nobody"),
        error(Code::NotFound, "no session"),
    ));
    cases
}

section_test!(
    resources_and_sessions,
    resources_and_sessions_cases,
    Before::Fixture
);
