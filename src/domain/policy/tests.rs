use std::path::Path;

use super::*;

#[test]
fn embedded_default_loads() {
    let policy = Policy::embedded_default().unwrap();
    assert_eq!(policy.revision.len(), 12);
    assert!(!policy.tools.is_empty());
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (
            "[[pins]]\nserver = \"s\"\nfingerprint = \"xyz\"\n",
            "pins[0].fingerprint",
        ),
        ("[[pins]]\nserver = \"s\"\n", "pins[0].fingerprint"),
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"sometimes\"\n",
            "tools.t.approval",
        ),
        // No default for an execute tool's gate: a file cut after its
        // roles must not load as a tool that runs unapproved.
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\n",
            "tools.t.approval",
        ),
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"threshold\"\napprovers = [\"x\"]\n",
            "tools.t.threshold_argument",
        ),
        (
            "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { type = 12 }\n",
            "tools.t.input_schema",
        ),
        // JSON text with a key twice: serde_json kept the last copy, so the
        // bound the text shows first was never enforced.
        (
            "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = '{\"type\":\"object\",\"properties\":{\"n\":{\"maximum\":1}},\"properties\":{}}'\n",
            "tools.t.input_schema",
        ),
        (
            "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { \"$ref\" = \"https://example.com/s.json\" }\n",
            "tools.t.input_schema",
        ),
        ("[actors.a]\nprofile = \"missing\"\n", "actors.a.profile"),
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"never\"\nsensitive = [\"to\"]\neffect = { kind = \"set\", resource_argument = \"to\", value_argument = \"v\", resources = [\"*\"] }\n",
            "tools.t.sensitive",
        ),
        // A set names what it may change: its absence opens nothing.
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"never\"\neffect = { kind = \"set\", resource_argument = \"to\", value_argument = \"v\" }\n",
            "tools.t.effect.resources",
        ),
        (
            "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"never\"\neffect = { kind = \"set\", resource_argument = \"to\", value_argument = \"v\", resources = [] }\n",
            "tools.t.effect.resources",
        ),
        (
            "[state.resources]\nx = 1\n[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"never\"\neffect = { kind = \"set\", resource_argument = \"to\", value_argument = \"v\", resources = [\"*\", \"x\"] }\n",
            "tools.t.effect.resources",
        ),
        (
            "[limits]\npending_ttl_seconds = 0\n",
            "limits.pending_ttl_seconds",
        ),
        ("[limits]\nmax_state_bytes = 0\n", "limits.max_state_bytes"),
        (
            "[limits]\nreceipt_retention_seconds = 0\n",
            "limits.receipt_retention_seconds",
        ),
        (
            "[limits]\nmax_approval_argument_bytes = 2048\nmax_state_bytes = 1024\n",
            "limits.max_approval_argument_bytes",
        ),
        (
            "[[credentials]]\nkind = \"reviewer\"\nidentity = \"bob\"\nsha256 = \"00\"\n",
            "credentials[0].sha256",
        ),
        // Lifetimes are bounded: a grant of u64::MAX seconds never expires.
        (
            "[limits]\ngrant_ttl_seconds = 9223372036854775807\n",
            "limits.grant_ttl_seconds",
        ),
        (
            "[limits]\npending_ttl_seconds = 315360001\n",
            "limits.pending_ttl_seconds",
        ),
        (
            "[server]\nshutdown_grace_seconds = 0\n",
            "server.shutdown_grace_seconds",
        ),
        // The digest of the empty token, an empty actor or workspace.
        (
            "[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"*\"]\nsha256 = \"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"\n",
            "credentials[0].sha256",
        ),
        (
            "[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"\"]\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000001\"\n",
            "credentials[0].actors",
        ),
        (
            "[reviewers.r]\nroles = [\"x\"]\nworkspaces = [\"\"]\n",
            "reviewers.r.workspaces",
        ),
        // One client certificate, a host's and a reviewer's.
        (
            "[reviewers.alice]\nroles = [\"x\"]\nworkspaces = [\"*\"]\n\
             [[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"*\"]\nclient_identity = \"spiffe://a/agent\"\n\
             [[credentials]]\nkind = \"reviewer\"\nidentity = \"alice\"\nclient_identity = \"spiffe://a/agent\"\n",
            "credentials[1].client_identity",
        ),
        // A Check's actor or workspace from the header whose value the
        // client picks as its session id, or one header for both.
        (
            "[ext_authz]\nactor_header = \"mcp-session-id\"\n",
            "ext_authz.actor_header",
        ),
        (
            "[ext_authz]\nactor_claim = \"sub\"\nworkspace_header = \"mcp-session-id\"\n",
            "ext_authz.workspace_header",
        ),
        (
            "[ext_authz]\nactor_header = \"x-user\"\nworkspace_header = \"x-user\"\n",
            "ext_authz.workspace_header",
        ),
    ];
    for (text, key) in cases {
        let error = Policy::parse(text, "p.toml", None).unwrap_err();
        assert_eq!(error.key, key, "{text}: {error}");
    }
    let error = Policy::parse(
        "[[pins]]\nserver = \"s\"\nfingerprnt = \"xyz\"\n",
        "p.toml",
        None,
    )
    .unwrap_err();
    assert_eq!(error.message, "unknown key fingerprnt");
    assert_eq!(error.key, "pins[0]");
}

