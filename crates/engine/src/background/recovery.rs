//! Recovery after a server restart: re-adopt sandboxes that survived, keep paused ones whose
//! checkpoint is complete, bury the rest, reclaim driver leftovers. A sandbox the previous
//! server left `pausing` or `resuming` ends up running (its process lives) or paused (its
//! checkpoint is complete), never half-restored.

use std::path::PathBuf;
use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::SandboxState;
use bulkhead_store::{SandboxFilter, SandboxRow};

use bulkhead_envd::protocol::{AgentInfo, MIN_AGENT_PROTOCOL_VERSION};

use crate::clock::now_ms;
use crate::node::checkpoints;
use crate::node::driver::DriverHandle;
use crate::sandbox::live::{LiveExtra, Paused};
use crate::types::OnTimeout;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How long recovery waits for an adopted sandbox's agent to say which protocol it speaks.
const RECOVERY_AGENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The directories in `dir` (none when it does not exist).
fn read_dirs(dir: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

impl Engine {
    /// Re-adopt sandboxes that survived a server restart, mark the rest dead and reclaim any
    /// driver leftovers. Call once before serving.
    pub async fn recover(self: &Arc<Self>) -> Result<usize> {
        if let Some(me) = &self.cfg.replica {
            // A cluster's sandboxes from before API replicas registered (one replica drove
            // them all) are this replica's to drive unless another one claims them first.
            let claimed = self.store.claim_unowned_sandboxes(me).await?;
            if claimed > 0 {
                tracing::info!(
                    sandboxes = claimed,
                    "claimed sandboxes created before API replicas registered"
                );
            }
        }
        let rows = self
            .store
            .list_sandboxes(
                &SandboxFilter {
                    states: vec![
                        SandboxState::Running.into(),
                        SandboxState::Pausing.into(),
                        SandboxState::Paused.into(),
                        SandboxState::Resuming.into(),
                    ],
                    // A replica of a cluster: only its own (the others drive theirs).
                    owner_replica: self.cfg.replica.clone(),
                    ..Default::default()
                },
                None,
                false,
                None,
            )
            .await?;
        let mut keep = Vec::new();
        for row in rows {
            if let Some(h) = self.adopt_row(row, Adoption::Restart).await? {
                keep.push(h);
            }
        }
        // In a cluster the other replicas' sandboxes run on the same nodes, so nothing there is
        // this replica's orphan; each node stops what the store gave up on (`reconcile`).
        if self.cfg.replica.is_none() {
            let reclaimed = self
                .node
                .reclaim_orphans(&keep)
                .await
                .map_err(EngineError::Recover)?;
            if reclaimed > 0 {
                tracing::info!(reclaimed, "cleaned up leftover sandboxes");
            }
        }
        self.sweep_orphan_checkpoints().await?;
        self.resume_metering().await?;
        Ok(keep.len())
    }

    /// Puts one stored sandbox back in the live set, as it is found: running (its handle is
    /// adopted and watched), paused (its checkpoint is complete), or else recorded dead.
    /// Returns the handle of one that runs. `how` says whether this server restarted or took
    /// the sandbox over from a silent replica.
    pub(crate) async fn adopt_row(
        self: &Arc<Self>,
        mut row: SandboxRow,
        how: Adoption,
    ) -> Result<Option<DriverHandle>> {
        let persist = self.store.get_persistence(&row.id).await?;
        let mut extra = LiveExtra::from_stored(persist.as_ref());
        let handle = row
            .driver_handle
            .as_deref()
            .and_then(|h| serde_json::from_str::<DriverHandle>(h).ok());
        // A replica taking over lets the reaper end an expired sandbox: its node still runs
        // it, and nothing else would stop it there.
        let expired = how == Adoption::Restart
            && row.state == SandboxState::Running.into()
            && row.end_at <= now_ms()
            && extra.lifecycle.on_timeout == OnTimeout::Kill;
        let alive = match handle {
            Some(h) if self.node.owns(&h) && !expired && self.node.adopt(&h).await => Some(h),
            _ => None,
        };
        let checkpoint = persist
            .as_ref()
            .and_then(|p| p.checkpoint_dir.as_deref())
            .map(PathBuf::from);
        if let Some(h) = alive {
            // Still running (a pause or resume the previous server did not finish either
            // never stopped it or had already restored it): it runs on.
            if row.state != SandboxState::Running.into() {
                tracing::info!(sandbox = %row.id, was = %row.state, "sandbox found running after an interrupted operation");
                // A pause interrupted in the driver may have left the sandbox frozen.
                // The checkpoint goes: a pause that got as far as a complete checkpoint
                // made the driver refuse the adoption (the sandbox is paused, see below),
                // and adopting gave back whatever an unfinished one had taken; a resume
                // that got this far is done.
                if let Some(dir) = &checkpoint {
                    self.node.remove_checkpoint(dir).await;
                }
                if self.node.capabilities().freeze
                    && let Err(e) = self.node.thaw(&h).await
                {
                    tracing::warn!(sandbox = %row.id, error = &e as &dyn std::error::Error, "could not thaw a sandbox found after an interrupted pause");
                }
                if let Some(mut p) = persist.clone() {
                    p.checkpoint_dir = None;
                    p.paused_at = None;
                    self.store.upsert_persistence(&p).await?;
                }
                self.store
                    .set_sandbox_state(&row.id, SandboxState::Running.into(), None)
                    .await?;
                row.state = SandboxState::Running.into();
            }
            let agent = self.adopted_agent_info(&row.id, &h).await;
            if !agent.is_supported() {
                // Kept (listed, killable, never killed on its own), but every other
                // operation answers that its agent is too old.
                tracing::warn!(
                    sandbox = %row.id,
                    agent_protocol = agent.protocol_version,
                    agent_build = %agent.agent_build,
                    min_protocol = MIN_AGENT_PROTOCOL_VERSION,
                    "re-adopted a sandbox whose agent is too old to drive"
                );
                crate::sandbox::lookup::track(self, &row, Some(h.clone()), false, agent, extra);
                return Ok(Some(h));
            }
            tracing::info!(sandbox = %row.id, agent_protocol = agent.protocol_version, "re-adopted running sandbox");
            let net_attached = match how {
                // The links died with the previous server process (it held the TUN fds,
                // so the devices are gone): give sandboxes with egress a new one.
                Adoption::Restart => {
                    crate::sandbox::network::reattach_after_restart(self, &row, &h).await
                }
                // Its node, which holds the link, never stopped: the link is there.
                Adoption::TakeOver => crate::sandbox::network::has_link(&row),
            };
            crate::sandbox::lookup::track(self, &row, Some(h.clone()), net_attached, agent, extra);
            return Ok(Some(h));
        }
        // Not running: paused if its checkpoint is complete (a pause interrupted before
        // its completion marker, or a resume that consumed it, left nothing to resume).
        let complete = match (SandboxState::from(row.state), &checkpoint) {
            (SandboxState::Running, _) | (_, None) => None,
            // Marked complete, or finished by the driver before the server died (which
            // the node marks now).
            (_, Some(dir)) => self
                .node
                .checkpoint_info(dir)
                .await
                .map(|info| (dir.clone(), info)),
        };
        match complete {
            Some((dir, info)) => {
                let at_ms = persist
                    .as_ref()
                    .and_then(|p| p.paused_at)
                    .unwrap_or_else(now_ms);
                if row.state != SandboxState::Paused.into() {
                    tracing::info!(sandbox = %row.id, was = %row.state, "sandbox found paused after an interrupted operation");
                    if let Some(mut p) = persist.clone() {
                        p.paused_at = Some(at_ms);
                        p.checkpoint_memory = info.memory;
                        self.store.upsert_persistence(&p).await?;
                    }
                    self.store
                        .set_sandbox_state(&row.id, SandboxState::Paused.into(), None)
                        .await?;
                    self.store
                        .set_sandbox_driver_handle(&row.id, None, None)
                        .await?;
                    row.state = SandboxState::Paused.into();
                }
                extra.paused = Some(Paused {
                    dir,
                    memory: info.memory,
                    at_ms,
                    resume_on_traffic: persist.as_ref().is_some_and(|p| p.resume_on_traffic),
                });
                tracing::info!(sandbox = %row.id, "paused sandbox kept");
                crate::sandbox::lookup::track(self, &row, None, false, AgentInfo::current(), extra);
            }
            None => {
                tracing::info!(sandbox = %row.id, state = %row.state, ?how, "sandbox did not survive");
                if let Some(dir) = &checkpoint {
                    self.node.remove_checkpoint(dir).await;
                }
                self.store
                    .set_sandbox_state(&row.id, SandboxState::Dead.into(), Some(how.end_reason()))
                    .await?;
                self.store
                    .set_sandbox_driver_handle(&row.id, None, None)
                    .await?;
            }
        }
        Ok(None)
    }

    /// Ask an adopted sandbox's agent which protocol it speaks. Agents that predate versioning
    /// have no info route (404) and count as the legacy protocol; so does an agent that cannot
    /// be asked right now (it is adopted anyway, and a later call shows whether it answers).
    async fn adopted_agent_info(&self, id: &str, h: &DriverHandle) -> AgentInfo {
        // Bounded: an agent that does not answer (stopped, or still frozen) must not keep the
        // server from serving.
        let asked = tokio::time::timeout(RECOVERY_AGENT_TIMEOUT, async {
            self.node
                .agent_info(h)
                .await
                .map_err(|e| bulkhead_common::error_chain(&e))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {RECOVERY_AGENT_TIMEOUT:?}")));
        asked.unwrap_or_else(|e| {
            tracing::warn!(sandbox = %id, error = %e, "cannot ask the agent of an adopted sandbox for its version; assuming the legacy protocol");
            AgentInfo::legacy()
        })
    }

    /// Checkpoints nothing refers to after a restart: snapshots the previous server was still
    /// writing (their row is inserted only once they are complete) and forks' snapshots (a
    /// fork in flight died with the server).
    async fn sweep_orphan_checkpoints(&self) -> Result<()> {
        let root = &self.cfg.checkpoint_dir;
        for dir in read_dirs(&root.join("forks")) {
            checkpoints::remove(&dir);
        }
        for dir in read_dirs(&root.join("snapshots")) {
            let Some(id) = dir.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if self.store.get_snapshot(id).await?.is_none() {
                tracing::info!(dir = %dir.display(), "removing an unfinished snapshot");
                checkpoints::remove(&dir);
            }
        }
        Ok(())
    }
}

/// Why a stored sandbox is put back in the live set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// This server started again (`recover`).
    Restart,
    /// Its owner, another API replica, went silent (`cluster::replicas`).
    TakeOver,
}

impl Adoption {
    fn end_reason(self) -> &'static str {
        match self {
            Adoption::Restart => "lost on restart",
            Adoption::TakeOver => "lost on take-over",
        }
    }
}
