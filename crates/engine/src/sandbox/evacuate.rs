//! A node drain's evacuation: the sandboxes this engine drives on a draining node are paused
//! with their memory, one at a time, so that the node can stop (or restart) without losing a
//! session. Each resumes on its next request once its node is back, as an auto-resume one does
//! (its user never paused it; see `connect`). The checkpoint stays on that node's disk until
//! object storage lets another node restore it. A sandbox that cannot be paused (a driver
//! without checkpoints, a failed checkpoint) runs on, and the node waits it out.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::engine::Engine;
use crate::sandbox::lifecycle::{Operation, SandboxState};

/// What one evacuation did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Evacuated {
    /// Paused, by id.
    pub paused: Vec<String>,
    /// Whose pause failed, by id (they run on; the caller may skip them next time).
    pub failed: Vec<String>,
}

impl Engine {
    /// Pauses every running sandbox this engine drives on one of `nodes` (but those in `skip`).
    pub async fn evacuate(
        self: &Arc<Self>,
        nodes: &BTreeSet<String>,
        skip: &HashSet<String>,
    ) -> Evacuated {
        let mut done = Evacuated::default();
        if nodes.is_empty() || !self.node.capabilities().checkpoint {
            return done;
        }
        let mut ids: Vec<String> = self
            .live
            .lock()
            .iter()
            .filter(|(id, l)| {
                l.state == SandboxState::Running
                    && !skip.contains(*id)
                    && l.agent.is_supported()
                    && l.handle
                        .as_ref()
                        .and_then(|h| h.node.as_ref())
                        .is_some_and(|n| nodes.contains(n))
            })
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        for id in ids {
            // Entered here: a user's own pause or kill meanwhile wins.
            if self.live.enter(&id, Operation::Pause).is_err() {
                continue;
            }
            match crate::sandbox::pause::pause_entered(self, &id, true, Operation::Pause).await {
                Ok(()) => {
                    self.mark_resume_on_traffic(&id).await;
                    tracing::info!(sandbox = %id, "paused for its node's drain; its next request resumes it");
                    done.paused.push(id);
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = &e as &dyn std::error::Error, "pausing for a node drain failed; the sandbox runs on");
                    done.failed.push(id);
                }
            }
        }
        done
    }

    async fn mark_resume_on_traffic(&self, id: &str) {
        {
            let mut live = self.live.lock();
            let Some(p) = live.get_mut(id).and_then(|l| l.extra.paused.as_mut()) else {
                return;
            };
            p.resume_on_traffic = true;
        }
        let recorded = async {
            if let Some(mut p) = self.store.get_persistence(id).await? {
                p.resume_on_traffic = true;
                self.store.upsert_persistence(&p).await?;
            }
            Ok::<_, bulkhead_store::StoreError>(())
        };
        if let Err(e) = recorded.await {
            tracing::error!(sandbox = %id, error = &e as &dyn std::error::Error, "recording a drain's pause failed; after a restart of this replica the sandbox resumes on a connect only");
        }
    }
}