/// A valid base: one tool, an open host API.
const BASE: &str = "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\n[profiles.p]\nroles = [\"r\"]\n[actors.a]\nprofile = \"p\"\n[server]\nopen_host_api = true\n";

fn error_of(text: &str) -> (String, String) {
    let error = Policy::parse(text, "p.toml", None).unwrap_err();
    (error.key, error.message)
}

fn pair(key: &str, message: &str) -> (String, String) {
    (key.to_string(), message.to_string())
}

#[test]
fn decoding_errors_name_the_key_in_plain_words() {
    let cases = [
        (
            "[limits]\npending_ttl_seconds = \"300\"\n",
            pair(
                "limits.pending_ttl_seconds",
                "expected a non-negative integer, found the string \"300\"",
            ),
        ),
        (
            "[limits]\npending_ttl_seconds = -1\n",
            pair(
                "limits.pending_ttl_seconds",
                "expected a non-negative integer, found the integer -1",
            ),
        ),
        ("[limits]\nlimit = 3\n", pair("limits", "unknown key limit")),
        (
            "[tools.x]\nroles = [\"r\"]\n",
            pair("tools.x", "missing key mode"),
        ),
        (
            "[tools.x]\nmode = \"writ\"\nroles = [\"r\"]\n",
            pair(
                "tools.x.mode",
                "must be \"read\", \"propose\", \"execute\", \"forbidden\", not \"writ\"",
            ),
        ),
        (
            "[tools.x]\nmode = \"read\"\nroles = \"r\"\n",
            pair("tools.x.roles", "expected an array, found the string \"r\""),
        ),
        (
            // sha256 is optional since a client certificate may be the
            // credential (client_identity); one of the two is required.
            "[[credentials]]\nkind = \"reviewer\"\nidentity = \"b\"\n",
            pair(
                "credentials[0].sha256",
                "a credential needs a token digest (sha256), a client certificate identity \
                 (client_identity), or both",
            ),
        ),
        ("bogus = 1\n", pair("", "unknown key bogus")),
        (
            "[reviewers.bob]\nroles = [\"x\"]\n",
            pair("reviewers.bob", "missing key workspaces"),
        ),
        (
            "[tools.x]\nmode = \"read\"\nroles = [\"r\"]\neffect = { kind = \"set\", bogus = 1 }\n",
            pair("tools.x.effect", "unknown key bogus"),
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(error_of(&format!("{text}{BASE}")), expected, "{text}");
    }
    let (key, message) = error_of("[limits\n");
    assert_eq!(key, "line 1, column 8");
    assert_eq!(message, "unclosed table, expected `]`");
    let (key, message) =
        error_of("[server]\nopen_host_api = \"yes\"\n[tools.t]\nmode = \"read\"\n");
    assert_eq!(key, "server.open_host_api");
    assert_eq!(message, "expected true or false, found the string \"yes\"");
}

#[test]
fn schema_errors_give_the_pointer_inside_the_schema() {
    let tool = |schema: &str| {
        format!("[tools.x]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = {schema}\n{BASE}")
    };
    let cases = [
        (
            "{ type = 12 }",
            "invalid JSON Schema at /type: 12 is not valid under any of the schemas listed in the 'anyOf' keyword",
        ),
        (
            "{ properties = { x = { minimum = \"a\" } } }",
            "invalid JSON Schema at /properties/x/minimum: \"a\" is not of type \"number\"",
        ),
        (
            "{ properties = { x = { minimum = nan } } }",
            "at /properties/x/minimum: nan has no JSON form (nan and inf are refused)",
        ),
        (
            "{ allOf = [{ properties = { x = { \"$ref\" = \"https://example.com/s.json\" } } }] }",
            "invalid JSON Schema at /allOf/0/properties/x/$ref: cannot resolve \"https://example.com/s.json\": only references inside the schema (\"#/...\") are followed",
        ),
        (
            "'{\"type\": \"object\", \"properties\": {\"a/b\": {\"type\": 1}}}'",
            "invalid JSON Schema at /properties/a~1b/type: 1 is not valid under any of the schemas listed in the 'anyOf' keyword",
        ),
    ];
    for (schema, message) in cases {
        assert_eq!(
            error_of(&tool(schema)),
            pair("tools.x.input_schema", message),
            "{schema}"
        );
    }
}

#[test]
fn a_schema_keyword_the_validator_would_ignore_is_an_error_not_a_bound_left_out() {
    let tool = |schema: &str| {
        format!("[tools.x]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = {schema}\n{BASE}")
    };
    let unknown = "the validator would ignore it: it is no keyword of the schema's draft, \
                   so a misspelt bound would not be enforced (annotations of your own start \
                   with \"x-\")";
    let beside_ref = "the validator would ignore it: drafts before 2019-09 ignore every \
                      keyword beside \"$ref\" (put the reference and it in an allOf)";
    let draft7 = "\"$schema\": \"http://json-schema.org/draft-07/schema#\"";
    let nowhere = "which is no schema toolgate judged: a reference must lead from the root to \
                   a schema among the schema's own keywords (\"#\", \"#/...\", \"#anchor\")";
    let cases = [
        (
            "{ type = \"object\", additionalProperty = false }".to_string(),
            format!("\"additionalProperty\" is refused: {unknown}"),
        ),
        (
            "{ properties = { memo = { type = \"string\", maxLenght = 140 } } }".into(),
            format!("\"maxLenght\" at /properties/memo is refused: {unknown}"),
        ),
        (
            "{ anyOf = [{ required = [\"a\"] }, { requierd = [\"b\"] }] }".into(),
            format!("\"requierd\" at /anyOf/1 is refused: {unknown}"),
        ),
        (
            "'{\"$defs\": {\"a/b\": {\"not\": {\"minimun\": 1}}}}'".into(),
            format!("\"minimun\" at /$defs/a~1b/not is refused: {unknown}"),
        ),
        (
            "{ items = { additionalProperties = { patern = \"^a\" } } }".into(),
            format!("\"patern\" at /items/additionalProperties is refused: {unknown}"),
        ),
        // A keyword of a later draft is ignored under an earlier one.
        (
            format!("'{{{draft7}, \"dependentRequired\": {{\"a\": [\"b\"]}}}}'"),
            format!("\"dependentRequired\" is refused: {unknown}"),
        ),
        (
            "'{\"$schema\": \"http://json-schema.org/draft-04/schema#\", \"properties\": {\"a\": {\"const\": 1}}}'".into(),
            format!("\"const\" at /properties/a is refused: {unknown}"),
        ),
        (
            "{ \"$recursiveRef\" = \"#\" }".into(),
            format!("\"$recursiveRef\" is refused: {unknown}"),
        ),
        // Known keywords that would do nothing where they are.
        (
            format!("'{{{draft7}, \"definitions\": {{\"s\": {{\"type\": \"string\"}}}}, \"properties\": {{\"m\": {{\"$ref\": \"#/definitions/s\", \"maxLength\": 140}}}}}}'"),
            format!("\"maxLength\" at /properties/m is refused: {beside_ref}"),
        ),
        (
            "{ prefixItems = [{ type = \"string\" }], additionalItems = false }".into(),
            "\"additionalItems\" is refused: the validator would ignore it: it applies only beside a list of \"items\" (in 2020-12: \"items\" after \"prefixItems\")".into(),
        ),
        (
            "{ then = { required = [\"a\"] } }".into(),
            "\"then\" is refused: the validator would ignore it: it applies only beside \"if\"".into(),
        ),
        (
            "{ maxContains = 2 }".into(),
            "\"maxContains\" is refused: the validator would ignore it: it applies only beside \"contains\"".into(),
        ),
        // A reference must lead to a schema the walk judged.
        (
            "{ \"x-s\" = { type = \"string\", format = \"regex\" }, properties = { p = { \"$ref\" = \"#/x-s\" } } }".into(),
            format!("\"$ref\" at /properties/p is refused: it leads to \"#/x-s\", {nowhere}"),
        ),
        (
            "{ default = { maxLenght = 1 }, properties = { p = { \"$ref\" = \"#/default\" } } }".into(),
            format!("\"$ref\" at /properties/p is refused: it leads to \"#/default\", {nowhere}"),
        ),
        (
            "{ properties = { s = { \"$id\" = \"http://e/s\", \"$defs\" = { a = {} }, properties = { q = { \"$ref\" = \"#/$defs/a\" } } } } }".into(),
            "\"$id\" at /properties/s is refused: an id below the root moves the base of the references inside it, and toolgate judges references from the root".into(),
        ),
        (
            format!("'{{{draft7}, \"$defs\": [{{\"format\": \"regex\"}}]}}'"),
            "\"$defs\" is refused: it must be an object of schemas".into(),
        ),
        (
            "'{\"$schema\": \"https://json-schema.org/draft/2019-09/schema\", \"$defs\": {\"a\": {}}, \"properties\": {\"p\": {\"$recursiveRef\": \"#/$defs/a\"}}}'".into(),
            format!("\"$recursiveRef\" at /properties/p is refused: it leads to \"#/$defs/a\", {nowhere}"),
        ),
        (
            "{ \"$id\" = \"urn:root\", properties = { p = { \"$ref\" = \"urn:root\" } } }".into(),
            format!("\"$ref\" at /properties/p is refused: it leads to \"urn:root\", {nowhere}"),
        ),
        (
            "{ contentMediaType = \"application/json\", contentSchema = { maxLength = 3 } }".into(),
            "\"contentSchema\" is refused: the validator would ignore it: it is an annotation in 2019-09 and later: nothing in it is checked".into(),
        ),
        (
            "{ properties = { p = { type = \"string\", format = \"regex\" } } }".into(),
            "\"format\" at /properties/p is refused: toolgate does not check the \"regex\" format (its cost grows with the square of the argument's length): use \"pattern\" and \"maxLength\"".into(),
        ),
        (
            "{ properties = { a = { \"$schema\" = \"http://json-schema.org/draft-07/schema#\" } } }".into(),
            "\"$schema\" at /properties/a is refused: the validator would ignore it: the whole schema is read as its root's draft".into(),
        ),
    ];
    for (schema, message) in cases {
        assert_eq!(
            error_of(&tool(&schema)),
            pair("tools.x.input_schema", &message),
            "{schema}"
        );
    }
    // Names, data and the author's annotations are not keywords; drafts
    // before 2020-12 have theirs.
    let loads = [
        "{ properties = { maxLenght = { type = \"string\", \"x-widget\" = \"text\" } } }",
        "{ enum = [{ anything = 1 }], default = { nope = 2 }, examples = [{ nor = 3 }] }",
        "{ const = { whatever = true }, \"x-origin\" = { any = { thing = 1 } } }",
        "'{\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"definitions\": {\"a\": {\"type\": \"string\"}}, \"items\": [{\"$ref\": \"#/definitions/a\"}], \"additionalItems\": false, \"dependencies\": {\"a\": [\"b\"], \"c\": {\"required\": [\"d\"]}}, \"if\": {}, \"then\": {}, \"else\": {}, \"contentMediaType\": \"text/plain\"}'",
        "'{\"$schema\": \"http://json-schema.org/draft-06/schema#\", \"properties\": {\"a\": {\"$ref\": \"#/definitions/s\", \"title\": \"a\", \"description\": \"d\"}}, \"definitions\": {\"s\": {\"contentEncoding\": \"base64\"}}}'",
        "'{\"$schema\": \"https://json-schema.org/draft/2019-09/schema\", \"$recursiveAnchor\": true, \"properties\": {\"a\": {\"$recursiveRef\": \"#\"}}, \"dependentRequired\": {\"a\": [\"b\"]}, \"contains\": {}, \"minContains\": 1}'",
        "'{\"$schema\": \"http://json-schema.org/draft-04/schema#\", \"id\": \"urn:x\", \"maximum\": 3, \"exclusiveMaximum\": true}'",
        // References to schemas the walk judged: by pointer (escaped in the
        // URI or not), to the root, by anchor.
        "'{\"$defs\": {\"a b\": {\"type\": \"string\"}, \"n\": {\"$anchor\": \"named\", \"type\": \"integer\"}}, \"properties\": {\"p\": {\"$ref\": \"#/$defs/a%20b\"}, \"q\": {\"$ref\": \"#named\"}, \"r\": {\"items\": {\"$ref\": \"#\"}}}}'",
        "'{\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"definitions\": {\"a\": {\"$id\": \"#old\", \"type\": \"string\"}}, \"properties\": {\"p\": {\"$ref\": \"#old\"}}}'",
        "{ \"$id\" = \"urn:root\", \"$defs\" = { a = { type = \"string\" } }, properties = { p = { \"$ref\" = \"#/$defs/a\" } } }",
        // A format the validator does not know stays an annotation.
        "'{\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"properties\": {\"id\": {\"type\": \"string\", \"format\": \"uuid\"}, \"n\": {\"type\": \"integer\", \"format\": \"int32\"}}}'",
        "{ title = \"t\", description = \"d\", \"$comment\" = \"c\", deprecated = false, readOnly = false, writeOnly = false, format = \"email\", contentMediaType = \"text/plain\" }",
    ];
    for schema in loads {
        Policy::parse(&tool(schema), "p.toml", None)
            .unwrap_or_else(|error| panic!("{schema}: {error:?}"));
    }
}

#[test]
fn host_access_is_declared_and_empty_policies_are_errors() {
    let empty = "the policy is empty: it must declare its tools and how hosts authenticate";
    assert_eq!(error_of(""), pair("", empty));
    assert_eq!(error_of("# nothing\n\n"), pair("", empty));
    assert_eq!(
        error_of("[server]\nopen_host_api = true\n"),
        pair(
            "tools",
            "the policy defines no tools (is the file complete?)"
        )
    );
    assert_eq!(
        error_of(&BASE.replace("open_host_api = true", "")),
        pair(
            "credentials",
            "no host credential: declare one ([[credentials]] with kind = \"host\"), \
             or set [server] open_host_api = true to let any local client call the host API"
        )
    );
    let both = format!(
        "{BASE}[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"a\"]\nsha256 = \"{}\"\n",
        "0".repeat(64)
    );
    assert_eq!(
        error_of(&both),
        pair(
            "server.open_host_api",
            "cannot be true while [[credentials]] declares host credentials"
        )
    );
    let open = Policy::parse(BASE, "p.toml", None).unwrap();
    assert!(open.open_host_api);
    let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let anywhere: std::net::SocketAddr = "0.0.0.0:1".parse().unwrap();
    assert_eq!(open.check_listen(loopback), Ok(()));
    assert_eq!(
        open.check_listen(anywhere),
        Err(
            "refusing to serve an open host API ([server] open_host_api = true) \
             on the non-loopback address 0.0.0.0:1"
                .to_string()
        )
    );
}

#[test]
fn a_missing_file_is_named() {
    let error = Policy::load(Path::new("/nope.toml")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot read /nope.toml: No such file or directory (os error 2)"
    );
    let error = Policy::parse("[limits]\nlimit = 1\n", "p.toml", None).unwrap_err();
    assert_eq!(error.to_string(), "p.toml: limits: unknown key limit");
}

#[test]
fn dangling_names_are_warnings() {
    let text = format!(
        "{BASE}[tools.pay]\nmode = \"execute\"\nroles = [\"payer\"]\napproval = \"always\"\napprovers = [\"finance\"]\nserver = \"pay-server\"\n\
         [tools.set]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"never\"\neffect = {{ kind = \"set\", resource_argument = \"a\", value_argument = \"b\", resources = [\"*\"] }}\n\
         [reviewers.bob]\nroles = [\"support\"]\nworkspaces = [\"*\"]\n"
    );
    let policy = Policy::parse(&text, "p.toml", None).unwrap();
    let warnings: Vec<String> = policy.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "reviewers.bob: no reviewer credential in [[credentials]]: this reviewer cannot sign in",
            "tools.pay.approvers: no reviewer holds role \"finance\"",
            "tools.pay.roles: no actor holds role \"payer\"",
            "tools.pay.server: no [[pins]] entry for server \"pay-server\": the tool is denied manifest-unverified until a reviewer pins it",
            "tools.set.effect: sets a resource, but [state.resources] declares none",
        ]
    );
    assert!(
        Policy::parse(BASE, "p.toml", None)
            .unwrap()
            .warnings
            .is_empty()
    );
}

