//! Connect: extend a sandbox's TTL (never shorten it), and open byte streams to its agent for the routing proxy.

use bulkhead_store::SandboxState;

use crate::clock::now_ms;
use crate::driver::AgentStream;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::lifecycle::Operation;
use crate::types::{Caller, SandboxInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Connect to a running sandbox: extends the TTL to at least now + timeout, never shortens.
    /// Returns the info and whether the sandbox had to be resumed (never, until pause exists).
    pub async fn connect(
        &self,
        _caller: &Caller,
        id: &str,
        secs: Option<u64>,
    ) -> Result<(SandboxInfo, bool)> {
        let (nid, step) = self.enter(id, Operation::Connect)?;
        if step.during == SandboxState::Resuming {
            // Nothing can be paused until the pause verb exists (a paused record adopted from
            // a newer server, say): leave it paused and say so rather than half-resume it.
            self.live.settle(nid, SandboxState::Paused);
            return Err(EngineError::Unsupported(Operation::Resume));
        }
        let row = self.running_row(nid, Operation::Get).await?;
        let timeout = self.check_timeout(secs.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        let wanted = now_ms() + timeout.as_millis() as i64;
        if wanted > row.end_at {
            self.set_end_at(&row.id, wanted).await?;
        }
        let row = self.running_row(&row.id, Operation::Get).await?;
        Ok((self.info_from_row(&row), false))
    }

    /// A fresh byte stream to a running sandbox's agent (for the routing proxy).
    pub async fn agent_stream(&self, id: &str) -> Result<AgentStream> {
        let (id, _) = self.enter(id, Operation::AgentTraffic)?;
        let handle = self.handle(id)?;
        self.driver
            .connect(&handle)
            .await
            .map_err(EngineError::driver(Operation::AgentTraffic))
    }
}
