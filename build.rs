//! Compiles `proto/` with protox (pure Rust, so a fresh machine needs no
//! `protoc`) and generates the tonic services plus the descriptor set that
//! server reflection serves; and sets `TOOLGATE_COMMIT`, the commit the
//! binary is built from (`--version`, `toolgate_build_info`).

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/toolgate/v1/toolgate.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("toolgate_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    commit();
    Ok(())
}

/// `TOOLGATE_COMMIT` for the crate: the variable itself when the build sets
/// it (a tarball has no `.git`), else `git rev-parse` when the source is a
/// git checkout, else `unknown`. A build without git never fails here.
fn commit() {
    println!("cargo:rerun-if-env-changed=TOOLGATE_COMMIT");
    let commit = std::env::var("TOOLGATE_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TOOLGATE_COMMIT={}", commit.trim());
}

fn git(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn git_commit() -> Option<String> {
    // A `.git` of this package's own (a directory, or a worktree's file):
    // never the commit of some repository the source was unpacked inside.
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    if !manifest_dir.join(".git").exists() {
        return None;
    }
    // Rebuilt when HEAD moves: HEAD itself, and the one branch it points
    // to (not all of refs/heads: another worktree's commit is no reason).
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    if let Some(common_dir) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        println!("cargo:rerun-if-changed={common_dir}/packed-refs");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={common_dir}/{branch}");
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}