fn kinds_of(policy: &Policy) -> Vec<CredentialKind> {
    [CredentialKind::Host, CredentialKind::Reviewer]
        .into_iter()
        .filter(|kind| policy.has_credentials(*kind))
        .collect()
}

#[test]
fn a_reload_never_opens_the_door() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let fixture = std::fs::read_to_string(dir.join("decide.toml")).unwrap();
    let running = Policy::parse(&fixture, "decide.toml", Some(&dir)).unwrap();
    let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let kinds = kinds_of(&running);
    let refusal = |text: &str, listen| {
        let new = Policy::parse(text, "new.toml", Some(&dir)).unwrap();
        running.reload_refusal(&kinds, &new, &Serving::plain(listen))
    };
    // A real change is accepted.
    assert_eq!(
        refusal(
            &fixture.replace("max_decisions = 100\n", "max_decisions = 99\n"),
            loopback
        ),
        None
    );
    // Host credentials swapped for an open host API.
    let hosts_cut = fixture
        .split("[[credentials]]\nkind = \"host\"")
        .next()
        .unwrap();
    let reviewers = fixture
        .split("[[credentials]]")
        .skip(1)
        .filter(|entry| entry.contains("kind = \"reviewer\""))
        .map(|entry| format!("[[credentials]]{entry}"))
        .collect::<String>();
    let open = format!("{hosts_cut}{reviewers}\n[server]\nopen_host_api = true\n");
    assert_eq!(
        refusal(&open, loopback),
        Some(
            "the new policy has no host credential and the server has some: \
             a reload cannot remove every host credential (restart to do that)"
                .to_string()
        )
    );
    // Every reviewer credential gone (and the reviewers with them).
    let no_reviewers = fixture
        .split("[reviewers.alice]")
        .next()
        .unwrap()
        .to_string()
        + &fixture
            .split("[[credentials]]")
            .skip(1)
            .filter(|entry| entry.contains("kind = \"host\""))
            .map(|entry| format!("[[credentials]]{entry}"))
            .collect::<String>()
        + "[[pins]]\nserver = \"docs-search\"\nmanifest = \"../../examples/manifests/docs-search.json\"\n";
    assert_eq!(
        refusal(&no_reviewers, loopback),
        Some(
            "the new policy has no reviewer credential and the server has some: \
             a reload cannot remove every reviewer credential (restart to do that)"
                .to_string()
        )
    );
    // A reviewer whose credential vanished.
    let start = fixture
        .find("[[credentials]]\nkind = \"reviewer\"\nidentity = \"bob\"")
        .unwrap();
    let end = start + fixture[start + 1..].find("[[credentials]]").unwrap() + 1;
    let without_bob = format!("{}{}", &fixture[..start], &fixture[end..]);
    assert_eq!(
        refusal(&without_bob, loopback),
        Some(
            "the new policy adds a dangling name (a file cut short?): reviewers.bob: \
             no reviewer credential in [[credentials]]: this reviewer cannot sign in"
                .to_string()
        )
    );
    // A token that becomes another host's.
    let renamed = fixture.replace("identity = \"agent-host\"", "identity = \"agent-host-2\"");
    assert_eq!(
        refusal(&renamed, loopback),
        Some(
            "the new policy gives the token of host \"agent-host\" another identity: a \
             credential keeps what it is until a restart (give the changed one a new token)"
                .to_string()
        )
    );
    // A client certificate that becomes another host's.
    let certified = "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\n[profiles.p]\nroles = [\"r\"]\n\
        [actors.a]\nprofile = \"p\"\n[server.tls]\ncert = \"s.pem\"\nkey = \"s.key\"\n\
        client_ca = \"ca.pem\"\n[[credentials]]\nkind = \"host\"\nidentity = \"h\"\n\
        actors = [\"a\"]\nclient_identity = \"spiffe://x/h\"\n";
    let certified_running = Policy::parse(certified, "c.toml", None).unwrap();
    let moved = Policy::parse(
        &certified.replace("identity = \"h\"", "identity = \"h2\""),
        "c.toml",
        None,
    )
    .unwrap();
    let mutual = Serving {
        mutual_tls: true,
        ..Serving::plain(loopback)
    };
    assert_eq!(
        certified_running.reload_refusal(&kinds_of(&certified_running), &moved, &mutual),
        Some(
            "the new policy gives the client certificate of host \"h\" another identity: a \
             credential keeps what it is until a restart (give the changed one a new client \
             certificate)"
                .to_string()
        )
    );
    // An ext_authz listener's Checks carry no token: the policy names the
    // host credential they act as, and where the actor comes from.
    let ext_authz = Serving {
        ext_authz_listener: true,
        ..Serving::plain(loopback)
    };
    let unchanged = Policy::parse(&fixture, "new.toml", Some(&dir)).unwrap();
    let refused = running.reload_refusal(&kinds, &unchanged, &ext_authz);
    assert!(
        refused
            .as_deref()
            .is_some_and(|refused| refused
                .starts_with("--ext-authz-listen needs [ext_authz] host_credential")),
        "{refused:?}"
    );
    // [server] changed: it applies at start only.
    let mtls = fixture.clone()
        + "\n[server.tls]\ncert = \"s.pem\"\nkey = \"s.key\"\nclient_ca = \"ca.pem\"\n";
    assert_eq!(
        refusal(&mtls, loopback),
        Some(
            "the new policy changes [server] (tls): [server] applies at start only; \
             restart to change it"
                .to_string()
        )
    );
    let tuned = fixture.clone() + "\n[server]\nmax_connections = 7\nshutdown_grace_seconds = 3\n";
    assert_eq!(
        refusal(&tuned, loopback),
        Some(
            "the new policy changes [server] (shutdown_grace_seconds, max_connections): \
             [server] applies at start only; restart to change it"
                .to_string()
        )
    );
    // An open host API, on a server without host credentials, off loopback.
    let tickets_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let tickets = std::fs::read_to_string(tickets_dir.join("tickets.toml")).unwrap();
    let open_running = Policy::parse(&tickets, "tickets.toml", None).unwrap();
    let anywhere: std::net::SocketAddr = "0.0.0.0:1".parse().unwrap();
    assert_eq!(
        open_running.reload_refusal(
            &kinds_of(&open_running),
            &open_running,
            &Serving::plain(anywhere)
        ),
        Some(
            "refusing to serve an open host API ([server] open_host_api = true) \
             on the non-loopback address 0.0.0.0:1"
                .to_string()
        )
    );
}

