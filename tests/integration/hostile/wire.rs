//! Protobuf no generated client can send: wrong wire types, invalid
//! UTF-8, truncation, unknown fields.

use super::*;

/// Wrong wire types, invalid UTF-8, truncation, unknown fields.
pub(super) fn wire_cases(fx: &Fixture) -> Vec<Case> {
    use pb::Outcome::{Allow, Deny};
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    // Protobuf that cannot be decoded is INVALID_ARGUMENT, as the proto
    // promises, with the field path where decoding failed (tonic alone
    // would answer INTERNAL).
    let valid_session = payer().encode_to_vec();
    let decide_path = "/toolgate.v1.PolicyDecisionPoint/Decide";
    let raw_decide = |body: Vec<u8>| Call::Raw {
        token: HOST,
        path: decide_path,
        body,
        answer: RawAnswer::Decide,
    };
    add(case(
        "session sent as a varint",
        raw_decide(wire_varint(1, 7)),
        invalid("session", "invalid wire type"),
    ));
    let mut bad_utf8 = read(r#"{"account":"X"}"#).encode_to_vec();
    let position = bad_utf8
        .iter()
        .position(|byte| *byte == b'X')
        .expect("marker");
    bad_utf8[position] = 0xff;
    add(case(
        "arguments text that is not UTF-8",
        raw_decide([wire_bytes(1, &valid_session), wire_bytes(2, &bad_utf8)].concat()),
        invalid("proposal.arguments_json", "not UTF-8"),
    ));
    let mut bad_actor = session("pXyer", "s-base", "acme").encode_to_vec();
    let position = bad_actor
        .iter()
        .position(|byte| *byte == b'X')
        .expect("marker");
    bad_actor[position] = 0xc0;
    add(case(
        "session actor that is not UTF-8",
        raw_decide(
            [
                wire_bytes(1, &bad_actor),
                wire_bytes(2, &read("{}").encode_to_vec()),
            ]
            .concat(),
        ),
        invalid("session.actor", "not UTF-8"),
    ));
    let mut truncated = wire_bytes(1, &valid_session);
    truncated.truncate(truncated.len() - 3);
    add(case(
        "a truncated message",
        raw_decide(truncated),
        invalid("session", "buffer underflow"),
    ));
    add(case(
        "a length prefix larger than the message",
        raw_decide([vec![0x0a], vec![0xff, 0xff, 0xff, 0x7f], b"abc".to_vec()].concat()),
        invalid("session", "buffer underflow"),
    ));
    add(case(
        "page size sent as a string",
        Call::Raw {
            token: CAROL,
            path: "/toolgate.v1.Approvals/ListApprovals",
            body: wire_bytes(4, b"500"),
            answer: RawAnswer::List,
        },
        invalid("page_size", "invalid wire type"),
    ));
    // Unknown fields are skipped by protobuf and never trusted: a proposal
    // with an extra `approved = true` field and an extra `reviewer` string is
    // still the proposal it was.
    add(case(
        "unknown fields claiming approval are ignored",
        raw_decide({
            // Same call id and fingerprint as the granted proposal: the
            // answer is the ledger's, not the extra fields'.
            let mut granted = ticket("c-t2", 1, "sensor", "done").encode_to_vec();
            granted.extend(wire_varint(15, 1));
            [wire_bytes(1, &valid_session), wire_bytes(2, &granted)].concat()
        }),
        Expect::Decide {
            outcome: Allow,
            reason: "approved",
            approval_id: Some(fx.granted.clone()),
        },
    ));
    add(charged(
        true,
        case(
            "unknown fields on an actor mismatch charge the call and change nothing else",
            raw_decide({
                let mut other = proposal("c-t7", "carol", "set_ticket", 1, "{}").encode_to_vec();
                other.extend(wire_bytes(16, b"alice"));
                [
                    wire_bytes(1, &valid_session),
                    wire_bytes(2, &other),
                    wire_bytes(7, b"granted"),
                ]
                .concat()
            }),
            answer(Deny, "forbidden"),
        ),
    ));
    cases
}

section_test!(wire, wire_cases, Before::Fixture);
