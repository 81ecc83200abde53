//! Pause: running → pausing → paused. The driver writes a checkpoint (memory and processes,
//! or the filesystem only) into a fresh directory under the data dir and the sandbox's
//! processes end; the store records where, so the sandbox resumes from the data dir alone
//! after a restart. A failed checkpoint leaves the sandbox running with its state.

use std::sync::Arc;

use crate::sandbox::lifecycle::SandboxState;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::checkpoints;
use crate::node::driver::{CheckpointOptions, DriverHandle};
use crate::sandbox::lifecycle::Operation;
use crate::sandbox::live::Paused;
use crate::sandbox::live::persistence_row;
use crate::types::Caller;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// `POST /sandboxes/{id}/pause`. `memory: false` keeps only the filesystem (a resume boots
    /// afresh on it). A paused sandbox answers 409 (E2B: "already paused").
    pub async fn pause(self: &Arc<Self>, caller: &Caller, id: &str, memory: bool) -> Result<()> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let (id, _) = self.enter(id, Operation::Pause)?;
        pause_entered(self, id, memory, Operation::Pause).await
    }

    async fn checkpoint_and_stop(
        self: &Arc<Self>,
        id: &str,
        memory: bool,
        op: Operation,
    ) -> Result<()> {
        if !self.node.capabilities().checkpoint {
            return Err(EngineError::NotCapable {
                driver: self.node.driver_name(),
                op,
            });
        }
        let (handle, net_attached, extra, cancel) = {
            let live = self.live.lock();
            let l = live
                .get(id)
                .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
            let handle = l
                .handle
                .clone()
                .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
            (handle, l.net_attached, l.extra.clone(), l.cancel.clone())
        };
        let generation = self
            .store
            .get_persistence(id)
            .await?
            .map_or(0, |p| p.generation)
            + 1;
        // The node makes the directory (on its disk) and marks the checkpoint complete.
        let dir = checkpoints::pause_dir(&self.cfg.checkpoint_dir, id, generation);
        // Recorded before the checkpoint starts: a server that dies mid-pause finds the
        // directory on restart and decides by its completion marker (see recovery).
        let mut pending = persistence_row(id, &extra);
        pending.checkpoint_dir = Some(dir.display().to_string());
        pending.checkpoint_memory = memory;
        pending.generation = generation;
        self.store.upsert_persistence(&pending).await?;
        self.store
            .set_sandbox_state(id, SandboxState::Pausing.into(), None)
            .await?;

        // The sandbox's end is expected now: the watcher must not take it for a death. The
        // driver needs the host's connections closed.
        cancel.cancel();
        self.live.cut_traffic(id);
        let opts = CheckpointOptions {
            leave_running: false,
            filesystem_only: !memory,
        };
        let written = self.node.checkpoint(&handle, &dir, opts).await;
        // The driver removed the link inside the sandbox (the device cannot be dumped); the
        // proxy lets go of its end only now, so the device never vanishes under the driver.
        if net_attached {
            crate::sandbox::network::detach_link(self, id).await;
        }
        let info = match written {
            Ok(info) => info,
            Err(source) => {
                self.node.remove_checkpoint(&dir).await;
                self.back_to_running(id, &handle, net_attached).await;
                return Err(EngineError::CheckpointFailed {
                    id: id.to_string(),
                    op,
                    source,
                });
            }
        };
        let _ = self.node.stop(&handle).await;

        let paused = Paused {
            dir: dir.clone(),
            memory: info.memory,
            at_ms: now_ms(),
            resume_on_traffic: false,
        };
        pending.checkpoint_memory = info.memory;
        pending.paused_at = Some(paused.at_ms);
        let recorded = async {
            self.store.upsert_persistence(&pending).await?;
            self.store.set_sandbox_driver_handle(id, None, None).await?;
            self.store
                .set_sandbox_state(id, SandboxState::Paused.into(), None)
                .await
        };
        if let Err(e) = recorded.await {
            // The checkpoint is complete on disk and the row says `pausing` with its
            // directory: a restart's recovery finds it paused.
            tracing::error!(sandbox = %id, error = &e as &dyn std::error::Error, "recording a pause failed");
        }
        let still_ours = {
            let mut live = self.live.lock();
            match live.get_mut(id) {
                Some(l) if l.state == SandboxState::Pausing => {
                    l.handle = None;
                    l.net_attached = false;
                    l.extra.paused = Some(paused);
                    l.extra.paused_once = true;
                    true
                }
                _ => false,
            }
        };
        if !still_ours {
            // Killed while pausing: the kill already deleted the sandbox's checkpoints.
            self.node.remove_checkpoint(&dir).await;
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        self.live.settle(id, SandboxState::Paused);
        tracing::info!(sandbox = %id, memory = info.memory, bytes = info.size_bytes, "sandbox paused");
        Ok(())
    }

    /// After a failed checkpoint: if the sandbox still lives, it runs on as before (watched,
    /// with its link); if the failure took it down, it has ended.
    async fn back_to_running(
        self: &Arc<Self>,
        id: &str,
        handle: &DriverHandle,
        net_attached: bool,
    ) {
        let alive = self.node.reachable(handle).await;
        if !alive {
            tracing::error!(sandbox = %id, "the sandbox died while being checkpointed");
            crate::sandbox::kill::finish(self, id, "died while pausing").await;
            return;
        }
        let _ = self
            .store
            .set_sandbox_state(id, SandboxState::Running.into(), None)
            .await;
        if let Ok(Some(mut p)) = self.store.get_persistence(id).await {
            p.checkpoint_dir = None;
            let _ = self.store.upsert_persistence(&p).await;
        }
        self.rewatch(id, handle.clone());
        if net_attached {
            let attached = match self.store.get_sandbox(id).await {
                Ok(Some(row)) => {
                    crate::sandbox::network::reattach_after_restart(self, &row, handle).await
                }
                _ => false,
            };
            if let Some(l) = self.live.lock().get_mut(id) {
                l.net_attached = attached;
            }
        }
    }
}

/// The pause of a sandbox already moved to `pausing` (by [`Engine::pause`] or the reaper's
/// auto-pause).
pub(crate) async fn pause_entered(
    engine: &Arc<Engine>,
    id: &str,
    memory: bool,
    op: Operation,
) -> Result<()> {
    // Running until now: metered at the running rate, the checkpoint from here on.
    crate::sandbox::metered::meter_one(engine, id).await;
    let result = engine.checkpoint_and_stop(id, memory, op).await;
    if result.is_err() && engine.live.lock().get(id).map(|l| l.state) == Some(SandboxState::Pausing)
    {
        engine.live.settle(id, SandboxState::Running);
    }
    result
}