/// Every prefix of `text` that ends before a line starting with `[`.
pub(crate) fn cuts(text: &str) -> Vec<String> {
    let mut cuts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with('[') {
            cuts.push(text[..offset].to_string());
        }
        offset += line.len();
    }
    cuts
}

#[test]
fn a_file_cut_at_any_section_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    for relative in [
        "examples/policy.toml",
        "examples/tickets.toml",
        "tests/fixtures/decide.toml",
        "tests/fixtures/hostile.toml",
    ] {
        let path = root.join(relative);
        let dir = path.parent().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let full = Policy::parse(&text, relative, Some(dir)).unwrap();
        let cuts = cuts(&text);
        assert!(cuts.len() >= 8, "{relative}");
        for cut in cuts {
            let at = cut.lines().count();
            match Policy::parse(&cut, relative, Some(dir)) {
                Err(_) => {}
                Ok(truncated) => {
                    let added = truncated
                        .warnings
                        .iter()
                        .any(|warning| !full.warnings.contains(warning));
                    assert!(added, "{relative} cut after line {at}: no new warning");
                    assert!(
                        full.reload_refusal(
                            &kinds_of(&full),
                            &truncated,
                            &Serving::plain(loopback)
                        )
                        .is_some(),
                        "{relative} cut after line {at}: reload accepted"
                    );
                }
            }
        }
    }
}

