//! Hostile Decide requests: envelopes, identifiers, sizes, versions and
//! argument texts (SPEC §1, §2, §4).

use super::*;

/// Decide with a session, a proposal or one of their fields missing.
pub(super) fn missing_fields_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "decide without session",
        Call::Decide(
            HOST,
            pb::DecideRequest {
                session: None,
                proposal: Some(read("{}")),
            },
        ),
        invalid("session", "is required"),
    ));
    add(case(
        "decide without proposal",
        Call::Decide(
            HOST,
            pb::DecideRequest {
                session: Some(payer()),
                proposal: None,
            },
        ),
        invalid("proposal", "is required"),
    ));
    add(case(
        "decide with an empty request: session is named first",
        Call::Decide(HOST, pb::DecideRequest::default()),
        invalid("session", "is required"),
    ));
    add(case(
        "empty session actor",
        decide(session("", "s-base", "acme"), read("{}")),
        invalid("session.actor", "must not be empty"),
    ));
    add(case(
        "empty session id",
        decide(session("payer", "", "acme"), read("{}")),
        invalid("session.session_id", "must not be empty"),
    ));
    add(case(
        "empty workspace",
        decide(session("payer", "s-base", ""), read("{}")),
        invalid("session.workspace", "must not be empty"),
    ));
    add(case(
        "empty call id",
        by_payer("", "read_balance", 0, "{}"),
        invalid("proposal.call_id", "must not be empty"),
    ));
    add(case(
        "empty tool name",
        by_payer("c-new", "", 0, "{}"),
        invalid("proposal.name", "must not be empty"),
    ));
    add(case(
        "empty arguments text",
        decide(payer(), read("")),
        invalid("proposal.arguments_json", "invalid-json"),
    ));
    cases
}

section_test!(missing_fields, missing_fields_cases, Before::Fixture);

/// Unicode look-alikes and odd characters in identifiers.
pub(super) fn identifiers_cases(_fx: &Fixture) -> Vec<Case> {
    use pb::Outcome::Deny;
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    let cyrillic_payer = format!("p{CYRILLIC_A}yer");
    add(case(
        "cyrillic а in session actor",
        decide(session(&cyrillic_payer, "s-base", "acme"), read("{}")),
        invalid("session.actor", "must match"),
    ));
    add(case(
        "cyrillic а in workspace",
        decide(
            session("payer", "s-base", &format!("{CYRILLIC_A}cme")),
            read("{}"),
        ),
        invalid("session.workspace", "must start with an ASCII letter"),
    ));
    add(case(
        "fullwidth ｐ in session actor",
        decide(session("\u{ff50}ayer", "s-base", "acme"), read("{}")),
        invalid("session.actor", "must start with an ASCII letter"),
    ));
    add(case(
        "space in session id",
        decide(session("payer", "s base", "acme"), read("{}")),
        invalid("session.session_id", "must match"),
    ));
    add(case(
        "41-character workspace",
        decide(session("payer", "s-base", &"w".repeat(41)), read("{}")),
        invalid("session.workspace", "at most 40"),
    ));
    add(case(
        "cyrillic а in proposal actor",
        decide(
            payer(),
            proposal("c-new", &cyrillic_payer, "read_balance", 0, "{}"),
        ),
        invalid("proposal.actor", "must match"),
    ));
    add(case(
        "cyrillic а in call id",
        by_payer(&format!("c-{CYRILLIC_A}"), "read_balance", 0, "{}"),
        invalid("proposal.call_id", "must match"),
    ));
    add(case(
        "right-to-left override in call id",
        by_payer("c\u{202e}1", "read_balance", 0, "{}"),
        invalid("proposal.call_id", "must match"),
    ));
    add(case(
        "call id starting with a digit",
        by_payer("1c", "read_balance", 0, "{}"),
        invalid("proposal.call_id", "must start with an ASCII letter"),
    ));
    add(case(
        "cyrillic е in tool name",
        by_payer("c-new", &format!("r{CYRILLIC_E}ad_balance"), 0, "{}"),
        invalid("proposal.name", "must match"),
    ));
    add(case(
        "zero-width space in tool name",
        by_payer("c-new", "read\u{200b}_balance", 0, "{}"),
        invalid("proposal.name", "must match"),
    ));
    add(case(
        "NUL in tool name",
        by_payer("c-new", "read_balance\u{0}", 0, "{}"),
        invalid("proposal.name", "must match"),
    ));
    add(charged(
        true,
        case(
            "tool name in another case is another (unknown) tool",
            by_payer("c-new", "Read_Balance", 0, "{}"),
            answer(Deny, "unknown-tool"),
        ),
    ));
    cases
}

