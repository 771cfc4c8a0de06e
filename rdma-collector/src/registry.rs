//! Who is connected and what they hold: the global and per-uid connection
//! caps, the ticket caps per connection, per uid and per tenant, and which
//! connection to close when a new one needs room.
//!
//! One lock over small maps; every operation is a few hash lookups, except
//! choosing a connection to close, which scans the connections (at most
//! `max_connections`) and only runs when the collector is full.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::bounds::{hint, BoundNames, ConnectionBounds};

/// A connection's number, unique for the collector's life.
pub(crate) type ConnId = u64;

/// Why a new connection is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its uid has `limit` connections, all holding tickets.
    PerUid { uid: u32, limit: usize },
    /// The collector has `limit` connections, all holding tickets.
    Full { limit: usize },
}

impl Refused {
    /// What the refused program is told; `names` say how to raise a bound.
    pub(crate) fn reason(&self, names: &BoundNames) -> String {
        match self {
            Refused::PerUid { uid, limit } => {
                format!("too many connections for uid {uid} (limit {limit})")
            }
            Refused::Full { limit } => format!(
                "the collector is at its limit of {limit} connections, all holding \
                 tickets{}; try again later",
                hint(names.max_connections.as_ref())
            ),
        }
    }
}

/// Why a ticket is refused by the collector's own bounds (not by a quota).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TicketCap {
    Connection(usize),
    Uid(u32, usize),
    Tenant(String, usize),
    /// The connection is being closed to make room (it had no tickets).
    Closing,
}

impl TicketCap {
    /// What the program denied a ticket is told; `names` say how to raise a
    /// bound.
    pub(crate) fn reason(&self, names: &BoundNames) -> String {
        match self {
            TicketCap::Connection(n) => format!(
                "{n} live tickets on one connection is the collector's maximum{}",
                hint(names.tickets.as_ref())
            ),
            TicketCap::Uid(uid, n) => format!(
                "{n} live tickets for uid {uid} is the collector's maximum{}",
                hint(names.tickets_per_uid.as_ref())
            ),
            TicketCap::Tenant(tenant, n) => format!(
                "{n} live tickets for tenant {tenant} is the collector's maximum{}",
                hint(names.tickets_per_tenant.as_ref())
            ),
            TicketCap::Closing => "the collector is closing this idle connection".to_owned(),
        }
    }
}

struct Entry {
    uid: u32,
    tenant: Option<String>,
    tickets: usize,
    last_active: Instant,
    /// Chosen to be closed; it has no tickets and will get none.
    closing: bool,
    wake: Arc<Notify>,
}

/// The connections and their counts.
pub(crate) struct Registry {
    bounds: ConnectionBounds,
    names: BoundNames,
    next_id: ConnId,
    conns: HashMap<ConnId, Entry>,
    /// Connections not yet closing, per uid, and in all.
    open_per_uid: HashMap<u32, usize>,
    open: usize,
    tickets_per_uid: HashMap<u32, usize>,
    tickets_per_tenant: HashMap<String, usize>,
}

/// A connection was opened: its id, what wakes its task to close, and how
/// many other connections were chosen to close to make room.
pub(crate) struct Opened {
    pub(crate) id: ConnId,
    pub(crate) wake: Arc<Notify>,
    pub(crate) evicted: u64,
}

impl Registry {
    pub(crate) fn new(bounds: ConnectionBounds) -> Registry {
        Registry {
            bounds,
            names: BoundNames::default(),
            next_id: 1,
            conns: HashMap::new(),
            open_per_uid: HashMap::new(),
            open: 0,
            tickets_per_uid: HashMap::new(),
            tickets_per_tenant: HashMap::new(),
        }
    }

    /// The same registry, its refusals naming the bounds as `names` do.
    pub(crate) fn with_names(mut self, names: BoundNames) -> Registry {
        self.names = names;
        self
    }

    pub(crate) fn bounds(&self) -> &ConnectionBounds {
        &self.bounds
    }

    /// What the bounds are called, for refusals.
    pub(crate) fn names(&self) -> &BoundNames {
        &self.names
    }

    /// Connections open (not being closed).
    pub(crate) fn open(&self) -> usize {
        self.open
    }

    /// Connections whose task has not ended yet, closing ones included: each
    /// still holds a descriptor.
    pub(crate) fn held(&self) -> usize {
        self.conns.len()
    }

    /// Live tickets of all connections.
    pub(crate) fn tickets(&self) -> usize {
        self.tickets_per_uid.values().sum()
    }

