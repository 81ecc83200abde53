//! The node side of membership: register once, then report every second. A refused heartbeat
//! (the sweep declared the node dead, or another process registered under its id) means this
//! incarnation is over: the next beat registers again and gets a new epoch, and the caller
//! learns it so it can drop what the cluster no longer assigns to it.

use bulkhead_store::{ReportedStatus, Store, StoreError};

use super::report::NodeReport;

/// One node's membership.
#[derive(Debug)]
pub struct Heartbeat {
    store: Store,
    id: String,
    addr: String,
    epoch: Option<u64>,
    /// The last accepted heartbeat said an operator asked this node to drain.
    drain_requested: bool,
}

/// What a beat did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beat {
    /// Reported under the epoch it had.
    Reported { epoch: u64 },
    /// Registered: the first beat, or a new incarnation after the old one was refused.
    Registered { epoch: u64, previous: Option<u64> },
}

impl Beat {
    pub fn epoch(self) -> u64 {
        match self {
            Beat::Reported { epoch } | Beat::Registered { epoch, .. } => epoch,
        }
    }
}

impl Heartbeat {
    pub fn new(store: Store, id: impl Into<String>, addr: impl Into<String>) -> Self {
        Heartbeat {
            store,
            id: id.into(),
            addr: addr.into(),
            epoch: None,
            drain_requested: false,
        }
    }

    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// Whether an operator asked this node to drain (`bulkhead node drain`), as of the last
    /// accepted heartbeat (a registration clears it).
    pub fn drain_requested(&self) -> bool {
        self.drain_requested
    }

    /// Reports `report` (registering when needed). `draining` nodes take nothing new.
    pub async fn beat(
        &mut self,
        report: &NodeReport,
        draining: bool,
        now_ms: i64,
    ) -> Result<Beat, StoreError> {
        let json = report.to_json();
        let status = if draining {
            ReportedStatus::Draining
        } else {
            ReportedStatus::Ready
        };
        if let Some(epoch) = self.epoch {
            match self
                .store
                .heartbeat(&self.id, epoch, status, &json, now_ms)
                .await
            {
                Ok(drain) => {
                    self.drain_requested = drain;
                    return Ok(Beat::Reported { epoch });
                }
                Err(StoreError::StaleEpoch { reason, .. }) => {
                    tracing::warn!(node = %self.id, epoch, %reason, "heartbeat refused; registering again");
                }
                Err(e) => return Err(e),
            }
        }
        let previous = self.epoch;
        self.drain_requested = false;
        let row = self
            .store
            .register_node(&self.id, &self.addr, &json, now_ms)
            .await?;
        if draining {
            self.store
                .heartbeat(&self.id, row.epoch, status, &json, now_ms)
                .await?;
        }
        self.epoch = Some(row.epoch);
        Ok(Beat::Registered {
            epoch: row.epoch,
            previous,
        })
    }
}