section_test!(identifiers, identifiers_cases, Before::Fixture);

/// Identifiers and arguments past their sizes, and past the message limit.
pub(super) fn sizes_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "512 KiB call id",
        by_payer(&"c".repeat(512 * 1024), "read_balance", 0, "{}"),
        invalid("proposal.call_id", "at most 40"),
    ));
    add(case(
        "1 MiB call id: over the message limit",
        by_payer(&"c".repeat(MIB), "read_balance", 0, "{}"),
        error(Code::ResourceExhausted, "too large"),
    ));
    add(case(
        "1 MiB string argument: over the message limit",
        decide(payer(), read(&account(&format!("\"{}\"", "a".repeat(MIB))))),
        error(Code::ResourceExhausted, "too large"),
    ));
    let just_over = MAX_ARGUMENTS_BYTES + 1 - r#"{"account":""}"#.len();
    add(case(
        "arguments one byte over 256 KiB",
        decide(
            payer(),
            read(&account(&format!("\"{}\"", "a".repeat(just_over)))),
        ),
        invalid("proposal.arguments_json", "at most 262144 bytes"),
    ));
    // The bound is the canonical text's, as a Check's: 45,000 DEL
    // characters are 45 KB sent and 270 KB canonical (each `\u007f`).
    add(case(
        "arguments whose canonical text is over 256 KiB",
        decide(
            payer(),
            read(&account(&format!("\"{}\"", "\u{7f}".repeat(45_000)))),
        ),
        invalid(
            "proposal.arguments_json",
            "at most 262144 bytes (canonical JSON)",
        ),
    ));

    add(case(
        "1,000-character memo against maxLength 140",
        by_payer(
            "c-new",
            "payment_execute",
            0,
            &format!(
                r#"{{"amount":5,"account_number":"12345678","memo":"{}"}}"#,
                "m".repeat(1_000)
            ),
        ),
        invalid("proposal.arguments.memo", "fails the input schema"),
    ));
    cases
}

section_test!(sizes, sizes_cases, Before::Fixture);

/// Versions past 2^53, and 2^53 itself.
pub(super) fn versions_cases(_fx: &Fixture) -> Vec<Case> {
    use pb::Outcome::Deny;
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "version 2^53 + 1",
        by_payer("c-new", "read_balance", (1 << 53) + 1, "{}"),
        invalid("proposal.version", "at most 2^53"),
    ));
    add(case(
        "version u64::MAX",
        by_payer("c-new", "read_balance", u64::MAX, "{}"),
        invalid("proposal.version", "at most 2^53"),
    ));
    add(case(
        "version exactly 2^53 is valid (then DENY for the claimed actor)",
        decide(
            payer(),
            proposal("c-new", "carol", "read_balance", 1 << 53, "{}"),
        ),
        answer(Deny, "forbidden"),
    ));
    cases
}

section_test!(versions, versions_cases, Before::NewCallDecided);

