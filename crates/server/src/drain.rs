//! Draining a node so that stopping or rolling it loses nothing.
//!
//! - **node** ([`Drainer`]): asked to stop (SIGTERM) it reports `draining` (no new placements)
//!   and waits until the store has nothing running on it, then stops serving. An operator's
//!   `bulkhead node drain` asks the same through the store (the node is `draining` from its next
//!   heartbeat on) without stopping it.
//! - **api** ([`evacuate_loop`]): every second each replica pauses, with their memory, the
//!   sandboxes it drives on draining nodes (`Engine::evacuate`); each resumes on its next request
//!   once its node is back. Sandboxes that cannot be paused run on; the node waits them out
//!   until its drain timeout.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bulkhead_engine::Engine;
use bulkhead_store::{NodeStatus, SandboxState, Store};

/// How often a drain looks again.
const POLL: Duration = Duration::from_millis(500);

/// A node's drain: the flag its heartbeat reports, and the wait for its sandboxes to go.
#[derive(Clone)]
pub struct Drainer {
    store: Store,
    node_id: String,
    flag: Arc<AtomicBool>,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Nothing runs on the node any more.
    Empty,
    /// The timeout passed with sandboxes still running (they keep running; a node that comes
    /// back within the dead threshold keeps them, else the cluster reports them gone).
    TimedOut { running: usize },
}

impl Drainer {
    pub(crate) fn new(store: Store, node_id: &str) -> Self {
        Drainer {
            store,
            node_id: node_id.to_string(),
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether this process was asked to drain (its heartbeat reports `draining`).
    pub fn is_draining(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Stops new placements and waits (at most `timeout`) until nothing runs here.
    pub async fn drain(&self, timeout: Duration) -> Drained {
        self.flag.store(true, Ordering::SeqCst);
        tracing::warn!(node = %self.node_id, timeout_s = timeout.as_secs(), "draining: no new sandboxes; waiting for the running ones to be paused or to end");
        let node = &self.node_id;
        let drained = wait_until_empty(&self.store, node, timeout, |running| {
            tracing::info!(node = %node, running, "draining");
        })
        .await;
        if drained == Drained::Empty {
            tracing::info!(node = %node, "drained: nothing runs here");
        }
        drained
    }
}

/// Waits (at most `timeout`) until the store has nothing running on `node`, telling
/// `progress` each new count (`bulkhead node drain --wait` follows a drain the same way).
pub async fn wait_until_empty(
    store: &Store,
    node: &str,
    timeout: Duration,
    mut progress: impl FnMut(usize),
) -> Drained {
    let deadline = Instant::now() + timeout;
    let mut said = None;
    loop {
        let running = match running_on(store, node).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading the node's sandboxes failed; retrying");
                said.unwrap_or(usize::MAX)
            }
        };
        if running == 0 {
            return Drained::Empty;
        }
        if said != Some(running) {
            progress(running);
            said = Some(running);
        }
        if Instant::now() >= deadline {
            return Drained::TimedOut { running };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Sandboxes the store has running (or on their way) on `node`.
async fn running_on(store: &Store, node: &str) -> Result<usize, bulkhead_store::StoreError> {
    Ok(store
        .node_sandboxes(node)
        .await?
        .iter()
        .filter(|r| r.state != SandboxState::Dead)
        .count())
}

/// An API replica's part in drains: pause what it drives on draining nodes.
pub(crate) async fn evacuate_loop(store: Store, engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Sandboxes whose pause failed: not tried again while their node drains.
    let mut failed = HashSet::new();
    loop {
        tick.tick().await;
        let draining: BTreeSet<String> = match store.list_nodes().await {
            Ok(rows) => rows
                .into_iter()
                .filter(|n| n.status == NodeStatus::Draining)
                .map(|n| n.id)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "listing the cluster's nodes failed");
                continue;
            }
        };
        if draining.is_empty() {
            failed.clear();
            continue;
        }
        let done = engine.evacuate(&draining, &failed).await;
        failed.extend(done.failed);
    }
}
