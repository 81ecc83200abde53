//! Taking sandboxes over from silent replicas, and giving up the ones taken from this one.

use std::sync::Arc;

use crate::background::recovery::Adoption;
use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::SandboxState;

use super::DEAD_AFTER;

impl Engine {
    /// Takes over the sandboxes (all, or only `only`) of replicas silent for [`DEAD_AFTER`],
    /// and drives each as after a restart: a running one is adopted through its node and
    /// watched, a paused one kept with its checkpoint. Returns how many it took. Rounds are
    /// serialised, so a request never sees a sandbox taken but not yet tracked.
    pub async fn take_over(self: &Arc<Self>, only: Option<&str>) -> Result<usize, EngineError> {
        let Some(me) = self.cfg.replica.as_deref() else {
            return Ok(0);
        };
        let _round = self.takeover.lock().await;
        let rows = self
            .store
            .take_over_sandboxes(me, now_ms(), DEAD_AFTER, only)
            .await?;
        let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        for row in rows {
            let id = row.id.clone();
            tracing::info!(sandbox = %id, state = %row.state, "taking over a sandbox of a silent API replica");
            if let Err(e) = self.adopt_row(row, Adoption::TakeOver).await {
                tracing::error!(sandbox = %id, error = &e as &dyn std::error::Error, "could not take over the sandbox; it stays owned here and is tried again on its next request");
            }
        }
        if !ids.is_empty() {
            self.resume_metering_of(&ids).await?;
        }
        Ok(ids.len())
    }

    /// Checks the live set against the store: a sandbox another replica took over (this one
    /// was silent too long) leaves the live set without any call to its node, since its new
    /// owner drives it; one the node-health sweep marked lost with its node is forgotten.
    /// Returns how many were given up.
    pub async fn release_taken(&self) -> Result<usize, EngineError> {
        let Some(me) = self.cfg.replica.as_deref() else {
            return Ok(0);
        };
        let ids: Vec<String> = self.live.lock().keys().cloned().collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut lost = Vec::new();
        let mut released = 0;
        for o in self.store.sandbox_owners(&ids).await? {
            if o.owner_replica.as_deref().is_some_and(|owner| owner != me) {
                let gone = self.live.lock().remove(&o.id);
                if let Some(l) = gone {
                    l.cancel.cancel();
                    l.traffic.cancel();
                    tracing::warn!(sandbox = %o.id, owner = ?o.owner_replica, "another API replica took this sandbox over while this one was silent; no longer driving it");
                    released += 1;
                }
            } else if o.state == SandboxState::Dead.into()
                // One being killed here is ended by its kill.
                && self.live.lock().get(&o.id).is_some_and(|l| l.state != SandboxState::Killing)
            {
                lost.push(o.id);
            }
        }
        self.live.notify();
        if !lost.is_empty() {
            released += self.forget_lost(&lost).await;
        }
        Ok(released)
    }
}
