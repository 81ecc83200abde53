//! The sandboxes a cluster node answers for, as the node itself reads them back: to stop what
//! the cluster gave up on while it was away (marked gone by the health sweep) and what ran past
//! its deadline while no API replica reached it. The row is the arbiter: a node stops a
//! sandbox for its deadline only once its guarded update says the row still ran out, so a TTL
//! an API replica extended meanwhile wins.

use sqlx::Row;

use super::Store;
use crate::{NodeSandbox, Result, SandboxState, StoreError};

/// Why a sandbox a node stopped at its deadline ended (the reaper's own word).
const TIMEOUT: &str = "timeout";

impl Store {
    /// The sandboxes on `node` that still have a handle there: the ones it runs, and the ones
    /// the cluster marked gone whose processes it may still hold.
    pub async fn node_sandboxes(&self, node: &str) -> Result<Vec<NodeSandbox>> {
        let rows = sqlx::query(
            "SELECT s.id, s.state, s.end_at, s.driver_handle, s.end_reason, p.on_timeout \
             FROM sandboxes s LEFT JOIN sandbox_persistence p ON p.sandbox_id = s.id \
             WHERE s.node_id = $1 AND s.driver_handle IS NOT NULL ORDER BY s.id",
        )
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get("id")?;
                let state: String = r.try_get("state")?;
                let state = SandboxState::parse(&state).ok_or_else(|| {
                    StoreError::Corrupt(format!("sandbox {id}: unknown state {state:?}"))
                })?;
                let on_timeout: Option<String> = r.try_get("on_timeout")?;
                Ok(NodeSandbox {
                    state,
                    end_at: r.try_get("end_at")?,
                    driver_handle: r.try_get("driver_handle")?,
                    end_reason: r.try_get("end_reason")?,
                    pauses_on_timeout: on_timeout.as_deref() == Some("pause"),
                    id,
                })
            })
            .collect()
    }

    /// Marks sandbox `id` on `node` dead for its deadline, if it still runs there and its
    /// `end_at` is before `cut` (its deadline plus the node's grace); its handle is dropped, as
    /// the node stops it next. Returns whether it did: false when an API replica extended,
    /// ended or moved it meanwhile.
    pub async fn expire_on_node(&self, id: &str, node: &str, cut: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET state = $1, end_reason = $2, driver_handle = NULL \
             WHERE id = $3 AND node_id = $4 AND state = $5 AND end_at < $6",
        )
        .bind(SandboxState::Dead.as_str())
        .bind(TIMEOUT)
        .bind(id)
        .bind(node)
        .bind(SandboxState::Running.as_str())
        .bind(cut)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Drops the handle of dead sandbox `id` on `node` once the node stopped it (so it is not
    /// looked at again). Returns whether there was one.
    pub async fn release_dead_handle(&self, id: &str, node: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET driver_handle = NULL \
             WHERE id = $1 AND node_id = $2 AND state = $3 AND driver_handle IS NOT NULL",
        )
        .bind(id)
        .bind(node)
        .bind(SandboxState::Dead.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
