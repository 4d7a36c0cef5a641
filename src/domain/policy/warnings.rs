//! Dangling names: what a valid policy names that nothing in it supplies;
//! and what a reload refuses.

use std::collections::HashSet;

use super::{CredentialKind, Effect, Mode, Policy, Serving};

/// Something a valid policy names that nothing else in it supplies (an
/// approver role that no reviewer holds, say). Not an error: `check-config`
/// prints it, `check-config --strict` fails on it, and a reload refuses a
/// policy that adds one (see [`Policy::reload_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PolicyWarning {
    /// Key path inside the file.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for PolicyWarning {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}: {}", self.key, self.message)
    }
}

impl Policy {
    /// Why the running server must not swap `self` (the running policy)
    /// for `new`, if it must not. A reload can never open the door nor leave
    /// the server in a state start would refuse:
    /// - it must leave `[server]` as it is (it applies at start only);
    /// - `new` must run the server as it serves ([`Policy::check_serving`]);
    /// - it must keep at least one credential of each kind the server has
    ///   now (`running_kinds`: the policy's and those made at start);
    /// - a token or a client certificate it keeps stays what it was
    ///   ([`Policy::credential_change`]);
    /// - it must not add a dangling name ([`PolicyWarning`]) that the
    ///   running policy does not have: that is what a file cut short looks
    ///   like (a reviewer whose credential is gone, a tool whose pin is gone).
    pub fn reload_refusal(
        &self,
        running_kinds: &[CredentialKind],
        new: &Policy,
        serving: &Serving,
    ) -> Option<String> {
        // `[server]` applies at start only: a reload that changed it would
        // say it took effect while the listener kept what it started with
        // (mTLS added and not served, say).
        let changed = self.server.changed_keys(&new.server);
        if !changed.is_empty() {
            return Some(format!(
                "the new policy changes [server] ({}): [server] applies at start only; \
                 restart to change it",
                changed.join(", ")
            ));
        }
        if let Err(refusal) = new.check_serving(serving) {
            return Some(refusal);
        }
        for kind in running_kinds {
            if !new.has_credentials(*kind) {
                return Some(format!(
                    "the new policy has no {kind} credential and the server has some: \
                     a reload cannot remove every {kind} credential (restart to do that)",
                    kind = kind.as_str()
                ));
            }
        }
        if let Some(refusal) = self.credential_change(new) {
            return Some(refusal);
        }
        let added: Vec<&PolicyWarning> = new
            .warnings
            .iter()
            .filter(|warning| !self.warnings.contains(warning))
            .collect();
        if let Some(first) = added.first() {
            let more = match added.len() {
                1 => String::new(),
                count => format!(" (and {} more)", count - 1),
            };
            return Some(format!(
                "the new policy adds a dangling name (a file cut short?): {first}{more}"
            ));
        }
        None
    }

    /// Why a credential of the running policy must not keep working as
    /// `new` has it: a token, or a client certificate that is a credential
    /// alone, as another kind or identity (a host's token made a
    /// reviewer's; an identity renamed, which would start its sessions and
    /// budgets afresh), or a token no longer bound to the client
    /// certificate it was bound to. One dropped or added is a reload's to
    /// make.
    fn credential_change(&self, new: &Policy) -> Option<String> {
        let tokens = (self.credentials.iter()).map(|(digest, running)| {
            let reloaded = new.credentials.get(digest);
            ("token", running, reloaded)
        });
        let certificates = (self.certificate_credentials.iter()).map(|(identity, running)| {
            let reloaded = new.certificate_credentials.get(identity);
            ("client certificate", running, reloaded)
        });
        for (what, running, reloaded) in tokens.chain(certificates) {
            let Some(reloaded) = reloaded else {
                continue;
            };
            let changed = if reloaded.kind != running.kind {
                "another kind"
            } else if reloaded.identity != running.identity {
                "another identity"
            } else if reloaded.client_identity != running.client_identity {
                "another client certificate binding"
            } else {
                continue;
            };
            return Some(format!(
                "the new policy gives the {what} of {} {:?} {changed}: a credential keeps \
                 what it is until a restart (give the changed one a new {what})",
                running.kind.as_str(),
                running.identity
            ));
        }
        None
    }

