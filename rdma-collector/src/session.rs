//! One connection's state: its tenant registration and live tickets.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdma_quota::tenant::Peer;
use rdma_quota::wire::{Reply, Request};
use rdma_quota::{Admission, Quotas, Resource, TenantInfo, TenantQuota, UsageSnapshot};

use crate::activity::{count, Activity, Noisy};
use crate::registry::{ConnId, Registry};

/// A connection's account with the collector's own bounds: the registry
/// that caps tickets per connection, uid and tenant, and the counters.
pub(crate) struct Ledger {
    pub(crate) registry: Arc<Mutex<Registry>>,
    pub(crate) activity: Arc<Activity>,
    pub(crate) id: ConnId,
}

impl Ledger {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The tickets of one connected process. Dropping it releases every ticket
/// still held, which is what makes a crashed program's resources disappear
/// from the counts.
pub(crate) struct Session {
    quotas: Quotas,
    quota: TenantQuota,
    peer: Peer,
    tickets: HashMap<u64, Admission>,
    next_ticket: u64,
    ledger: Ledger,
    /// The client said `HELLO ...; protocol=3` or later: its admissions say
    /// how long their rate limit stays full (`OK <ticket>; next_ms=N`).
    holds: bool,
}

impl Session {
    pub(crate) fn new(quotas: &Quotas, peer: Peer, ledger: Ledger) -> Session {
        ledger.registry().set_tenant(ledger.id, &peer.tenant);
        let quota = quotas.register(TenantInfo {
            identity: peer.tenant.clone(),
            pid: peer.pid,
            cgroup_id: peer.cgroup_id,
        });
        Session {
            quotas: quotas.clone(),
            quota,
            peer,
            tickets: HashMap::new(),
            next_ticket: 1,
            ledger,
            holds: false,
        }
    }

    pub(crate) fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Tickets held: a connection without any may be closed when idle.
    pub(crate) fn live_tickets(&self) -> usize {
        self.tickets.len()
    }

