//! Reload on SIGHUP (SPEC §3): the policy file is read again and swapped in
//! through the reload decision ([`Engine::reload`]), and the listener's TLS
//! files are read again ([`ServerTls`]). Either failing keeps both the
//! policy and the TLS material in force, and is reported at WARN as
//! `policy_reload_failed`. New TLS material applies to new connections;
//! open ones keep theirs, so nothing is dropped. Each reload is counted in
//! the metrics (`toolgate_config_last_reload_successful`).

use std::path::{Path, PathBuf};

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use crate::domain::policy::{Policy, Serving};
use crate::engine::Engine;
use crate::ops::tls::ServerTls;

/// Reloads the policy file at `path` once. `serving`: how the server
/// serves ([`Policy::check_serving`]: an open host API stays on loopback,
/// and so on). On failure the policy in force is kept,
/// `policy_reload_failed` is logged and the reason is returned.
pub async fn reload_once(engine: &Engine, path: &Path, serving: Serving) -> Result<(), String> {
    reload_with_tls(engine, Some(path), serving, None).await
}

/// Reloads the policy file at `path` (when there is one) and the TLS files
/// of `tls` (when TLS is served), all or nothing: the TLS files are read
/// first, the policy swapped next, and the new TLS material put in force
/// only once the policy is. On failure nothing changes,
/// `policy_reload_failed` is logged and the reason is returned.
pub async fn reload_with_tls(
    engine: &Engine,
    path: Option<&Path>,
    serving: Serving,
    tls: Option<&ServerTls>,
) -> Result<(), String> {
    let reloaded = reload_all(engine, path, serving, tls).await;
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

async fn reload_all(
    engine: &Engine,
    path: Option<&Path>,
    serving: Serving,
    tls: Option<&ServerTls>,
) -> Result<(), String> {
    let prepared = match tls {
        None => None,
        Some(tls) => {
            let reading = tls.clone();
            let prepared = tokio::task::spawn_blocking(move || reading.prepare_reload())
                .await
                .map_err(|error| error.to_string())?
                .map_err(|error| format!("{error} (the TLS material in force is kept)"))?;
            Some((tls, prepared))
        }
    };
    if let Some(path) = path {
        let load_path = path.to_path_buf();
        match tokio::task::spawn_blocking(move || Policy::load(&load_path)).await {
            Ok(Ok(policy)) => engine.reload(policy, &serving)?,
            Ok(Err(error)) => return Err(error.to_string()),
            Err(error) => return Err(error.to_string()),
        }
    }
    if let Some((tls, prepared)) = prepared {
        tls.install(prepared);
        tracing::info!(
            cert = %tls.files().cert.display(),
            "tls certificate reloaded; new connections use it"
        );
    }
    Ok(())
}

/// Catches SIGHUP from now on and, in a task of its own, reloads the
/// policy file at `path` and the TLS files ([`reload_with_tls`]) on each
/// one (with neither, it says so: the signal never stops the server). Call
/// it before the address is announced, so that a reload sent right after
/// cannot kill the process. Must run inside a tokio runtime; fails when
/// the signal cannot be caught.
pub fn reload_on_sighup(
    engine: Engine,
    path: Option<PathBuf>,
    serving: Serving,
    tls: Option<ServerTls>,
) -> std::io::Result<JoinHandle<()>> {
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            if path.is_none() && tls.is_none() {
                tracing::warn!(
                    "SIGHUP: nothing to reload (the embedded default policy, no TLS files); \
                     serve --config FILE to reload a policy"
                );
                continue;
            }
            // The failure is logged by reload_with_tls; the loop goes on.
            let _ = reload_with_tls(&engine, path.as_deref(), serving, tls.as_ref()).await;
        }
    }))
}