    /// Names the policy uses that nothing in it supplies, sorted.
    pub(super) fn dangling_names(&self) -> Vec<PolicyWarning> {
        let mut warnings = Vec::new();
        self.unheld_roles(&mut warnings);
        self.unpinned_servers(&mut warnings);
        self.effects_without_state(&mut warnings);
        self.reviewers_without_credentials(&mut warnings);
        self.ext_authz_without_actor(&mut warnings);
        warnings.sort();
        warnings
    }

    /// A tool's approver role that no reviewer holds; a role that may call
    /// a (not forbidden) tool that no actor holds.
    fn unheld_roles(&self, warnings: &mut Vec<PolicyWarning>) {
        let reviewer_roles = held_roles(self.reviewers.values().map(|reviewer| &reviewer.roles));
        let actor_roles = held_roles(self.actors.values().map(|actor| &actor.roles));
        for tool in self.tools.values() {
            let key = format!("tools.{}", tool.name);
            let unheld = missing_roles(&tool.approvers, &reviewer_roles);
            if !unheld.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("{key}.approvers"),
                    message: format!("no reviewer holds role {}", unheld.join(", ")),
                });
            }
            let unheld = missing_roles(&tool.roles, &actor_roles);
            if tool.mode != Mode::Forbidden && !unheld.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("{key}.roles"),
                    message: format!("no actor holds role {}", unheld.join(", ")),
                });
            }
        }
    }

    /// An `[ext_authz]` section set up for Checks (a host credential, a
    /// workspace or session header) that names no actor source.
    fn ext_authz_without_actor(&self, warnings: &mut Vec<PolicyWarning>) {
        let settings = &self.ext_authz;
        let defaults = super::ExtAuthzSettings::default();
        let set_up = settings.host_credential.is_some()
            || settings.workspace != defaults.workspace
            || settings.session_header != defaults.session_header
            || settings.allow_other_methods;
        if set_up && settings.actor == super::ActorSource::Unset {
            warnings.push(PolicyWarning {
                key: "ext_authz".to_string(),
                message: "names no actor source (actor_header, actor_claim or \
                          actor_from_principal): every tools/call Check is denied actor-missing"
                    .to_string(),
            });
        }
    }

    /// A tool's server that no `[[pins]]` entry pins.
    fn unpinned_servers(&self, warnings: &mut Vec<PolicyWarning>) {
        for tool in self.tools.values() {
            if let Some(server) = &tool.server
                && !self.pins.contains_key(server)
            {
                warnings.push(PolicyWarning {
                    key: format!("tools.{}.server", tool.name),
                    message: format!(
                        "no [[pins]] entry for server {server:?}: the tool is denied \
                         manifest-unverified until a reviewer pins it"
                    ),
                });
            }
        }
    }

    /// A tool that sets a resource when the state declares none.
    fn effects_without_state(&self, warnings: &mut Vec<PolicyWarning>) {
        for tool in self.tools.values() {
            if matches!(tool.effect, Effect::Set { .. }) && self.state.resources.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("tools.{}.effect", tool.name),
                    message: "sets a resource, but [state.resources] declares none".to_string(),
                });
            }
        }
    }

    /// A reviewer with no reviewer credential to sign in with.
    fn reviewers_without_credentials(&self, warnings: &mut Vec<PolicyWarning>) {
        for reviewer in self.reviewers.values() {
            let has_credential = self.all_credentials().any(|credential| {
                credential.kind == CredentialKind::Reviewer
                    && credential.identity == reviewer.identity
            });
            if !has_credential {
                warnings.push(PolicyWarning {
                    key: format!("reviewers.{}", reviewer.identity),
                    message:
                        "no reviewer credential in [[credentials]]: this reviewer cannot sign in"
                            .to_string(),
                });
            }
        }
    }
}

/// Every role in `lists`.
fn held_roles<'a>(lists: impl Iterator<Item = &'a Vec<String>>) -> HashSet<&'a str> {
    lists.flatten().map(String::as_str).collect()
}

/// The roles of `roles` not in `held`, quoted, in order.
fn missing_roles(roles: &[String], held: &HashSet<&str>) -> Vec<String> {
    roles
        .iter()
        .filter(|role| !held.contains(role.as_str()))
        .map(|role| format!("{role:?}"))
        .collect()
}