    /// Serves one well-formed request.
    pub(crate) fn handle(&mut self, request: Request) -> Reply {
        // Every request served, whatever it is: the collector's work, which
        // a refused program must not be able to drive up at will.
        count(&self.ledger.activity.requests);
        let peer = &self.peer;
        match request {
            Request::Hello { comm, protocol } => {
                tracing::debug!(pid = peer.pid, comm = %peer.comm, claimed = %comm, ?protocol, "hello");
                // Version 3 is the first a HELLO names; a client naming a
                // later one gets what this collector speaks.
                if protocol.is_some_and(|n| n >= 3) {
                    self.holds = true;
                    Reply::hello(rdma_quota::wire::VERSION)
                } else {
                    Reply::Ok
                }
            }
            Request::Admit { verb, bytes } => {
                let creates = verb.creates().is_some();
                // The collector's own caps bound its memory whatever the quotas
                // say (tenants without count limits included).
                let reserved = if creates {
                    let mut registry = self.ledger.registry();
                    let reserved = registry.reserve_ticket(self.ledger.id);
                    reserved
                        .map(|()| true)
                        .map_err(|cap| (cap.reason(registry.names()), None))
                } else {
                    Ok(false)
                };
                let now = Instant::now();
                let result = reserved.and_then(|reserved| {
                    let admitted = if verb.creates() == Some(Resource::Mr) {
                        self.quota.admit_mr_at(bytes, now)
                    } else {
                        self.quota.admit_at(verb, now)
                    };
                    // A rate refusal says when to ask again (protocol
                    // version 2), so that the interceptor answers the repeats
                    // itself instead of making us serve every one of them.
                    let admitted = admitted.map_err(|refusal| {
                        let retry = self.quota.retry_after(&refusal, now);
                        (refusal.to_string(), retry)
                    });
                    let holds = admitted.as_ref().is_ok_and(|a| a.resource().is_some());
                    if reserved && !holds {
                        self.ledger.registry().release_tickets(self.ledger.id, 1);
                    }
                    admitted
                });
                match result {
                    Ok(admission) => {
                        let reply = if admission.resource().is_some() {
                            // Version 3: say now what the next call would
                            // hear, so that it need not be asked.
                            let held = admission.held().filter(|_| self.holds);
                            let ticket = self.next_ticket;
                            self.next_ticket += 1;
                            self.tickets.insert(ticket, admission);
                            match held {
                                Some(held) => Reply::Held { ticket, held },
                                None => Reply::Ticket(ticket),
                            }
                        } else {
                            Reply::Ok
                        };
                        count(&self.ledger.activity.admitted);
                        tracing::debug!(
                            pid = peer.pid,
                            comm = %peer.comm,
                            tenant = %peer.tenant,
                            verb = %verb,
                            bytes,
                            result = "admitted",
                            reply = %reply,
                            "admission"
                        );
                        reply
                    }
                    Err((reason, retry_after)) => {
                        count(&self.ledger.activity.denied);
                        // A client can ask as fast as it likes: the lines are
                        // rate-limited, the summary has the count.
                        if let Some(suppressed) = self.ledger.activity.allow(Noisy::Deny) {
                            tracing::info!(
                                pid = peer.pid,
                                comm = %peer.comm,
                                tenant = %peer.tenant,
                                verb = %verb,
                                bytes,
                                result = "denied",
                                reason = %reason,
                                suppressed,
                                "admission"
                            );
                        } else {
                            tracing::debug!(
                                pid = peer.pid,
                                tenant = %peer.tenant,
                                verb = %verb,
                                reason = %reason,
                                "admission denied"
                            );
                        }
                        Reply::deny(reason, retry_after)
                    }
                }
            }
            Request::Release { ticket } => match self.tickets.remove(&ticket) {
                Some(admission) => {
                    self.ledger.registry().release_tickets(self.ledger.id, 1);
                    count(&self.ledger.activity.released);
                    tracing::debug!(
                        pid = peer.pid,
                        tenant = %peer.tenant,
                        ticket,
                        resource = ?admission.resource(),
                        "released"
                    );
                    Reply::Ok
                }
                None => Reply::Err(format!("unknown ticket {ticket}")),
            },
            Request::Stats => {
                let snapshot = self.quotas.snapshot();
                let mut text = format!("global {}", usage(&snapshot.global));
                if let Some(tenant) = snapshot.tenants.get(&peer.tenant) {
                    text.push_str(&format!(" tenant {} {}", peer.tenant, usage(&tenant.usage)));
                }
                Reply::OkWith(text)
            }
        }
    }
}

/// `QP=n PD=n CQ=n MR=n MR_BYTES=n`.
fn usage(u: &UsageSnapshot) -> String {
    let mut parts: Vec<String> = Resource::ALL
        .iter()
        .map(|r| format!("{r}={}", u.live.get(r).copied().unwrap_or(0)))
        .collect();
    parts.push(format!("MR_BYTES={}", u.mr_bytes));
    parts.join(" ")
}

impl Drop for Session {
    fn drop(&mut self) {
        self.ledger
            .registry()
            .release_tickets(self.ledger.id, self.tickets.len());
        tracing::debug!(
            pid = self.peer.pid,
            comm = %self.peer.comm,
            tenant = %self.peer.tenant,
            released = self.tickets.len(),
            "client disconnected"
        );
        // The tickets drop after this, releasing their counts.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BoundNames, ConnectionBounds};
    use rdma_quota::{QuotaConfig, Verb};

    fn session(quotas: &Quotas, tenant: &str, tickets: usize) -> Session {
        let names = BoundNames {
            tickets: Some("--max-tickets-per-connection".into()),
            ..BoundNames::default()
        };
        let registry = Arc::new(Mutex::new(
            Registry::new(ConnectionBounds {
                tickets,
                ..ConnectionBounds::default()
            })
            .with_names(names),
        ));
        let id = registry
            .lock()
            .expect("lock")
            .open_connection(1000, std::time::Instant::now())
            .expect("open")
            .id;
        let ledger = Ledger {
            registry,
            activity: Arc::new(Activity::default()),
            id,
        };
        Session::new(quotas, peer(tenant), ledger)
    }

    fn peer(tenant: &str) -> Peer {
        Peer {
            pid: 10,
            uid: 1000,
            comm: "test".into(),
            tenant: tenant.into(),
            cgroup_id: 0,
        }
    }

    fn admit(verb: Verb, bytes: u64) -> Request {
        Request::Admit { verb, bytes }
    }

    #[test]
    fn tickets_count_until_released_or_dropped() {
        let quotas =
            Quotas::new(QuotaConfig::parse("tenant alice QP_COUNT 2\n", "q").expect("config"));
        let mut s = session(&quotas, "alice", 100);
        assert_eq!(s.handle(admit(Verb::QpCreate, 0)), Reply::Ticket(1));
        assert_eq!(s.handle(admit(Verb::QpCreate, 0)), Reply::Ticket(2));
        assert_eq!(
            s.handle(admit(Verb::QpCreate, 0)),
            Reply::Deny("QP_COUNT limit 2 reached for tenant alice (2 live)".into())
        );
        assert_eq!(s.handle(Request::Release { ticket: 1 }), Reply::Ok);
        assert_eq!(
            s.handle(Request::Release { ticket: 1 }),
            Reply::Err("unknown ticket 1".into())
        );
        assert_eq!(s.handle(admit(Verb::QpCreate, 0)), Reply::Ticket(3));
        assert_eq!(
            s.handle(Request::Stats),
            Reply::OkWith(
                "global QP=2 PD=0 CQ=0 MR=0 MR_BYTES=0 tenant alice QP=2 PD=0 CQ=0 MR=0 MR_BYTES=0"
                    .into()
            )
        );
        drop(s);
        assert_eq!(quotas.snapshot().global.live[&Resource::Qp], 0);
    }

    #[test]
    fn mr_bytes_and_non_creating_verbs() {
        let quotas =
            Quotas::new(QuotaConfig::parse("MR_BYTES 8192\nQP_MODIFY 1\n", "q").expect("config"));
        let mut s = session(&quotas, "bob", 100);
        assert_eq!(s.handle(admit(Verb::MrReg, 8192)), Reply::Ticket(1));
        assert!(
            matches!(s.handle(admit(Verb::MrReg, 1)), Reply::Deny(r) if r.starts_with("MR_BYTES limit 8192"))
        );
        // Rate-only verbs are admitted without a ticket.
        assert_eq!(s.handle(admit(Verb::QpModify, 0)), Reply::Ok);
        assert!(matches!(s.handle(admit(Verb::QpModify, 0)), Reply::Deny(_)));
        assert_eq!(s.live_tickets(), 1);
    }

    #[test]
    fn tickets_per_connection_are_bounded() {
        let quotas = Quotas::default();
        let mut s = session(&quotas, "carol", 2);
        assert_eq!(s.handle(admit(Verb::PdAlloc, 0)), Reply::Ticket(1));
        assert_eq!(s.handle(admit(Verb::CqCreate, 0)), Reply::Ticket(2));
        assert_eq!(
            s.handle(admit(Verb::CqCreate, 0)),
            Reply::Deny(
                "2 live tickets on one connection is the collector's maximum \
                 (--max-tickets-per-connection)"
                    .into()
            )
        );
    }

    #[test]
    fn rate_refusals_say_when_to_retry_and_requests_are_counted() {
        let quotas = Quotas::new(QuotaConfig::parse("CQ_CREATE 2\n", "q").expect("config"));
        let mut s = session(&quotas, "dave", 100);
        let started = std::time::Instant::now();
        assert_eq!(s.handle(admit(Verb::CqCreate, 0)), Reply::Ticket(1));
        assert_eq!(s.handle(admit(Verb::CqCreate, 0)), Reply::Ticket(2));
        let Reply::Deny(reason) = s.handle(admit(Verb::CqCreate, 0)) else {
            panic!("the third CQ within a second must be refused");
        };
        let (text, retry) = rdma_quota::wire::retry_after(&reason);
        assert_eq!(
            text,
            "CQ_CREATE limit 2/s exceeded globally (2 calls in the last second)"
        );
        // The first admission leaves the window one second after it was made.
        let retry = retry.expect("a rate refusal carries its retry time");
        let upper = std::time::Duration::from_secs(1);
        let lower = upper.saturating_sub(started.elapsed() + std::time::Duration::from_millis(1));
        assert!(
            retry <= upper && retry >= lower,
            "{retry:?} not in {lower:?}..={upper:?}"
        );
        // A count refusal has no clock: no retry time.
        let quotas = Quotas::new(QuotaConfig::parse("QP_COUNT 1\n", "q").expect("config"));
        let mut s2 = session(&quotas, "erin", 100);
        assert_eq!(s2.handle(admit(Verb::QpCreate, 0)), Reply::Ticket(1));
        let Reply::Deny(reason) = s2.handle(admit(Verb::QpCreate, 0)) else {
            panic!("over the QP count");
        };
        assert_eq!(rdma_quota::wire::retry_after(&reason).1, None, "{reason}");
        s.handle(Request::Stats);
        let line = s.ledger.activity.summary().expect("activity");
        assert!(line.ends_with(" requests=4 writes=0"), "{line}");
    }

    #[test]
    fn a_version_3_client_hears_how_long_an_admission_shuts_its_limit() {
        let config = "CQ_CREATE 2\ntenant gina QP_CREATE 1\n";
        let quotas = Quotas::new(QuotaConfig::parse(config, "q").expect("config"));
        // Without the HELLO (a version 2 interceptor): plain tickets, as
        // before, whatever the limits.
        let mut old = session(&quotas, "fred", 100);
        assert_eq!(old.handle(admit(Verb::CqCreate, 0)), Reply::Ticket(1));
        assert_eq!(old.handle(admit(Verb::CqCreate, 0)), Reply::Ticket(2));
        assert!(matches!(
            old.handle(admit(Verb::CqCreate, 0)),
            Reply::Deny(_)
        ));

        let mut s = session(&quotas, "gina", 100);
        let hello = |protocol| Request::Hello {
            comm: "verbs-churn".into(),
            protocol,
        };
        assert_eq!(s.handle(hello(None)), Reply::Ok);
        assert_eq!(s.handle(hello(Some(2))), Reply::Ok);
        assert_eq!(
            s.handle(admit(Verb::QpCreate, 0)),
            Reply::Ticket(1),
            "still version 2"
        );
        assert_eq!(s.handle(hello(Some(3))), Reply::OkWith("protocol=3".into()));
        // gina's own QP limit (1/s) is full since her first QP.
        let Reply::Deny(_) = s.handle(admit(Verb::QpCreate, 0)) else {
            panic!("gina's second QP within a second");
        };
        // The global CQ limit (2/s) is full with fred's two: refused as before.
        assert!(matches!(s.handle(admit(Verb::CqCreate, 0)), Reply::Deny(_)));
        // A verb without a rate limit is never held.
        assert_eq!(s.handle(admit(Verb::PdAlloc, 0)), Reply::Ticket(2));

        // Another tenant, on a limit that is not full until its second call:
        // the first admission is plain, the one that fills it says for how long.
        let quotas = Quotas::new(QuotaConfig::parse("MR_REG 2\n", "q").expect("config"));
        let mut h = session(&quotas, "hank", 100);
        h.handle(hello(Some(3)));
        let started = std::time::Instant::now();
        assert_eq!(h.handle(admit(Verb::MrReg, 4096)), Reply::Ticket(1));
        let Reply::Held { ticket, held } = h.handle(admit(Verb::MrReg, 4096)) else {
            panic!("the admission that fills the limit says how long it is full");
        };
        assert_eq!(ticket, 2);
        // Full until the first registration leaves the window, one second after it.
        let upper = std::time::Duration::from_secs(1);
        let lower = upper.saturating_sub(started.elapsed() + std::time::Duration::from_millis(1));
        assert!(
            held <= upper && held >= lower,
            "{held:?} not in {lower:?}..={upper:?}"
        );
        // And it is: the next call is refused for as long.
        let Reply::Deny(reason) = h.handle(admit(Verb::MrReg, 4096)) else {
            panic!("refused while held");
        };
        let retry = rdma_quota::wire::retry_after(&reason)
            .1
            .expect("retry time");
        // Asked later, so no longer than the hold (the wire rounds up to ms).
        let held_ms = std::time::Duration::from_millis(held.as_nanos().div_ceil(1_000_000) as u64);
        assert!(retry <= held_ms, "{retry:?} after a hold of {held:?}");
    }
}
