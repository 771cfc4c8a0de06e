//! Where a client's session and lane resources come from: a shared receive queue per device
//! ([`ClientConfig::shared_receive_queue`](super::ClientConfig::shared_receive_queue)), the
//! connector's warm pools ([`crate::warm`]), or made on the connection's path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::session::{Prepared, Secrets, SessionConfig, SessionError};
use crate::shared_queue::SharedQueue;
use crate::verbs::{Device, GidEntry};
use crate::warm::{Path, WarmPools};

/// A connector's sources of session resources, shared by its connections and their lanes.
pub(crate) struct Provision {
    pub(crate) warm: Arc<WarmPools>,
    /// Receive slots of the shared queue made per device; 0 for none.
    shared_slots: usize,
    shared: Mutex<HashMap<String, Arc<SharedQueue>>>,
}

impl Provision {
    pub(crate) fn new(warm_pool: usize, shared_slots: usize) -> Provision {
        Provision {
            warm: Arc::new(WarmPools::new(warm_pool)),
            shared_slots,
            shared: Mutex::default(),
        }
    }

    /// Resources for a session or lane of `config` on `device`: on the device's shared queue
    /// when there is one for sessions of its size, from a warm pool, or made now.
    pub(crate) fn prepare(
        &self,
        device: &Arc<Device>,
        sgid: &GidEntry,
        secrets: Secrets,
        config: SessionConfig,
    ) -> (Result<Prepared, SessionError>, Path) {
        if let Some(queue) = self.queue(device, &config) {
            return (
                Prepared::on_shared(&queue, sgid.clone(), secrets, config),
                Path::Cold,
            );
        }
        self.warm.prepare(device, sgid, secrets, config)
    }

    /// A ready resource from the warm pool of `config`'s kind, and nothing made when none is:
    /// for a QP wanted before the hello. `None` with a shared receive queue, whose sessions
    /// take no warm resource.
    pub(crate) fn take_warm(
        &self,
        device: &Arc<Device>,
        sgid: &GidEntry,
        config: &SessionConfig,
    ) -> Option<crate::session::Resources> {
        if self.shared_slots > 0 {
            return None;
        }
        self.warm.take(device, sgid, config)
    }

    /// `device`'s shared queue, made by the first session that asks, if sessions of `config`
    /// fit it. A session that does not (its messages are larger than the slots, made for the
    /// first session's size) or a device that cannot have one (no type 2 memory windows) gets
    /// queues of its own: slower to set up and larger, never refused for it.
    fn queue(&self, device: &Arc<Device>, config: &SessionConfig) -> Option<Arc<SharedQueue>> {
        if self.shared_slots == 0 {
            return None;
        }
        let slot_len = config.shape().recv_len();
        let mut queues = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let queue = match queues.get(device.name()) {
            Some(q) => Arc::clone(q),
            None => match SharedQueue::new(device, self.shared_slots, slot_len) {
                Ok(q) => {
                    tracing::info!(device = %device.name(), slots = q.slots(), slot_len = q.slot_len(), "shared receive queue made");
                    queues.insert(device.name().to_owned(), Arc::clone(&q));
                    q
                }
                Err(e) => {
                    tracing::warn!(device = %device.name(), error = %e, "no shared receive queue; each session makes its own queues");
                    return None;
                }
            },
        };
        if slot_len > queue.slot_len() {
            tracing::debug!(
                slot_len,
                queue_slot_len = queue.slot_len(),
                "a session's messages are larger than the shared queue's slots; it makes its own queues"
            );
            return None;
        }
        Some(queue)
    }
}
