//! Connect: extend a running sandbox's TTL (never shorten it) or resume a paused one, and open
//! byte streams to its agent for the routing proxy (resuming a paused sandbox whose lifecycle
//! says `auto_resume`).

use std::sync::Arc;
use std::time::Duration;

use crate::sandbox::lifecycle::SandboxState;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::driver::AgentStream;
use crate::node::guarded::GuardedStream;
use crate::sandbox::lifecycle::{Operation, Refusal};
use crate::types::{Caller, ResumeRequest, SandboxInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Connect: on a running sandbox extend the TTL to at least now + timeout (never shorten);
    /// on a paused one resume it. Returns the info and whether it was resumed (E2B: 201).
    pub async fn connect(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        req: ResumeRequest,
    ) -> Result<(SandboxInfo, bool)> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        crate::tenancy::admit::admit_resume(self, caller, id, &req).await?;
        self.resume_or_extend(id, Operation::Connect, req).await
    }

    /// `POST /sandboxes/{id}/refreshes`: extend a running sandbox's TTL (never shorten it); a
    /// paused one is refused (it is resumed with connect).
    pub async fn refresh(&self, caller: &Caller, id: &str, secs: Option<u64>) -> Result<()> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        if let Some(s) = secs {
            crate::tenancy::admit::check_team_timeout(self, caller, s).await?;
        }
        let (id, _) = self.enter(id, Operation::SetTimeout)?;
        self.extend(id, secs).await.map(|_| ())
    }

    /// The TTL extension of a running sandbox (the sandbox has entered `Connect`).
    pub(crate) async fn extend(&self, id: &str, secs: Option<u64>) -> Result<SandboxInfo> {
        let row = self.running_row(id, Operation::Get).await?;
        let timeout = self.check_timeout(secs.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        let wanted = now_ms() + timeout.as_millis() as i64;
        if wanted > row.end_at {
            self.set_end_at(&row.id, wanted).await?;
        }
        let row = self.running_row(&row.id, Operation::Get).await?;
        Ok(self.info_from_row(&row))
    }

    /// A fresh byte stream to a running sandbox's agent (for the routing proxy). A paused
    /// sandbox whose lifecycle allows it is resumed first (auto-resume); otherwise the caller
    /// is told it is paused.
    pub async fn agent_stream(self: &Arc<Self>, id: &str) -> Result<AgentStream> {
        let id = ids::normalize_sandbox_id(id);
        for _ in 0..3 {
            match self.enter(id, Operation::AgentTraffic) {
                Ok(_) => {
                    let handle = self.handle(id)?;
                    let traffic = self
                        .live
                        .traffic(id)
                        .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
                    let stream = self
                        .agents
                        .open(&handle)
                        .await
                        .map_err(EngineError::driver(Operation::AgentTraffic))?;
                    return Ok(Box::new(GuardedStream::new(stream, traffic)));
                }
                Err(EngineError::Refused {
                    reason: Refusal::Paused,
                    ..
                }) => {
                    let extra = self.live.extra(id).unwrap_or_default();
                    // A filesystem-only checkpoint is never resumed by traffic (E2B: it
                    // reboots, so only an explicit connect may do that). A node drain's pause
                    // is resumed like an auto-resume one: its user never paused it.
                    let resumable = extra.paused.as_ref().is_some_and(|p| {
                        p.memory && (extra.lifecycle.auto_resume || p.resume_on_traffic)
                    });
                    if !resumable {
                        return Err(EngineError::refused(
                            id,
                            Operation::AgentTraffic,
                            Refusal::Paused,
                        ));
                    }
                    let req = ResumeRequest {
                        timeout: (extra.timeout_ms > 0).then_some((extra.timeout_ms / 1000) as u64),
                        memory: true,
                    };
                    self.resume_or_extend(id, Operation::Connect, req).await?;
                }
                Err(EngineError::Refused {
                    reason: Refusal::Busy(SandboxState::Resuming),
                    ..
                }) => {
                    self.live
                        .wait_while(id, SandboxState::Resuming, Duration::from_secs(300))
                        .await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(EngineError::refused(
            id,
            Operation::AgentTraffic,
            Refusal::Busy(SandboxState::Resuming),
        ))
    }
}
