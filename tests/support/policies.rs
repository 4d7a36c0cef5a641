//! Policies: the fixture files of `tests/fixtures/policies/`, the
//! repository's own policy files, and the text helpers the tests build
//! variants with.

use std::path::{Path, PathBuf};

use super::Policy;

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// `tests/fixtures/decide.toml`: the policy of the Decide, ledger and
/// reviewer tests (and of the Python flows).
pub const DECIDE: &str = "tests/fixtures/decide.toml";
/// `tests/fixtures/hostile.toml`: the policy of the hostile-input suite.
pub const HOSTILE: &str = "tests/fixtures/hostile.toml";
/// `examples/tickets.toml`: the two-ticket exercise.
pub const TICKETS: &str = "examples/tickets.toml";

/// The text of `tests/fixtures/policies/<name>.toml`.
pub fn policy_text(name: &str) -> String {
    let path = repo_path("tests/fixtures/policies").join(format!("{name}.toml"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

/// `tests/fixtures/policies/<name>.toml` with `values` set, each at a
/// dotted key path (`limits.max_sessions`), the tables on the way made
/// when missing: how a test states the numbers its assertions depend on.
pub fn policy_with(name: &str, values: &[(&str, toml::Value)]) -> String {
    let mut table: toml::Table = policy_text(name)
        .parse()
        .unwrap_or_else(|error| panic!("{name}.toml is not TOML: {error}"));
    for (path, value) in values {
        let mut keys: Vec<&str> = path.split('.').collect();
        let last = keys.pop().expect("a key");
        let mut at = &mut table;
        for key in keys {
            at = at
                .entry(key)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap_or_else(|| panic!("{path}: {key} is not a table"));
        }
        at.insert(last.to_string(), value.clone());
    }
    toml::to_string(&table).expect("a TOML table prints")
}

/// An integer for [`policy_with`].
pub fn integer<N: TryInto<i64>>(value: N) -> toml::Value {
    match value.try_into() {
        Ok(value) => toml::Value::Integer(value),
        Err(_) => panic!("not a TOML integer"),
    }
}

/// Parses policy text as [`super::TestServer::start`] does: relative paths
/// in it resolve against the repository root.
pub fn parse(text: &str) -> Policy {
    Policy::parse(text, "test-policy.toml", Some(&repo_path(""))).expect("test policy is valid")
}

/// A repository policy file's text with its manifest paths made absolute,
/// so that a copy anywhere (a temporary file, a string) still finds them.
pub fn portable(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .expect("policy file")
        .replace(
            "manifest = \"../../examples/",
            &format!("manifest = \"{}/", repo_path("examples").display()),
        )
}

/// `tests/fixtures/decide.toml` (made portable) followed by `extra`, a
/// `[server]` section, say.
pub fn decide_text(extra: &str) -> String {
    format!("{}\n{extra}\n", portable(DECIDE))
}

/// alice's `[[credentials]]` entry in `decide.toml`, for tests that reload
/// the policy without it.
pub const DECIDE_ALICE_CREDENTIAL: &str = "[[credentials]]\nkind = \"reviewer\"\nidentity = \"alice\"\nsha256 = \"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376\"\n";

/// `tests/fixtures/decide.toml` followed by `extra`, as a policy.
pub fn decide_policy(extra: &str) -> Policy {
    parse(&decide_text(extra))
}

/// Every prefix of `text` that ends before a line starting with `[`: the
/// file cut at each of its sections.
pub fn section_cuts(text: &str) -> Vec<String> {
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

/// A `[[pins]]` entry of `docs-search` on the example manifest.
pub fn docs_search_pin() -> String {
    format!(
        "\n[[pins]]\nserver = \"docs-search\"\nmanifest = \"{}\"\n",
        repo_path("examples/manifests/docs-search.json").display()
    )
}