/// Arguments that are not one JSON object.
pub(super) fn arguments_not_an_object_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    for (name, text, rule) in [
        (
            "arguments are an array",
            "[]",
            "must be a JSON object, got array",
        ),
        ("arguments are null", "null", "must be a JSON object"),
        ("arguments are a string", r#""{}""#, "must be a JSON object"),
        ("trailing data after the object", "{} {}", "invalid-json"),
        ("single-quoted keys", "{'account':'a'}", "invalid-json"),
        ("trailing comma", r#"{"account":"a",}"#, "invalid-json"),
        ("a comment", "{/* approved */}", "invalid-json"),
        ("a byte-order mark", "\u{feff}{}", "invalid-json"),
        (
            "raw control character in a string",
            "{\"account\":\"a\u{1}b\"}",
            "invalid-json",
        ),
        ("unterminated object", r#"{"account":"a""#, "invalid-json"),
    ] {
        add(case(
            name,
            decide(payer(), read(text)),
            invalid("proposal.arguments_json", rule),
        ));
    }
    cases
}

section_test!(
    arguments_not_an_object,
    arguments_not_an_object_cases,
    Before::Fixture
);

/// Duplicate keys, however spelled and however deep.
pub(super) fn duplicate_keys_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    for (name, text) in [
        ("duplicate keys", r#"{"account":"a","account":"b"}"#),
        (
            "duplicate keys, one spelled with an escape",
            r#"{"account":"a","\u0061ccount":"b"}"#,
        ),
        (
            "duplicate keys in a nested object",
            r#"{"x":{"y":1,"y":2}}"#,
        ),
        (
            "duplicate keys deep in an array",
            r#"{"x":[1,[{"a":1,"b":2,"a":3}]]}"#,
        ),
    ] {
        add(case(
            name,
            decide(payer(), read(text)),
            invalid("proposal.arguments_json", "duplicate-key"),
        ));
    }
    add(case(
        "a key differing only in case from one the tool reads is refused",
        decide(payer(), read(r#"{"Account":"a","account":"b"}"#)),
        invalid("proposal.arguments", "only in case"),
    ));
    add(case(
        "cyrillic look-alike key is another key (closed schema refuses it)",
        decide(payer(), read(&format!(r#"{{"{CYRILLIC_A}ccount":"a"}}"#))),
        invalid("proposal.arguments", "fails the input schema"),
    ));
    cases
}

section_test!(duplicate_keys, duplicate_keys_cases, Before::Fixture);

/// Lone and misordered surrogates; a valid pair.
pub(super) fn surrogates_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    for (name, text) in [
        ("lone high surrogate", account(r#""\ud800""#)),
        ("lone low surrogate", account(r#""\udfff""#)),
        (
            "surrogates in the wrong order",
            account(r#""\udc00\ud800""#),
        ),
        ("lone surrogate in a key", r#"{"\ud800":1}"#.to_string()),
        (
            "high surrogate followed by a letter",
            account(r#""\ud800\u0041""#),
        ),
    ] {
        add(case(
            name,
            decide(payer(), read(&text)),
            invalid("proposal.arguments_json", "lone-surrogate"),
        ));
    }
    add(case(
        "a valid surrogate pair parses (then the pattern refuses it)",
        by_payer(
            "c-new",
            "payment_execute",
            0,
            r#"{"amount":5,"account_number":"\ud83d\ude00"}"#,
        ),
        invalid(
            "proposal.arguments.account_number",
            "fails the input schema",
        ),
    ));
    add(case(
        "arabic-indic digits do not pass [0-9]",
        by_payer(
            "c-new",
            "payment_execute",
            0,
            r#"{"amount":5,"account_number":"١٢٣٤٥٦٧٨"}"#,
        ),
        invalid(
            "proposal.arguments.account_number",
            "fails the input schema",
        ),
    ));
    cases
}

section_test!(surrogates, surrogates_cases, Before::Fixture);

/// Numbers that are not JSON, out of range, or at the limits.
pub(super) fn numbers_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    for (name, value) in [
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "-Infinity"),
        ("leading zero", "012"),
        ("hexadecimal", "0x10"),
        ("plus sign", "+1"),
    ] {
        add(case(
            format!("number {name}"),
            decide(payer(), read(&account(value))),
            invalid("proposal.arguments_json", "invalid-json"),
        ));
    }
    for (name, value) in [
        ("2^64", "18446744073709551616"),
        ("-2^63 - 1", "-9223372036854775809"),
        ("200 digits", &"9".repeat(200)),
        ("a double past f64::MAX", "1.8e308"),
        ("1e400", "1e400"),
        ("-1e400", "-1e400"),
    ] {
        add(case(
            format!("number {name} is out of range"),
            decide(payer(), read(&account(value))),
            invalid("proposal.arguments_json", "number-out-of-range"),
        ));
    }
    // At the limits the number parses, and the (string) schema refuses it:
    // the field is the argument, not the JSON text.
    for (name, value) in [
        ("2^64 - 1", "18446744073709551615"),
        ("-2^63", "-9223372036854775808"),
        ("f64::MAX", "1.7976931348623157e308"),
        ("the smallest subnormal", "5e-324"),
        ("-0", "-0"),
    ] {
        add(case(
            format!("number {name} is at the limit"),
            decide(payer(), read(&account(value))),
            invalid("proposal.arguments.account", "fails the input schema"),
        ));
    }
    add(case(
        "amount 1e309 overflows",
        decide(payer(), payment("c-new", 0, "1e309")),
        invalid("proposal.arguments_json", "number-out-of-range"),
    ));
    add(case(
        "amount -0.0 fails exclusiveMinimum 0",
        decide(payer(), payment("c-new", 0, "-0.0")),
        invalid("proposal.arguments.amount", "fails the input schema"),
    ));
    add(case(
        "amount as a string",
        decide(payer(), payment("c-new", 0, r#""15000""#)),
        invalid("proposal.arguments.amount", "fails the input schema"),
    ));
    cases
}

section_test!(numbers, numbers_cases, Before::Fixture);

/// Nesting at, past and far past the depth limit.
pub(super) fn nesting_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "nesting depth 64 parses (then the schema refuses the array)",
        decide(payer(), read(&nested(63))),
        invalid("proposal.arguments.account", "fails the input schema"),
    ));
    add(case(
        "nesting depth 65",
        decide(payer(), read(&nested(64))),
        invalid("proposal.arguments_json", "too-deep"),
    ));
    add(case(
        "nesting depth 100,000 (stack exhaustion attempt)",
        decide(payer(), read(&nested(100_000))),
        invalid("proposal.arguments_json", "too-deep"),
    ));
    add(case(
        "nesting depth 40,000 of objects (within 256 KiB)",
        decide(
            payer(),
            read(&format!(
                "{}{}",
                r#"{"a":"#.repeat(40_000),
                "}".repeat(40_000)
            )),
        ),
        invalid("proposal.arguments_json", "too-deep"),
    ));
    cases
}

section_test!(nesting, nesting_cases, Before::Fixture);

/// Ten thousand arguments.
pub(super) fn many_arguments_cases(_fx: &Fixture) -> Vec<Case> {
    use pb::Outcome::{Allow, Deny};
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "10,000 arguments to a manifest-gated tool: the gate answers first",
        by_payer("c-new", "search_docs", 0, &wide(10_000)),
        answer(Deny, "manifest-unverified"),
    ));
    add(charged(
        false,
        case(
            "10,000 arguments against an open schema: ALLOW, one decision charged, nothing stored",
            by_payer("c-wide", "open_read", 0, &wide(10_000)),
            answer(Allow, "allowed"),
        ),
    ));
    cases
}

section_test!(many_arguments, many_arguments_cases, Before::NewCallDecided);

/// The model's claims and forged fields in arguments.
pub(super) fn claims_in_arguments_cases(_fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "approved: true in the arguments is refused by the schema",
        by_payer(
            "c-new",
            "payment_execute",
            0,
            r#"{"amount":50000,"account_number":"12345678","approved":true,"reviewer":"alice"}"#,
        ),
        invalid("proposal.arguments", "fails the input schema"),
    ));
    add(case(
        "missing required argument",
        by_payer("c-new", "payment_execute", 0, r#"{"amount":5}"#),
        invalid("proposal.arguments", "fails the input schema"),
    ));
    cases
}

section_test!(
    claims_in_arguments,
    claims_in_arguments_cases,
    Before::Fixture
);

/// Refusals that are answers (gRPC OK) and change nothing.
pub(super) fn refusals_that_are_answers_cases(fx: &Fixture) -> Vec<Case> {
    use pb::Outcome::{Allow, Deny, RequireApproval};
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "proposal claims another actor",
        decide(payer(), proposal("c-new", "carol", "read_balance", 0, "{}")),
        answer(Deny, "forbidden"),
    ));
    add(case(
        "unknown tool with arguments its schema would refuse",
        by_payer("c-new", "no_such_tool", 0, &wide(100)),
        answer(Deny, "unknown-tool"),
    ));
    add(opening(case(
        "forbidden tool in a new session opens the session",
        decide(
            session("payer", "s-fresh", "acme"),
            proposal("c-new", "payer", "change_role", 0, "{}"),
        ),
        answer(Deny, "forbidden-tool"),
    )));
    add(opening(case(
        "actor without the tool's role",
        decide(guest(), guest_payment()),
        answer(Deny, "not-authorized"),
    )));
    add(case(
        "manifest-gated tool before any assessment",
        by_payer("c-new", "search_docs", 0, r#"{"query":"x"}"#),
        answer(Deny, "manifest-unverified"),
    ));
    add(case(
        "a decided call id with other arguments",
        by_payer("c-base", "read_balance", 0, r#"{"account":"a2"}"#),
        answer(Deny, "call-id-conflict"),
    ));
    add(case(
        "a decided call id again costs nothing",
        by_payer("c-base", "read_balance", 0, r#"{"account":"a1"}"#),
        answer(Allow, "allowed"),
    ));
    add(case(
        "a pending proposal again: the same request, no new one",
        decide(payer(), payment("c-pay", 0, "20000")),
        Expect::Decide {
            outcome: RequireApproval,
            reason: "approval-threshold-exceeded",
            approval_id: Some(fx.pending.clone()),
        },
    ));
    add(case(
        "a granted proposal: Decide reports it and consumes nothing",
        decide(payer(), ticket("c-t2", 1, "sensor", "done")),
        Expect::Decide {
            outcome: Allow,
            reason: "approved",
            approval_id: Some(fx.granted.clone()),
        },
    ));
    add(case(
        "a denied proposal stays denied",
        decide(payer(), payment("c-pay2", 1, "30000")),
        Expect::Decide {
            outcome: Deny,
            reason: "approval-denied",
            approval_id: Some(fx.denied.clone()),
        },
    ));
    add(case(
        "a session id claimed by another actor",
        decide(
            session("carol", "s-base", "acme"),
            proposal("c-new", "carol", "read_balance", 0, "{}"),
        ),
        invalid("session.actor", "runs as another actor"),
    ));
    add(case(
        "a session id moved to another workspace",
        decide(session("payer", "s-base", "globex"), read("{}")),
        invalid("session.workspace", "another workspace"),
    ));
    cases
}

section_test!(
    refusals_that_are_answers,
    refusals_that_are_answers_cases,
    Before::NewCallDecided
);

// The schema error's message embeds the offending instance (the jsonschema
// error's Display, src/proposal.rs `check_arguments`), unbounded: the
// INVALID_ARGUMENT trailers (grpc-message plus the base64 BadRequest detail
// carrying the same text) grow past the client's 16 KiB header-list limit
// and the host gets an HTTP/2 error instead of the field. A 1,000-character
// value still fits (in `sizes`); 5,000 characters do not.

#[tokio::test]
async fn ten_thousand_arguments_against_a_closed_schema() {
    assert_exact_and_unchanged(
        decide(payer(), read(&wide(10_000))),
        invalid("proposal.arguments", "fails the input schema"),
    )
    .await;
}

#[tokio::test]
async fn a_5000_character_memo_against_max_length_140() {
    assert_exact_and_unchanged(
        by_payer(
            "c-new",
            "payment_execute",
            0,
            &format!(
                r#"{{"amount":5,"account_number":"12345678","memo":"{}"}}"#,
                "m".repeat(5_000)
            ),
        ),
        invalid("proposal.arguments.memo", "fails the input schema"),
    )
    .await;
}

/// Decide, in payer's base session, payer's proposal of `tool`.
fn by_payer(call_id: &str, tool: &str, version: u64, arguments: &str) -> Call {
    decide(
        payer(),
        proposal(call_id, "payer", tool, version, arguments),
    )
}
