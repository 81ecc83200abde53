//! The sweep that notices dead nodes. One replica at a time does it: each round, every replica
//! tries to take or renew the `node-health` lease, and only its holder sweeps, with the lease's
//! epoch as the fencing token (a holder that lost the lease without knowing is refused by the
//! store). Thresholds follow the issue: a heartbeat older than 3 s makes a node suspect (no
//! new placements), 5 s dead (its epoch bumped, so its old incarnation is refused), and the
//! sandboxes it ran are gone (E2B's not-found from then on; paused ones stay paused).

use std::time::Duration;

use bulkhead_store::{
    LeaseEpoch, LostSandbox, NODE_HEALTH_LEASE, NodeTransition, Store, StoreError,
};

/// The sweep's timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    pub suspect_after: Duration,
    pub dead_after: Duration,
    /// How long the lease lasts without renewal (a holder that died is replaced after it).
    pub lease_ttl: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            suspect_after: Duration::from_secs(3),
            dead_after: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(10),
        }
    }
}

/// One replica's part in the sweep.
#[derive(Debug)]
pub struct HealthSweeper {
    store: Store,
    /// Names this process: a replica id plus its start, so a restarted replica is a new holder.
    holder: String,
    cfg: HealthConfig,
    held: Option<LeaseEpoch>,
    /// When this replica last reached the store (unix ms).
    last_ok: Option<i64>,
    /// No node is declared anything before this (unix ms): after the store was out of reach,
    /// the nodes' heartbeats were too, and they get a full dead threshold to report again.
    quiet_until: i64,
}

/// What one round did.
#[derive(Debug, PartialEq, Eq)]
pub enum Sweep {
    /// Another replica holds the lease.
    NotHolder,
    /// Swept under this epoch; status changes made, and the sandboxes of dead nodes marked
    /// gone (the engine forgets them: [`crate::Engine::forget_lost`]).
    Swept {
        epoch: u64,
        changes: Vec<NodeTransition>,
        lost: Vec<LostSandbox>,
    },
}

impl HealthSweeper {
    pub fn new(store: Store, holder: impl Into<String>, cfg: HealthConfig) -> Self {
        HealthSweeper {
            store,
            holder: holder.into(),
            cfg,
            held: None,
            last_ok: None,
            quiet_until: 0,
        }
    }

    /// One round at `now_ms`: hold the lease (renew it, or take it if free), then sweep.
    pub async fn round(&mut self, now_ms: i64) -> Result<Sweep, StoreError> {
        let result = self.round_inner(now_ms).await;
        if result.is_ok() {
            self.last_ok = Some(now_ms);
        }
        result
    }

    async fn round_inner(&mut self, now_ms: i64) -> Result<Sweep, StoreError> {
        // Back after the store was out of reach (restarted, cut off) for longer than a node
        // may be silent: every heartbeat looks late, through no fault of the nodes.
        let outage = self
            .last_ok
            .is_some_and(|at| now_ms - at > duration_ms(self.cfg.suspect_after));
        if outage {
            self.quiet_until = now_ms + duration_ms(self.cfg.dead_after);
            tracing::warn!(
                quiet_ms = duration_ms(self.cfg.dead_after),
                "the store was out of reach: no node is declared suspect or dead until they had time to report again"
            );
        }
        let ttl = self.cfg.lease_ttl;
        let mut held = None;
        if let Some(epoch) = self.held {
            match self
                .store
                .renew_lease(NODE_HEALTH_LEASE, &self.holder, epoch, ttl, now_ms)
                .await
            {
                Ok(()) => held = Some(epoch),
                Err(StoreError::LeaseLost { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if held.is_none() {
            held = self
                .store
                .acquire_lease(NODE_HEALTH_LEASE, &self.holder, ttl, now_ms)
                .await?;
        }
        self.held = held;
        let Some(epoch) = held else {
            return Ok(Sweep::NotHolder);
        };
        if now_ms < self.quiet_until {
            return Ok(Sweep::Swept {
                epoch: epoch.0,
                changes: Vec::new(),
                lost: Vec::new(),
            });
        }
        match self
            .store
            .sweep_nodes(now_ms, self.cfg.suspect_after, self.cfg.dead_after, epoch)
            .await
        {
            Ok(out) => {
                for c in &out.changes {
                    tracing::warn!(node = %c.id, from = %c.from, to = %c.to, epoch = c.epoch, "node status changed by the health sweep");
                }
                for l in &out.lost {
                    tracing::warn!(sandbox = %l.id, node = %l.node, "sandbox lost with its node");
                }
                Ok(Sweep::Swept {
                    epoch: epoch.0,
                    changes: out.changes,
                    lost: out.lost,
                })
            }
            Err(StoreError::Fenced { .. }) => {
                self.held = None;
                Ok(Sweep::NotHolder)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (at shutdown), so another replica takes over at once.
    pub async fn release(&mut self, now_ms: i64) -> Result<(), StoreError> {
        if let Some(epoch) = self.held.take() {
            self.store
                .release_lease(NODE_HEALTH_LEASE, &self.holder, epoch, now_ms)
                .await?;
        }
        Ok(())
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