    /// Registers a new connection of `uid`, closing an idle ticketless one if
    /// a cap is reached: one of the same uid for the per-uid cap, otherwise
    /// the longest idle of the uid with the most connections, so that whoever
    /// holds the most pays first.
    pub(crate) fn open_connection(&mut self, uid: u32, now: Instant) -> Result<Opened, Refused> {
        let mut evicted = 0;
        let of_uid = self.open_per_uid.get(&uid).copied().unwrap_or(0);
        if of_uid >= self.bounds.per_uid {
            if !self.evict(now, Some(uid)) {
                return Err(Refused::PerUid {
                    uid,
                    limit: self.bounds.per_uid,
                });
            }
            evicted += 1;
        }
        if self.open >= self.bounds.max_connections {
            if !self.evict(now, None) {
                return Err(Refused::Full {
                    limit: self.bounds.max_connections,
                });
            }
            evicted += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let wake = Arc::new(Notify::new());
        self.conns.insert(
            id,
            Entry {
                uid,
                tenant: None,
                tickets: 0,
                last_active: now,
                closing: false,
                wake: Arc::clone(&wake),
            },
        );
        *self.open_per_uid.entry(uid).or_default() += 1;
        self.open += 1;
        Ok(Opened { id, wake, evicted })
    }

    /// Chooses a ticketless connection (of `uid` only, if given), marks it
    /// closing and wakes its task; false if there is none.
    pub(crate) fn evict(&mut self, now: Instant, uid: Option<u32>) -> bool {
        let per_uid = &self.open_per_uid;
        let victim = self
            .conns
            .iter()
            .filter(|(_, e)| !e.closing && e.tickets == 0 && uid.is_none_or(|u| u == e.uid))
            .max_by_key(|(_, e)| {
                (
                    per_uid.get(&e.uid).copied().unwrap_or(0),
                    now.saturating_duration_since(e.last_active),
                )
            })
            .map(|(id, _)| *id);
        let Some(id) = victim else {
            return false;
        };
        self.mark_closing(id);
        true
    }

    fn mark_closing(&mut self, id: ConnId) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        if e.closing {
            return;
        }
        e.closing = true;
        e.wake.notify_one();
        let uid = e.uid;
        self.open -= 1;
        decrement(&mut self.open_per_uid, &uid, 1);
    }

    /// The connection's task has ended.
    pub(crate) fn close_connection(&mut self, id: ConnId) {
        self.mark_closing(id);
        if let Some(e) = self.conns.remove(&id) {
            // The session released its tickets before; in case it did not.
            if e.tickets > 0 {
                decrement(&mut self.tickets_per_uid, &e.uid, e.tickets);
                if let Some(t) = &e.tenant {
                    decrement(&mut self.tickets_per_tenant, t, e.tickets);
                }
            }
        }
    }

    /// The tenant of a connection, once identified.
    pub(crate) fn set_tenant(&mut self, id: ConnId, tenant: &str) {
        if let Some(e) = self.conns.get_mut(&id) {
            e.tenant = Some(tenant.to_owned());
        }
    }

    /// A request arrived on the connection.
    pub(crate) fn touch(&mut self, id: ConnId, now: Instant) {
        if let Some(e) = self.conns.get_mut(&id) {
            e.last_active = now;
        }
    }

    /// Whether the connection was chosen to close.
    #[cfg(test)]
    pub(crate) fn closing(&self, id: ConnId) -> bool {
        self.conns.get(&id).is_none_or(|e| e.closing)
    }

    /// Takes one ticket for the connection, within every cap.
    pub(crate) fn reserve_ticket(&mut self, id: ConnId) -> Result<(), TicketCap> {
        let b = self.bounds;
        let Some(e) = self.conns.get_mut(&id) else {
            return Err(TicketCap::Closing);
        };
        if e.closing {
            return Err(TicketCap::Closing);
        }
        if e.tickets >= b.tickets {
            return Err(TicketCap::Connection(b.tickets));
        }
        let of_uid = self.tickets_per_uid.get(&e.uid).copied().unwrap_or(0);
        if of_uid >= b.tickets_per_uid {
            return Err(TicketCap::Uid(e.uid, b.tickets_per_uid));
        }
        if let Some(t) = &e.tenant {
            let of_tenant = self.tickets_per_tenant.get(t).copied().unwrap_or(0);
            if of_tenant >= b.tickets_per_tenant {
                return Err(TicketCap::Tenant(t.clone(), b.tickets_per_tenant));
            }
            *self.tickets_per_tenant.entry(t.clone()).or_default() += 1;
        }
        e.tickets += 1;
        *self.tickets_per_uid.entry(e.uid).or_default() += 1;
        Ok(())
    }

    /// Gives back `n` tickets of the connection.
    pub(crate) fn release_tickets(&mut self, id: ConnId, n: usize) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        let n = n.min(e.tickets);
        e.tickets -= n;
        decrement(&mut self.tickets_per_uid, &e.uid, n);
        if let Some(t) = &e.tenant {
            decrement(&mut self.tickets_per_tenant, t, n);
        }
    }
}