/// A file cut at any line (a SIGHUP racing a write in place) never loads
/// an execute tool with a weaker approval rule than the whole file gives it.
#[test]
fn a_file_cut_at_any_line_never_loosens_an_approval() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for relative in ["examples/policy.toml", "examples/tickets.toml"] {
        let path = root.join(relative);
        let text = std::fs::read_to_string(&path).unwrap();
        let full = Policy::parse(&text, relative, path.parent()).unwrap();
        let gated: Vec<&str> = full
            .tools
            .values()
            .filter(|tool| tool.approval != ApprovalRule::Never)
            .map(|tool| tool.name.as_str())
            .collect();
        assert!(!gated.is_empty(), "{relative}");
        let mut end = 0;
        for line in text.split_inclusive('\n') {
            end += line.len();
            let Ok(truncated) = Policy::parse(&text[..end], relative, path.parent()) else {
                continue;
            };
            for name in &gated {
                if let Some(tool) = truncated.tools.get(*name) {
                    assert_eq!(
                        tool.approval, full.tools[*name].approval,
                        "{relative} cut at byte {end}: tools.{name}.approval"
                    );
                }
            }
        }
    }
}

#[test]
fn a_file_cut_anywhere_never_panics_the_loader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for relative in ["examples/policy.toml", "tests/fixtures/hostile.toml"] {
        let path = root.join(relative);
        let text = std::fs::read_to_string(&path).unwrap();
        for end in (0..text.len()).step_by(17) {
            if text.is_char_boundary(end) {
                // Errors or not, the loader answers.
                let _ = Policy::parse(&text[..end], relative, path.parent());
            }
        }
    }
}

