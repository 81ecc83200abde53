//! Which replica answers for a sandbox: this one when its engine drives it (or nobody does:
//! `bulkhead serve`, an unknown or ended sandbox, answered here as usual), else its owner while
//! that owner is live. A sandbox whose owner is silent is taken over on the spot, so a request
//! never waits for the background round.

use std::sync::Arc;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::sandbox::lifecycle::SandboxState;

use super::DEAD_AFTER;

/// Where a request for one sandbox goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This replica answers.
    Here,
    /// Replica `replica` drives it: forward the request to `addr`.
    Owner { replica: String, addr: String },
}

impl Engine {
    /// Where a request for sandbox `id` is answered (see the module doc).
    pub async fn locate(self: &Arc<Self>, id: &str) -> Result<Route, EngineError> {
        let Some(me) = self.cfg.replica.as_deref() else {
            return Ok(Route::Here);
        };
        let id = ids::normalize_sandbox_id(id);
        if self.live.lock().contains_key(id) {
            return Ok(Route::Here);
        }
        if let Some(route) = self.owner_route(me, id).await? {
            return Ok(route);
        }
        // Its owner is silent: take it (or learn who did).
        self.take_over(Some(id)).await?;
        if self.live.lock().contains_key(id) {
            return Ok(Route::Here);
        }
        Ok(self.owner_route(me, id).await?.unwrap_or(Route::Here))
    }

    /// The route the store gives sandbox `id`, or None when its owner is another replica that
    /// is not live.
    async fn owner_route(&self, me: &str, id: &str) -> Result<Option<Route>, EngineError> {
        let Some(row) = self.store.get_sandbox(id).await? else {
            return Ok(Some(Route::Here));
        };
        let owner = match row.owner_replica {
            Some(o) if o != me && row.state != SandboxState::Dead.into() => o,
            // Ours (being taken over right now, or not driven after all), nobody's, or ended.
            _ => return Ok(Some(Route::Here)),
        };
        match self.store.get_replica(&owner).await? {
            Some(r) if r.is_live_at(now_ms(), DEAD_AFTER) => Ok(Some(Route::Owner {
                replica: owner,
                addr: r.addr,
            })),
            _ => Ok(None),
        }
    }
}
