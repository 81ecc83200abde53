//! TTLs: `POST /sandboxes/{id}/timeout` and the end time shared by connect.

use std::time::Duration;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::Operation;
use crate::types::Caller;
use crate::validate;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// `POST /sandboxes/{id}/timeout`: end_at = now + timeout (may shorten).
    pub async fn set_timeout(&self, caller: &Caller, id: &str, secs: u64) -> Result<()> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        crate::tenancy::admit::check_team_timeout(self, caller, secs).await?;
        let row = self.running_row(id, Operation::SetTimeout).await?;
        let timeout = self.check_timeout(secs)?;
        let end_at = now_ms() + timeout.as_millis() as i64;
        self.set_end_at(&row.id, end_at).await
    }

    pub(crate) async fn set_end_at(&self, id: &str, end_at: i64) -> Result<()> {
        {
            let mut live = self.live.lock();
            let Some(l) = live.get_mut(id) else {
                return Err(EngineError::SandboxNotFound(id.to_string()));
            };
            l.end_at_ms = end_at;
        }
        self.store.set_sandbox_end_at(id, end_at).await?;
        Ok(())
    }

    /// A client's TTL in seconds, checked against the server's maximum.
    pub(crate) fn check_timeout(&self, secs: u64) -> Result<Duration> {
        validate::check_timeout(secs, self.cfg.max_timeout)
    }
}