fn decrement<K: std::hash::Hash + Eq + Clone>(map: &mut HashMap<K, usize>, key: &K, n: usize) {
    if let Some(v) = map.get_mut(key) {
        *v = v.saturating_sub(n);
        if *v == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The names the `rdma-collector` binary gives its bounds (its flags).
    fn flag_names() -> BoundNames {
        BoundNames {
            max_connections: Some("--max-connections".into()),
            tickets: Some("--max-tickets-per-connection".into()),
            tickets_per_uid: Some("--max-tickets-per-uid".into()),
            tickets_per_tenant: Some("--max-tickets-per-tenant".into()),
        }
    }

    fn bounds() -> ConnectionBounds {
        ConnectionBounds {
            max_connections: 4,
            per_uid: 3,
            tickets: 3,
            tickets_per_uid: 4,
            tickets_per_tenant: 5,
            ..ConnectionBounds::default()
        }
    }

    #[test]
    fn ticket_caps_per_connection_uid_and_tenant() {
        let mut r = Registry::new(bounds());
        let t0 = Instant::now();
        let a1 = r.open_connection(1000, t0).expect("a1").id;
        let a2 = r.open_connection(1000, t0).expect("a2").id;
        let b1 = r.open_connection(1001, t0).expect("b1").id;
        for id in [a1, a2, b1] {
            r.set_tenant(id, "/shared");
        }
        for _ in 0..3 {
            r.reserve_ticket(a1).expect("a1 ticket");
        }
        assert_eq!(r.reserve_ticket(a1), Err(TicketCap::Connection(3)));
        r.reserve_ticket(a2).expect("a2 ticket");
        assert_eq!(r.reserve_ticket(a2), Err(TicketCap::Uid(1000, 4)));
        // uid 1001 shares the tenant, which has 4 of its 5.
        r.reserve_ticket(b1).expect("b1 ticket");
        assert_eq!(
            r.reserve_ticket(b1),
            Err(TicketCap::Tenant("/shared".into(), 5))
        );
        assert_eq!(
            TicketCap::Tenant("/shared".into(), 5).reason(&flag_names()),
            "5 live tickets for tenant /shared is the collector's maximum (--max-tickets-per-tenant)"
        );
        assert_eq!(r.tickets(), 5);
        r.release_tickets(a1, 3);
        r.reserve_ticket(b1).expect("room again");
        r.close_connection(b1);
        r.close_connection(a2);
        assert_eq!(r.tickets(), 0);
    }

    #[test]
    fn full_collector_closes_the_idlest_ticketless_connection_of_the_biggest_uid() {
        let mut r = Registry::new(ConnectionBounds {
            max_connections: 5,
            ..bounds()
        });
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let busy = r.open_connection(1, t0).expect("busy").id;
        r.reserve_ticket(busy).expect("ticket");
        let quiet = r.open_connection(1, t0).expect("quiet").id;
        let hog1 = r.open_connection(2, t0).expect("hog1").id;
        let hog2 = r.open_connection(2, t0).expect("hog2").id;
        let hog3 = r.open_connection(2, t0).expect("hog3").id;
        r.touch(hog1, later);
        r.touch(hog2, t0 + Duration::from_secs(1));
        // Full (5): uid 2 has the most connections, and hog3 is its idlest;
        // uid 1's connection, as idle, is spared.
        let opened = r.open_connection(3, later).expect("room made");
        assert_eq!(opened.evicted, 1);
        assert!(r.closing(hog3));
        assert!(!r.closing(hog1) && !r.closing(hog2) && !r.closing(quiet));
        // A connection that holds tickets is never chosen.
        assert!(!r.closing(busy));
        assert_eq!(r.reserve_ticket(hog3), Err(TicketCap::Closing));
        // Per uid: uid 3's own idle connection makes room for its next.
        let mut r = Registry::new(bounds());
        let a = r.open_connection(7, t0).expect("a").id;
        let b = r.open_connection(7, t0).expect("b").id;
        let c = r.open_connection(7, t0).expect("c").id;
        for id in [a, b, c] {
            r.reserve_ticket(id).expect("ticket");
        }
        assert_eq!(
            r.open_connection(7, later).err(),
            Some(Refused::PerUid { uid: 7, limit: 3 })
        );
        r.release_tickets(c, 1);
        r.open_connection(7, later).expect("c made room");
        assert!(r.closing(c));
        // Everyone holds tickets: refused, with the flag to raise.
        let mut r = Registry::new(ConnectionBounds {
            max_connections: 1,
            ..bounds()
        });
        let only = r.open_connection(1, t0).expect("only").id;
        r.reserve_ticket(only).expect("ticket");
        let refused = r.open_connection(2, t0).err().expect("full");
        assert!(
            refused.reason(&flag_names()).contains("--max-connections"),
            "{refused:?}"
        );
        // Without names, the limit and no hint: the library knows no flags.
        assert_eq!(
            refused.reason(&BoundNames::default()),
            "the collector is at its limit of 1 connections, all holding tickets; try again later"
        );
    }
}
