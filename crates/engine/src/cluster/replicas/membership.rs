//! An API replica's registration: register once, then heartbeat every [`super::BEAT`]. A
//! refused heartbeat (the replica was silent longer than [`super::DEAD_AFTER`], so others may
//! have taken its sandboxes, or another process registered under its id) ends this
//! incarnation: the beat registers again under a new epoch and says so, and the caller drops
//! from its live set what is no longer its own ([`crate::Engine::release_taken`]).

use bulkhead_store::{Store, StoreError};

use super::{DEAD_AFTER, ReplicaError};
use crate::cluster::heartbeat::Beat;

/// One replica's membership.
#[derive(Debug)]
pub struct Membership {
    store: Store,
    id: String,
    addr: String,
    epoch: Option<u64>,
}

impl Membership {
    /// Replica `id`, which the others reach at `addr` (`http://host:port`).
    pub fn new(store: Store, id: impl Into<String>, addr: impl Into<String>) -> Self {
        Membership {
            store,
            id: id.into(),
            addr: addr.into(),
            epoch: None,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// Heartbeats at `now_ms`, registering first when needed.
    pub async fn beat(&mut self, now_ms: i64) -> Result<Beat, ReplicaError> {
        if let Some(epoch) = self.epoch {
            match self
                .store
                .heartbeat_replica(&self.id, epoch, now_ms, DEAD_AFTER)
                .await
            {
                Ok(()) => return Ok(Beat::Reported { epoch }),
                Err(StoreError::ReplicaStale { .. }) => {
                    tracing::warn!(replica = %self.id, epoch, "heartbeat refused (late or superseded); registering again");
                }
                Err(source) => {
                    return Err(ReplicaError::Heartbeat {
                        replica: self.id.clone(),
                        source,
                    });
                }
            }
        }
        let previous = self.epoch;
        let row = self
            .store
            .register_replica(&self.id, &self.addr, now_ms)
            .await
            .map_err(|source| ReplicaError::Register {
                replica: self.id.clone(),
                source,
            })?;
        self.epoch = Some(row.epoch);
        Ok(Beat::Registered {
            epoch: row.epoch,
            previous,
        })
    }

    /// A clean stop: the others take this replica's sandboxes at once.
    pub async fn retire(&self) {
        let Some(epoch) = self.epoch else { return };
        if let Err(e) = self.store.retire_replica(&self.id, epoch).await {
            tracing::warn!(replica = %self.id, error = %e, "could not retire the replica; the others take its sandboxes once its heartbeat is old");
        }
    }
}
