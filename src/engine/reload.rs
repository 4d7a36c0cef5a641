//! Policy reload on SIGHUP (SPEC §3): the policy file is read again and
//! swapped in through the reload decision ([`Engine::reload`]). A file
//! that does not load, or one the decision refuses, keeps the policy in
//! force and is reported at WARN as `policy_reload_failed`. Each reload is
//! counted in the metrics (`toolgate_config_last_reload_successful`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use crate::domain::policy::Policy;
use crate::engine::Engine;

/// Reloads the policy file at `path` once. `listen` is the gRPC
/// listener's address (an open host API stays on loopback). On failure the
/// policy in force is kept, `policy_reload_failed` is logged and the
/// reason is returned.
pub async fn reload_once(engine: &Engine, path: &Path, listen: SocketAddr) -> Result<(), String> {
    let load_path = path.to_path_buf();
    let reloaded = match tokio::task::spawn_blocking(move || Policy::load(&load_path)).await {
        Ok(Ok(policy)) => engine.reload(policy, listen),
        Ok(Err(error)) => Err(error.to_string()),
        Err(error) => Err(error.to_string()),
    };
    engine.note_reload(reloaded.is_ok());
    if let Err(reason) = &reloaded {
        crate::audit_warn!(
            "policy_reload_failed",
            error = %reason,
            kept_revision = %engine.policy().revision,
        );
    }
    reloaded
}

/// Catches SIGHUP from now on and, in a task of its own, reloads the
/// policy file at `path` ([`reload_once`]) on each one. Call it before the
/// address is announced, so that a reload sent right after cannot kill the
/// process. Must run inside a tokio runtime; fails when the signal cannot
/// be caught.
pub fn reload_on_sighup(
    engine: Engine,
    path: PathBuf,
    listen: SocketAddr,
) -> std::io::Result<JoinHandle<()>> {
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            // The failure is logged by reload_once; the loop goes on.
            let _ = reload_once(&engine, &path, listen).await;
        }
    }))
}
