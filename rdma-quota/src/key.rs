//! The names of the limits a quota file can set.

use std::fmt;
use std::str::FromStr;

use crate::config::EntryError;
use crate::verb::{Resource, Verb};

/// One limit a quota configuration can set: a live count, the registered
/// memory-region bytes, or a per-second rate of one verb.
///
/// Destroying verbs have no rate key: [`LimitKey::rate`] refuses them, so a
/// `LimitKey` can never name a limit on destruction.
///
/// # Examples
///
/// ```
/// use rdma_quota::{LimitKey, Resource, Verb};
///
/// let key: LimitKey = "QP_COUNT".parse()?;
/// assert_eq!(key, LimitKey::count(Resource::Qp));
/// assert_eq!(LimitKey::rate(Verb::MrReg).map(|k| k.name()), Some("MR_REG"));
/// assert_eq!(LimitKey::rate(Verb::QpDestroy), None);
/// assert!("QP_DESTROY".parse::<LimitKey>().is_err());
/// assert!("CTX_OPEN".parse::<LimitKey>().is_err());
/// # Ok::<(), rdma_quota::EntryError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LimitKey(Kind);

/// Private so that a rate key on a destroying verb cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Count(Resource),
    MrBytes,
    Rate(Verb),
}

impl LimitKey {
    /// `MR_BYTES`: the bytes of all registered memory regions.
    pub const MR_BYTES: LimitKey = LimitKey(Kind::MrBytes);

    /// The count limit of `resource` (`QP_COUNT`, ...).
    pub const fn count(resource: Resource) -> LimitKey {
        LimitKey(Kind::Count(resource))
    }

    /// The rate limit of `verb`, or `None` if `verb` destroys a resource:
    /// destruction only frees resources, so it is never limited. `CTX_OPEN` has no rate key
    /// either: the monitor counts it, but neither the interceptor nor the collector sees a
    /// device being opened, so a quota file naming it would promise a limit nothing keeps (the
    /// rdma cgroup's `hca_handle` bounds how many contexts a cgroup holds).
    pub const fn rate(verb: Verb) -> Option<LimitKey> {
        match (verb.destroys(), verb) {
            (Some(_), _) | (None, Verb::CtxOpen) => None,
            (None, _) => Some(LimitKey(Kind::Rate(verb))),
        }
    }

    /// Every key, in the order the configuration is rendered.
    pub fn all() -> impl Iterator<Item = LimitKey> {
        let counts = Resource::ALL.into_iter().map(LimitKey::count);
        let rates = Verb::ALL.into_iter().filter_map(LimitKey::rate);
        counts
            .chain(std::iter::once(LimitKey::MR_BYTES))
            .chain(rates)
    }

    /// The name in quota files (`QP_COUNT`, `MR_BYTES`, `QP_CREATE`, ...).
    pub const fn name(self) -> &'static str {
        match self.0 {
            Kind::Count(r) => r.count_key(),
            Kind::MrBytes => "MR_BYTES",
            Kind::Rate(v) => v.name(),
        }
    }

    /// The resource whose live count this key limits, for count keys.
    pub const fn resource(self) -> Option<Resource> {
        match self.0 {
            Kind::Count(r) => Some(r),
            _ => None,
        }
    }

    /// The verb whose calls per second this key limits, for rate keys.
    pub const fn verb(self) -> Option<Verb> {
        match self.0 {
            Kind::Rate(v) => Some(v),
            _ => None,
        }
    }

    /// Whether this is a per-second rate (as opposed to a live amount).
    pub const fn is_rate(self) -> bool {
        matches!(self.0, Kind::Rate(_))
    }

    /// The valid names, comma-separated, for error messages.
    pub(crate) fn expected() -> String {
        LimitKey::all()
            .map(LimitKey::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LimitKey {
    type Err = EntryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(key) = LimitKey::all().find(|k| k.name() == s) {
            return Ok(key);
        }
        match s.parse::<Verb>() {
            Ok(verb) => Err(EntryError::Destruction { verb }),
            Err(_) => Err(EntryError::UnknownKey { key: s.to_owned() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_round_trips_through_its_name() {
        let keys: Vec<_> = LimitKey::all().collect();
        assert_eq!(keys.len(), 4 + 1 + 7);
        for key in keys {
            assert_eq!(key.name().parse::<LimitKey>(), Ok(key));
        }
    }

    #[test]
    fn destroying_verbs_are_not_keys() {
        for verb in Verb::ALL.into_iter().filter(|v| v.destroys().is_some()) {
            assert_eq!(LimitKey::rate(verb), None);
            assert_eq!(
                verb.name().parse::<LimitKey>(),
                Err(EntryError::Destruction { verb })
            );
        }
    }
}
