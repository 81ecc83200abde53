//! A team's own API keys, as its members see them (the web console's key page): listed
//! without their secrets, and revocable by any active key of the same team. Keys of other
//! teams do not exist to the caller, like their sandboxes.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::types::{ApiKey, Caller};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// The caller's team's keys, revoked ones included, oldest first.
    pub async fn team_keys(&self, caller: &Caller) -> Result<Vec<ApiKey>> {
        Ok(self
            .store
            .list_api_keys()
            .await?
            .iter()
            .filter(|r| r.team_id == caller.team_id)
            .map(ApiKey::from)
            .collect())
    }

    /// Revokes the active key `id` of the caller's team. False when the team has no active
    /// key with that id (another team's key answers the same, so ids cannot be probed).
    pub async fn revoke_team_key(&self, caller: &Caller, id: &str) -> Result<bool> {
        let ours = self
            .team_keys(caller)
            .await?
            .iter()
            .any(|k| k.id == id && k.revoked_at.is_none());
        if !ours {
            return Ok(false);
        }
        let revoked = self.store.revoke_api_key(id).await?;
        if revoked {
            tracing::info!(team = %caller.team_id, key = %id, by = %caller.key_id, "API key revoked by its team");
        }
        Ok(revoked)
    }
}
