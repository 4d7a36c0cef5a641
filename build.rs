//! Compiles `proto/` with protox (pure Rust, so a fresh machine needs no
//! `protoc`) and generates the tonic services plus the descriptor set that
//! server reflection serves; compiles Envoy's `external_auth.proto`
//! from the envoy-types crate's own copy of Envoy's protos (found through
//! `cargo metadata`), for reflection to list `envoy.service.auth.v3`;
//! generates the server of Envoy's `Authorization` service over the
//! envoy-types messages with toolgate's codec; and
//! sets `TOOLGATE_COMMIT`, the commit the binary is built from
//! (`--version`, `toolgate_build_info`).

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
    let envoy = protox::compile(
        ["envoy/service/auth/v3/external_auth.proto"],
        envoy_proto_roots()?,
    )?;
    std::fs::write(
        out_dir.join("envoy_auth_descriptor.bin"),
        envoy.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec with buffers sized for toolgate's messages (src/codec.rs).
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(descriptors)?;
    // Envoy's Authorization service over envoy-types' messages, with the
    // same codec (tonic's manual builder: the service is one method, and
    // its messages stay envoy-types' own).
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[tonic_build::manual::Service::builder()
            .name("Authorization")
            .package("envoy.service.auth.v3")
            .method(
                tonic_build::manual::Method::builder()
                    .name("check")
                    .route_name("Check")
                    .input_type("::envoy_types::pb::envoy::service::auth::v3::CheckRequest")
                    .output_type("::envoy_types::pb::envoy::service::auth::v3::CheckResponse")
                    .codec_path("crate::codec::ProtoCodec")
                    .build(),
            )
            .build()]);
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

/// `cargo metadata` of this package, `--locked` (it never rewrites the
/// lock file in the middle of a build), and `--offline` when asked.
fn cargo_metadata(offline: bool) -> Result<std::process::Output, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO")?;
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("Cargo.toml");
    let mut command = std::process::Command::new(cargo);
    command.args(["metadata", "--format-version", "1", "--locked"]);
    if offline {
        command.arg("--offline");
    }
    Ok(command.arg("--manifest-path").arg(&manifest).output()?)
}

/// The include roots of the Envoy protos that the envoy-types crate ships
/// (`proto/data-plane-api`, `proto/xds`, …), in the source directory cargo
/// unpacked it to.
fn envoy_proto_roots() -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    // Offline first: a build never goes to the network for what it has.
    // On a fresh machine `cargo build` has fetched only what it builds, and
    // `cargo metadata` wants every package of the lock file (the dev- and
    // bench-only ones too): then it fetches them, as `cargo fetch` would.
    let output = match cargo_metadata(true)? {
        output if output.status.success() => output,
        _ => cargo_metadata(false)?,
    };
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let envoy_manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|package| package["name"] == "envoy-types")
        .and_then(|package| package["manifest_path"].as_str())
        .ok_or("cargo metadata lists no envoy-types package")?;
    let proto = PathBuf::from(envoy_manifest)
        .parent()
        .ok_or("envoy-types has no source directory")?
        .join("proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    // For the test that decodes the Envoy example with the same protos.
    println!(
        "cargo:rustc-env=TOOLGATE_ENVOY_PROTO_DIR={}",
        proto.display()
    );
    Ok(
        ["data-plane-api", "xds", "protoc-gen-validate", "googleapis"]
            .iter()
            .map(|root| proto.join(root))
            .collect(),
    )
}