#[test]
fn the_postgresql_pool_and_its_limits_are_read_and_bounded() {
    let policy = Policy::parse(
        &format!(
            "{BASE}postgres_pool_size = 5\npostgres_lock_timeout_ms = 2500\n\
             postgres_statement_timeout_ms = 60000\n"
        ),
        "p.toml",
        None,
    )
    .unwrap();
    let settings = policy.server.postgres;
    assert_eq!(settings.pool_size, 5);
    assert_eq!(
        settings.lock_timeout,
        std::time::Duration::from_millis(2500)
    );
    assert_eq!(
        settings.statement_timeout,
        std::time::Duration::from_secs(60)
    );
    // What is not given keeps its default.
    assert_eq!(
        settings.turn_idle_timeout,
        PostgresSettings::default().turn_idle_timeout
    );
    let cases = [
        (
            "postgres_pool_size = 0",
            pair("server.postgres_pool_size", "must be greater than 0"),
        ),
        (
            "postgres_pool_size = 65",
            pair("server.postgres_pool_size", "must be at most 64"),
        ),
        (
            "postgres_pool_wait_timeout_ms = 0",
            pair(
                "server.postgres_pool_wait_timeout_ms",
                "must be greater than 0",
            ),
        ),
        (
            "postgres_turn_idle_timeout_ms = 2147483648",
            pair(
                "server.postgres_turn_idle_timeout_ms",
                "must be at most 2147483647 (24 days)",
            ),
        ),
        // Past an `Instant`'s range, hyper's keep-alive panicked.
        (
            "http2_keepalive_interval_seconds = 9223372036854775807",
            pair(
                "server.http2_keepalive_interval_seconds",
                "must be at most 86400 (a day)",
            ),
        ),
        (
            "http2_keepalive_timeout_seconds = 86401",
            pair(
                "server.http2_keepalive_timeout_seconds",
                "must be at most 86400 (a day)",
            ),
        ),
        // Past tokio's semaphore's bound, the start panicked.
        (
            "max_concurrent_requests = 4611686018427387904",
            pair("server.max_concurrent_requests", "must be at most 1048576"),
        ),
        (
            "max_message_bytes = 67108865",
            pair(
                "server.max_message_bytes",
                "must be at most 67108864 (64 MiB)",
            ),
        ),
        (
            "read_timeout_ms = 0",
            pair("server.read_timeout_ms", "must be greater than 0"),
        ),
    ];
    for (line, expected) in cases {
        assert_eq!(error_of(&format!("{BASE}{line}\n")), expected, "{line}");
    }
}
