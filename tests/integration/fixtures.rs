//! The fixtures themselves: every token digest they store is one of
//! `support::tokens`, so that a token is defined once.

use std::path::Path;

use crate::support::policies::repo_path;
use crate::support::tokens::{ALL, digest};

/// Every `*.toml` under `dir`, recursively.
fn toml_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read fixtures") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            toml_files(&path, found);
        } else if path
            .extension()
            .is_some_and(|extension| extension == "toml")
        {
            found.push(path);
        }
    }
}

#[test]
fn every_digest_in_the_fixtures_is_a_known_token() {
    let known: Vec<String> = ALL.iter().map(|token| digest(token)).collect();
    let mut files = Vec::new();
    toml_files(&repo_path("tests/fixtures"), &mut files);
    let mut digests = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read fixture");
        for line in text.lines() {
            let Some(value) = line.trim().strip_prefix("sha256 = ") else {
                continue;
            };
            let value = value.trim_matches('"');
            assert!(
                known.iter().any(|digest| digest == value),
                "{}: {value} is the digest of no token in support::tokens",
                file.display()
            );
            digests += 1;
        }
    }
    assert!(
        digests >= 10,
        "only {digests} digests in {} files",
        files.len()
    );
}
