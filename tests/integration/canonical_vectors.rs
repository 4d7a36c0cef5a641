//! Runs every vector of `tests/fixtures/canonical_json.jsonl` (SPEC §1; made
//! from Python's `json` module by `tests/fixtures/make_canonical_vectors.py`)
//! against `canonical`: exact canonical bytes, SHA-256, or exact error kind.

use crate::support::canonical::{Fingerprint, canonicalize, fingerprint, parse, to_canonical};
use crate::support::policies::repo_path;

#[test]
fn canonical_json_vectors() {
    let path = repo_path("tests/fixtures/canonical_json.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => panic!(
            "cannot read canonical JSON vectors at {}: {e}",
            path.display()
        ),
    };

    let mut failures: Vec<String> = Vec::new();
    let mut checked = 0usize;
    let (mut ok_vectors, mut error_vectors) = (0usize, 0usize);

    for (index, line) in text.lines().enumerate() {
        let lineno = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let vector: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("line {lineno}: vector is not valid JSON: {e}"));
                continue;
            }
        };
        let Some(input) = vector.get("input").and_then(|v| v.as_str()) else {
            failures.push(format!("line {lineno}: vector has no string \"input\""));
            continue;
        };
        checked += 1;
        let shown: String = input.chars().take(60).collect();
        let result = parse(input.as_bytes());

        match (
            vector.get("canonical").and_then(|v| v.as_str()),
            vector.get("error").and_then(|v| v.as_str()),
        ) {
            (Some(want), None) => {
                ok_vectors += 1;
                let Some(want_sha) = vector.get("sha256").and_then(|v| v.as_str()) else {
                    failures.push(format!(
                        "line {lineno}: vector has \"canonical\" but no \"sha256\""
                    ));
                    continue;
                };
                let value = match result {
                    Ok(value) => value,
                    Err(e) => {
                        failures.push(format!(
                            "line {lineno} {shown:?}: rejected ({e}), want {want:?}"
                        ));
                        continue;
                    }
                };
                let got = to_canonical(&value);
                if got != want {
                    failures.push(format!(
                        "line {lineno} {shown:?}: canonical {got:?}, want {want:?}"
                    ));
                }
                let sha = fingerprint(&value).to_hex();
                if sha != want_sha {
                    failures.push(format!(
                        "line {lineno} {shown:?}: sha256 {sha}, want {want_sha}"
                    ));
                }
                if Fingerprint::of_bytes(want.as_bytes()).to_hex() != want_sha {
                    failures.push(format!(
                        "line {lineno}: vector sha256 does not match its canonical text"
                    ));
                }
                // The canonical form is a fixpoint.
                match canonicalize(want.as_bytes()) {
                    Ok(again) if again == want => {}
                    other => failures.push(format!(
                        "line {lineno}: canonical form not a fixpoint: {other:?}"
                    )),
                }
            }
            (None, Some(kind)) => {
                error_vectors += 1;
                match result {
                    Ok(value) => failures.push(format!(
                        "line {lineno} {shown:?}: accepted as {:?}, want error {kind}",
                        to_canonical(&value)
                    )),
                    Err(e) if e.kind.as_str() != kind => failures.push(format!(
                        "line {lineno} {shown:?}: error {e}, want error {kind}"
                    )),
                    Err(_) => {}
                }
            }
            _ => failures.push(format!(
                "line {lineno}: vector needs exactly one of \"canonical\" or \"error\""
            )),
        }
    }

    assert!(
        failures.is_empty(),
        "{} of {checked} canonical JSON vectors failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        checked > 50 && ok_vectors > 0 && error_vectors > 0,
        "too few vectors in {} ({checked}: {ok_vectors} ok, {error_vectors} errors); refusing to pass vacuously",
        path.display()
    );
}
