//! Kill: the one way a sandbox ends (killed, timed out, exited, paused too long): out of the
//! live set, torn down (processes, or the checkpoint of a paused one), recorded.

use crate::sandbox::lifecycle::SandboxState;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::checkpoints;
use crate::sandbox::lifecycle::{self, Operation};
use crate::types::Caller;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Kill a sandbox; not found when it is not running (or already being killed).
    pub async fn kill(&self, caller: &Caller, id: &str) -> Result<()> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let id = ids::normalize_sandbox_id(id);
        if finish(self, id, "killed").await {
            Ok(())
        } else {
            Err(EngineError::SandboxNotFound(id.to_string()))
        }
    }

    /// Sandboxes whose node died ([`bulkhead_store::LostSandbox`], marked gone in the store by
    /// the health sweep): out of the live set without a call to the node, which is gone (if it
    /// comes back it stops what it still runs: their handles stay in the store for it). From
    /// then on they are E2B's not-found. A pause or resume in flight settles its sandbox
    /// itself, as the sweep leaves those alone too. Returns how many were forgotten.
    pub async fn forget_lost(&self, ids: &[String]) -> usize {
        let mut forgotten = 0;
        for id in ids {
            let cancel = {
                let mut live = self.live.lock();
                let Some(l) = live.get_mut(id) else { continue };
                if !matches!(
                    l.state,
                    SandboxState::Starting
                        | SandboxState::Running
                        | SandboxState::Snapshotting
                        | SandboxState::Killing
                ) {
                    continue;
                }
                l.state = SandboxState::Killing;
                l.cancel.clone()
            };
            cancel.cancel();
            crate::sandbox::metered::meter_one(self, id).await;
            crate::sandbox::network::detach_link(self, id).await;
            if let Err(e) = self.store.delete_persistence(id).await {
                tracing::error!(sandbox = %id, error = %e, "deleting the sandbox's lifecycle record failed");
            }
            self.live.lock().remove(id);
            self.live.notify();
            tracing::warn!(sandbox = %id, "sandbox lost with its node");
            crate::telemetry::stopped(bulkhead_store::NODE_LOST);
            forgotten += 1;
        }
        forgotten
    }
}

/// Remove a sandbox from the live set, tear it down and record why it ended.
/// Returns false if it was not running.
pub(crate) async fn finish(engine: &Engine, id: &str, reason: &str) -> bool {
    // The sandbox stays in the live set as `killing` until it is torn down, so a second
    // kill, the watcher and the reaper all see it is on its way out (and get a refusal).
    let (handle, cancel, paused) = {
        let mut live = engine.live.lock();
        let Some(l) = live.get_mut(id) else {
            return false;
        };
        let Ok(step) = lifecycle::transition(l.state, Operation::Kill) else {
            return false;
        };
        l.state = step.during;
        (
            l.handle.clone(),
            l.cancel.clone(),
            l.extra.paused.is_some() || l.extra.paused_once,
        )
    };
    cancel.cancel();
    // Its last partial interval, while it is still in the live set.
    crate::sandbox::metered::meter_one(engine, id).await;
    // Unconditionally (idempotent): a concurrent network update may have attached a link
    // after this sandbox left the live set.
    crate::sandbox::network::detach_link(engine, id).await;
    // A paused sandbox has no processes, only its checkpoint.
    if let Some(handle) = handle
        && let Err(e) = engine.node.stop(&handle).await
    {
        tracing::error!(sandbox = %id, error = %e, "sandbox teardown failed");
    }
    // Its checkpoints, if it ever paused (one whose resume's cleanup did not finish included);
    // the live set knows, so a kill reads nothing more from the store.
    if paused {
        let root = checkpoints::sandbox_root(&engine.cfg.checkpoint_dir, id);
        engine.node.remove_checkpoint(&root).await;
    }
    if let Err(e) = engine.store.delete_persistence(id).await {
        tracing::error!(sandbox = %id, error = %e, "deleting the sandbox's lifecycle record failed");
    }
    if let Err(e) = engine.store.end_sandbox(id, reason).await {
        tracing::error!(sandbox = %id, error = %e, "recording sandbox end failed");
    }
    let _ = engine.store.set_sandbox_driver_handle(id, None, None).await;
    engine.live.lock().remove(id);
    engine.live.notify();
    tracing::info!(sandbox = %id, reason, "sandbox ended");
    crate::telemetry::stopped(reason);
    true
}
