//! The verbs and resources that telemetry observes and quotas limit.
//!
//! The numeric values of [`Verb`] are part of the contract with the kernel
//! programs in `telemetry-ebpf/bpf/monitor.bpf.c`: an event carries the verb
//! as one byte, so the order here must never change. This is the one Rust
//! definition of those ids; the names are those of quota files, reports and
//! the collector protocol ([`crate::wire`]).

use std::fmt;
use std::str::FromStr;

/// One operation on the RDMA control path.
///
/// # Examples
///
/// ```
/// use rdma_quota::Verb;
///
/// let verb: Verb = "QP_CREATE".parse().unwrap();
/// assert_eq!(verb, Verb::QpCreate);
/// assert_eq!(verb.to_string(), "QP_CREATE");
/// assert_eq!(Verb::from_id(verb.id()), Some(verb));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Verb {
    /// Create a queue pair.
    QpCreate = 0,
    /// Modify a queue pair (state transitions).
    QpModify = 1,
    /// Destroy a queue pair.
    QpDestroy = 2,
    /// Allocate a protection domain.
    PdAlloc = 3,
    /// Deallocate a protection domain.
    PdDealloc = 4,
    /// Create a completion queue.
    CqCreate = 5,
    /// Destroy a completion queue.
    CqDestroy = 6,
    /// Register a memory region.
    MrReg = 7,
    /// Deregister a memory region.
    MrDereg = 8,
    /// Query a GID table entry.
    GidQuery = 9,
    /// The RDMA CM sent a connection request.
    CmSendReq = 10,
    /// Open a device context (`ibv_open_device`): the kernel allocates a user context, the
    /// rdma cgroup's `hca_handle`. Counted by the monitor, so that a tenant churning contexts
    /// is seen; no layer of the project refuses it by rate (see [`crate::LimitKey::rate`]).
    CtxOpen = 11,
}

impl Verb {
    /// Every verb, in id order.
    pub const ALL: [Verb; 12] = [
        Verb::QpCreate,
        Verb::QpModify,
        Verb::QpDestroy,
        Verb::PdAlloc,
        Verb::PdDealloc,
        Verb::CqCreate,
        Verb::CqDestroy,
        Verb::MrReg,
        Verb::MrDereg,
        Verb::GidQuery,
        Verb::CmSendReq,
        Verb::CtxOpen,
    ];

    /// The one-byte id the kernel programs use.
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// The verb with this kernel id, if any.
    pub fn from_id(id: u8) -> Option<Verb> {
        Verb::ALL.get(usize::from(id)).copied()
    }

    /// The name used in configuration files and reports (`QP_CREATE`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Verb::QpCreate => "QP_CREATE",
            Verb::QpModify => "QP_MODIFY",
            Verb::QpDestroy => "QP_DESTROY",
            Verb::PdAlloc => "PD_ALLOC",
            Verb::PdDealloc => "PD_DEALLOC",
            Verb::CqCreate => "CQ_CREATE",
            Verb::CqDestroy => "CQ_DESTROY",
            Verb::MrReg => "MR_REG",
            Verb::MrDereg => "MR_DEREG",
            Verb::GidQuery => "GID_QUERY",
            Verb::CmSendReq => "CM_SEND_REQ",
            Verb::CtxOpen => "CTX_OPEN",
        }
    }

    /// The resource this verb creates, if it creates one.
    pub const fn creates(self) -> Option<Resource> {
        match self {
            Verb::QpCreate => Some(Resource::Qp),
            Verb::PdAlloc => Some(Resource::Pd),
            Verb::CqCreate => Some(Resource::Cq),
            Verb::MrReg => Some(Resource::Mr),
            _ => None,
        }
    }

    /// The resource this verb destroys, if it destroys one.
    pub const fn destroys(self) -> Option<Resource> {
        match self {
            Verb::QpDestroy => Some(Resource::Qp),
            Verb::PdDealloc => Some(Resource::Pd),
            Verb::CqDestroy => Some(Resource::Cq),
            Verb::MrDereg => Some(Resource::Mr),
            _ => None,
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a verb.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verb {0:?}")]
pub struct UnknownVerb(pub String);

impl FromStr for Verb {
    type Err = UnknownVerb;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verb::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| UnknownVerb(s.to_owned()))
    }
}

/// A kind of RDMA resource whose live count is tracked.
///
/// # Examples
///
/// ```
/// use rdma_quota::Resource;
///
/// assert_eq!(Resource::Qp.count_key(), "QP_COUNT");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Resource {
    /// Queue pairs.
    Qp = 0,
    /// Protection domains.
    Pd = 1,
    /// Completion queues.
    Cq = 2,
    /// Memory regions.
    Mr = 3,
}

impl Resource {
    /// Every resource kind, in id order.
    pub const ALL: [Resource; 4] = [Resource::Qp, Resource::Pd, Resource::Cq, Resource::Mr];

    /// The id the kernel programs use for this resource's slot (`R_QP`, ... in
    /// `telemetry-ebpf`'s generated `abi.h`).
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// Short name (`QP`, `PD`, `CQ`, `MR`).
    pub const fn name(self) -> &'static str {
        match self {
            Resource::Qp => "QP",
            Resource::Pd => "PD",
            Resource::Cq => "CQ",
            Resource::Mr => "MR",
        }
    }

    /// The configuration key of this resource's count limit (`QP_COUNT`, ...).
    pub const fn count_key(self) -> &'static str {
        match self {
            Resource::Qp => "QP_COUNT",
            Resource::Pd => "PD_COUNT",
            Resource::Cq => "CQ_COUNT",
            Resource::Mr => "MR_COUNT",
        }
    }

    /// The verb that creates this resource.
    pub const fn create_verb(self) -> Verb {
        match self {
            Resource::Qp => Verb::QpCreate,
            Resource::Pd => Verb::PdAlloc,
            Resource::Cq => Verb::CqCreate,
            Resource::Mr => Verb::MrReg,
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_parse() {
        for (i, verb) in Verb::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(verb.id()), i);
            assert_eq!(Verb::from_id(verb.id()), Some(verb));
            assert_eq!(verb.name().parse::<Verb>(), Ok(verb));
        }
        assert_eq!(Verb::from_id(12), None);
        assert_eq!(
            "QP_EXPLODE".parse::<Verb>(),
            Err(UnknownVerb("QP_EXPLODE".into()))
        );
    }

    #[test]
    fn create_and_destroy_pair_up() {
        for r in Resource::ALL {
            assert_eq!(r.create_verb().creates(), Some(r));
        }
        let destroyed: Vec<_> = Verb::ALL.iter().filter_map(|v| v.destroys()).collect();
        assert_eq!(destroyed.len(), Resource::ALL.len());
    }
}
