//! `[profiles]`, `[actors]` and `[reviewers]`: who calls tools and who
//! reviews the calls.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::parse::Loader;
use super::{PolicyError, PolicyMap};

/// An actor's resolved profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ActorProfile {
    pub actor: String,
    pub profile: String,
    pub roles: Vec<String>,
    pub approval_threshold: Option<f64>,
    pub max_decisions: Option<u64>,
    pub max_tool_calls: Option<u64>,
    pub max_session_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    pub identity: String,
    pub roles: Vec<String>,
    /// Workspaces the reviewer may act in; `*` means all.
    pub workspaces: Vec<String>,
    /// Sees (lists, reads, watches) every approval, not only those it could
    /// review. Off unless the policy says `see_all = true`.
    pub see_all: bool,
}

impl Reviewer {
    pub fn covers_workspace(&self, workspace: &str) -> bool {
        self.workspaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == workspace)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    #[serde(default)]
    roles: Vec<String>,
    approval_threshold: Option<f64>,
    max_decisions: Option<u64>,
    max_tool_calls: Option<u64>,
    max_session_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawActor {
    profile: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReviewer {
    roles: Vec<String>,
    workspaces: Vec<String>,
    #[serde(default)]
    see_all: bool,
}

/// `[actors]`: each actor named by an identifier, with a profile from
/// `[profiles]` whose settings it takes.
pub(super) fn actors(
    loader: &Loader<'_>,
    raw_actors: BTreeMap<String, RawActor>,
    profiles: &BTreeMap<String, RawProfile>,
) -> Result<PolicyMap<String, ActorProfile>, PolicyError> {
    let mut actors = PolicyMap::default();
    for (name, actor) in raw_actors {
        let key = format!("actors.{name}");
        loader.identifier(&key, &name)?;
        let Some(profile) = profiles.get(&actor.profile) else {
            return Err(loader.error(
                format!("{key}.profile"),
                format!("no profile {:?} in [profiles]", actor.profile),
            ));
        };
        actors.insert(
            name.clone(),
            ActorProfile {
                actor: name,
                profile: actor.profile,
                roles: profile.roles.clone(),
                approval_threshold: profile.approval_threshold,
                max_decisions: profile.max_decisions,
                max_tool_calls: profile.max_tool_calls,
                max_session_seconds: profile.max_session_seconds,
            },
        );
    }
    Ok(actors)
}

/// `[profiles]`: an approval threshold is a finite number (checked for
/// every profile, used by an actor or not).
pub(super) fn check_profiles(
    loader: &Loader<'_>,
    profiles: &BTreeMap<String, RawProfile>,
) -> Result<(), PolicyError> {
    for (name, profile) in profiles {
        if let Some(threshold) = profile.approval_threshold
            && !threshold.is_finite()
        {
            return Err(loader.error(
                format!("profiles.{name}.approval_threshold"),
                "must be a finite number",
            ));
        }
    }
    Ok(())
}

/// `[reviewers]`: each named by an identifier, acting in at least one
/// workspace.
pub(super) fn reviewers(
    loader: &Loader<'_>,
    raw_reviewers: BTreeMap<String, RawReviewer>,
) -> Result<PolicyMap<String, Reviewer>, PolicyError> {
    let mut reviewers = PolicyMap::default();
    for (identity, raw_reviewer) in raw_reviewers {
        let key = format!("reviewers.{identity}");
        loader.identifier(&key, &identity)?;
        if raw_reviewer.workspaces.is_empty() {
            return Err(loader.error(
                format!("{key}.workspaces"),
                "must name at least one workspace (or \"*\")",
            ));
        }
        if raw_reviewer.workspaces.iter().any(String::is_empty) {
            return Err(loader.error(
                format!("{key}.workspaces"),
                "a workspace is named by a non-empty string",
            ));
        }
        reviewers.insert(
            identity.clone(),
            Reviewer {
                identity,
                roles: raw_reviewer.roles,
                workspaces: raw_reviewer.workspaces,
                see_all: raw_reviewer.see_all,
            },
        );
    }
    Ok(reviewers)
}
