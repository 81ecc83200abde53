//! Recovery after a server restart: re-adopt sandboxes that survived, bury the rest, reclaim driver leftovers.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use bulkhead_store::{SandboxFilter, SandboxState};

use bulkhead_envd::protocol::{AgentInfo, MIN_AGENT_PROTOCOL_VERSION};

use crate::agent_client;
use crate::clock::now_ms;
use crate::driver::DriverHandle;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Re-adopt sandboxes that survived a server restart, mark the rest dead and reclaim any
    /// driver leftovers. Call once before serving.
    pub async fn recover(self: &Arc<Self>) -> Result<usize> {
        let rows = self
            .store
            .list_sandboxes(
                &SandboxFilter {
                    states: vec![SandboxState::Running, SandboxState::Paused],
                    ..Default::default()
                },
                None,
                false,
                None,
            )
            .await?;
        let mut keep = Vec::new();
        for row in rows {
            let handle = row
                .driver_handle
                .as_deref()
                .and_then(|h| serde_json::from_str::<DriverHandle>(h).ok());
            match handle {
                Some(h)
                    if h.driver == self.driver.name()
                        && row.end_at > now_ms()
                        && self.driver.adopt(&h).await =>
                {
                    keep.push(h.clone());
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
                        self.track(&row, h, false, agent);
                        continue;
                    }
                    tracing::info!(sandbox = %row.id, agent_protocol = agent.protocol_version, "re-adopted running sandbox");
                    // The links died with the previous server process (it held the TUN fds,
                    // so the devices are gone): give sandboxes with egress a new one.
                    let net_attached = self.reattach_after_restart(&row, &h).await;
                    self.track(&row, h, net_attached, agent);
                }
                _ => {
                    tracing::info!(sandbox = %row.id, "sandbox did not survive the restart");
                    self.store
                        .set_sandbox_state(&row.id, SandboxState::Dead, Some("lost on restart"))
                        .await?;
                    self.store.set_sandbox_driver_handle(&row.id, None).await?;
                }
            }
        }
        let reclaimed = self
            .driver
            .reclaim_orphans(&keep)
            .await
            .map_err(EngineError::Recover)?;
        if reclaimed > 0 {
            tracing::info!(reclaimed, "cleaned up leftover sandboxes");
        }
        Ok(keep.len())
    }

    /// Ask an adopted sandbox's agent which protocol it speaks. Agents that predate versioning
    /// have no info route (404) and count as the legacy protocol; so does an agent that cannot
    /// be asked right now (it is adopted anyway, and a later call shows whether it answers).
    async fn adopted_agent_info(&self, id: &str, h: &DriverHandle) -> AgentInfo {
        let asked = match self.driver.connect(h).await {
            Ok(stream) => agent_client::agent_info(stream).await,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = &e as &dyn std::error::Error, "cannot reach the agent of an adopted sandbox; assuming the legacy protocol");
                return AgentInfo::legacy();
            }
        };
        asked.unwrap_or_else(|e| {
            tracing::warn!(sandbox = %id, error = &e as &dyn std::error::Error, "cannot ask the agent of an adopted sandbox for its version; assuming the legacy protocol");
            AgentInfo::legacy()
        })
    }
}
