//! The node side of "a node answers for what it runs": every few seconds, and right after it
//! registers (again), a node reads back the sandboxes the store has on it and
//!
//! - stops those the cluster gave up on while it was away (the health sweep marked them gone
//!   when the node was declared dead: two live copies of a sandbox never exist, and what the API
//!   reports gone is gone);
//! - stops those past their deadline plus a grace, even when no API replica reaches it (the
//!   replicas' reaper ends sandboxes at their deadline; the node is the backstop). The row is the
//!   arbiter: the node stops one only once a guarded update marked it ended, so a TTL a replica
//!   extended meanwhile wins. While the store is unreachable the node goes by the deadlines it
//!   read last (a node cut off from the store for 5 s is declared dead anyway). Sandboxes that
//!   pause at their deadline (E2B `autoPause`) are left to the replicas: a node alone cannot
//!   record a pause;
//! - after a registration, takes back what the store still has on it (a restarted node's driver
//!   adopts them) and stops everything else it runs but its warm pool: what a previous process
//!   left behind, and what the cluster no longer assigns to it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_store::{NodeSandbox, SandboxState, Store};

use crate::node::Node;
use crate::node::driver::{DriverError, DriverHandle};

/// The reconciler's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileConfig {
    /// How long past its deadline a sandbox may run before the node stops it itself.
    pub deadline_grace: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            deadline_grace: Duration::from_secs(30),
        }
    }
}

/// What to do about one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The cluster marked it gone: stop what is left of it here.
    StopGone { id: String },
    /// Past its deadline and the grace: end it.
    Expire { id: String },
}

/// What the store's `rows` for this node call for at `now_ms`.
pub fn plan(rows: &[NodeSandbox], now_ms: i64, grace: Duration) -> Vec<Action> {
    let cut = now_ms.saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
    rows.iter()
        .filter_map(|r| match r.state {
            SandboxState::Dead => Some(Action::StopGone { id: r.id.clone() }),
            SandboxState::Running if r.end_at < cut && !r.pauses_on_timeout => {
                Some(Action::Expire { id: r.id.clone() })
            }
            _ => None,
        })
        .collect()
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Gone sandboxes whose leftovers were stopped.
    pub stopped_gone: usize,
    /// Sandboxes ended at their deadline.
    pub expired: usize,
    /// Sandboxes a restarted node took back.
    pub adopted: usize,
    /// Leftovers stopped after a registration.
    pub orphans: usize,
    /// The store did not answer: the round went by what it read last.
    pub offline: bool,
}

/// One node's reconciler.
pub struct Reconciler {
    store: Store,
    node_id: String,
    node: Arc<dyn Node>,
    cfg: ReconcileConfig,
    /// What the store said last, by id.
    known: HashMap<String, NodeSandbox>,
}

impl Reconciler {
    pub fn new(
        store: Store,
        node_id: impl Into<String>,
        node: Arc<dyn Node>,
        cfg: ReconcileConfig,
    ) -> Self {
        Reconciler {
            store,
            node_id: node_id.into(),
            node,
            cfg,
            known: HashMap::new(),
        }
    }

    /// One round at `now_ms`; `registered` after a (new) registration of this node.
    pub async fn round(&mut self, now_ms: i64, registered: bool) -> Reconciled {
        let mut done = Reconciled::default();
        match self.store.node_sandboxes(&self.node_id).await {
            Ok(rows) => self.known = rows.into_iter().map(|r| (r.id.clone(), r)).collect(),
            Err(e) => {
                tracing::warn!(node = %self.node_id, error = %e, "reading this node's sandboxes failed; going by the last answer");
                done.offline = true;
            }
        }
        let mut rows: Vec<NodeSandbox> = self.known.values().cloned().collect();
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        let grace = self.cfg.deadline_grace;
        for action in plan(&rows, now_ms, grace) {
            match action {
                Action::StopGone { id } => {
                    if self.stop(&id).await && !done.offline {
                        let _ = self.store.release_dead_handle(&id, &self.node_id).await;
                    }
                    self.known.remove(&id);
                    done.stopped_gone += 1;
                }
                Action::Expire { id } => {
                    let cut = now_ms.saturating_sub(grace.as_millis() as i64);
                    let ours = done.offline
                        || match self.store.expire_on_node(&id, &self.node_id, cut).await {
                            Ok(ours) => ours,
                            Err(e) => {
                                tracing::warn!(sandbox = %id, error = %e, "recording a deadline failed; trying again next round");
                                false
                            }
                        };
                    if ours {
                        tracing::warn!(sandbox = %id, grace_s = grace.as_secs(), "sandbox ran past its deadline and the grace with no API replica ending it: stopped by its node");
                        self.stop(&id).await;
                        self.known.remove(&id);
                        done.expired += 1;
                    }
                }
            }
        }
        if registered && !done.offline {
            self.take_back(&mut done).await;
        }
        // A round that did something says so (an offline one has warned already).
        if done.stopped_gone + done.expired + done.adopted + done.orphans > 0 {
            tracing::info!(node = %self.node_id, ?done, "node reconciled with the store");
        }
        done
    }

    /// After a registration: adopt what the store has running here, stop the rest but the
    /// warm pool.
    async fn take_back(&self, done: &mut Reconciled) {
        let mut keep: Vec<DriverHandle> = self.node.pool_members().await;
        for r in self
            .known
            .values()
            .filter(|r| r.state != SandboxState::Dead)
        {
            let Some(h) = self.handle_of(r) else { continue };
            if self.node.adopt(&h).await {
                done.adopted += 1;
            }
            keep.push(h);
        }
        match self.node.reclaim_orphans(&keep).await {
            Ok(n) => done.orphans = n,
            Err(e) => {
                tracing::warn!(node = %self.node_id, error = &e as &dyn std::error::Error, "stopping the sandboxes the cluster no longer assigns here failed")
            }
        }
    }

    fn handle_of(&self, r: &NodeSandbox) -> Option<DriverHandle> {
        match serde_json::from_str::<DriverHandle>(&r.driver_handle) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(sandbox = %r.id, error = %e, "unreadable handle in the store");
                None
            }
        }
    }

    /// Stops sandbox `id` if this node made it; whether it is gone now.
    async fn stop(&self, id: &str) -> bool {
        let Some(h) = self.known.get(id).and_then(|r| self.handle_of(r)) else {
            return true;
        };
        if !self.node.owns(&h) {
            return true;
        }
        match self.node.stop(&h).await {
            Ok(()) | Err(DriverError::NotRunning) => true,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = &e as &dyn std::error::Error, "stopping the sandbox failed; trying again next round");
                false
            }
        }
    }
}
