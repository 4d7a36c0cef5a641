//! A tool's `effect`: what a committed Dispatch does to the versioned state
//! (SPEC §6).

use serde::Deserialize;

use super::parse::Loader;
use super::{PolicyError, StatePolicy};
use crate::domain::canonical::Value;

/// What a committed Dispatch does to the versioned state (SPEC §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Receipt only: the host performs the side effect itself.
    None,
    /// The resource named by argument `resource_argument` becomes the value
    /// of argument `value_argument`; only one of the listed `resources` (so
    /// a ticket tool cannot overwrite the outbox), any resource when the
    /// policy says so (`resources = ["*"]`: `None`).
    Set {
        resource_argument: String,
        value_argument: String,
        resources: Option<Vec<String>>,
    },
    /// An object built from the arguments is pushed onto list `resource`.
    Append { resource: String },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEffect {
    /// `none` | `set` | `append`
    kind: Option<String>,
    resource_argument: Option<String>,
    value_argument: Option<String>,
    resource: Option<String>,
    /// For `set`: the resources it may change (`["*"]`: every one; required).
    resources: Option<Vec<String>>,
}

/// `effect`: what a committed Dispatch of the tool does (SPEC §6), by kind.
pub(super) fn effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
    let key = format!("{key}.effect");
    match raw.kind.as_deref().unwrap_or("none") {
        "none" => no_effect(loader, &key, &raw),
        "set" => set_effect(loader, &key, raw, state),
        "append" => append_effect(loader, &key, raw, state),
        other => Err(loader.error(
            format!("{key}.kind"),
            format!("must be \"none\", \"set\" or \"append\", not {other:?}"),
        )),
    }
}

/// `none` (the default): a receipt only, and no other keys.
fn no_effect(loader: &Loader<'_>, key: &str, raw: &RawEffect) -> Result<Effect, PolicyError> {
    if raw.resource.is_some()
        || raw.resource_argument.is_some()
        || raw.value_argument.is_some()
        || raw.resources.is_some()
    {
        return Err(loader.error(key, "effect \"none\" takes no other keys"));
    }
    Ok(Effect::None)
}

/// `set`: names the resource and the value by argument, and may only
/// change the listed `resources`, which the state declares; a list is
/// required (its absence opens nothing), `["*"]` for every resource.
fn set_effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
    let (Some(resource_argument), Some(value_argument)) =
        (raw.resource_argument, raw.value_argument)
    else {
        return Err(loader.error(
            key,
            "effect \"set\" needs resource_argument and value_argument",
        ));
    };
    if raw.resource.is_some() {
        return Err(loader.error(
            format!("{key}.resource"),
            "effect \"set\" names its resource by resource_argument",
        ));
    }
    let resources_key = format!("{key}.resources");
    let resources = match raw.resources {
        None => {
            return Err(loader.error(
                resources_key,
                "effect \"set\" needs resources: the state resources it may change, \
                 or [\"*\"] for every one",
            ));
        }
        Some(names) if names.is_empty() => {
            return Err(loader.error(
                resources_key,
                "lists no resource: the tool could change nothing",
            ));
        }
        Some(names) if names == ["*"] => None,
        Some(names) => {
            if names.iter().any(|name| name == "*") {
                return Err(loader.error(
                    resources_key,
                    "\"*\" (every resource) stands alone, not beside names",
                ));
            }
            if let Some(unknown) = names
                .iter()
                .find(|name| !state.resources.contains_key(*name))
            {
                return Err(loader.error(resources_key, format!("no state resource {unknown:?}")));
            }
            Some(names)
        }
    };
    Ok(Effect::Set {
        resource_argument,
        value_argument,
        resources,
    })
}

/// `append`: pushes onto one declared state resource that is a list, and
/// takes no other keys.
fn append_effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
    let Some(resource) = raw.resource else {
        return Err(loader.error(key, "effect \"append\" needs resource"));
    };
    match state.resources.get(&resource) {
        Some(Value::Array(_)) => {}
        Some(_) => {
            return Err(loader.error(
                format!("{key}.resource"),
                format!("state resource {resource:?} is not a list"),
            ));
        }
        None => {
            return Err(loader.error(
                format!("{key}.resource"),
                format!("no state resource {resource:?}"),
            ));
        }
    }
    if raw.resource_argument.is_some() || raw.value_argument.is_some() || raw.resources.is_some() {
        return Err(loader.error(key, "effect \"append\" takes only resource"));
    }
    Ok(Effect::Append { resource })
}
