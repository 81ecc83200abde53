//! The `nodes` table: `bulkhead node` daemons register (each registration a new epoch) and
//! heartbeat with their report; the holder of the [`NODE_HEALTH_LEASE`] sweeps those whose
//! heartbeat stopped, fenced by that lease's epoch. Every write is one guarded statement (or
//! one transaction behind the fence), so replicas and nodes racing on PostgreSQL never lose an
//! epoch bump or revive a dead incarnation.

use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::leases::{duration_ms, epoch_from_db, epoch_to_db, hold_fence};
use crate::{
    LeaseEpoch, LostSandbox, NODE_HEALTH_LEASE, NODE_LOST, NodeRow, NodeStatus, NodeTransition,
    ReportedStatus, Result, SandboxState, StaleReason, StoreError, SweepOutcome,
};

const NODE_COLUMNS: &str = "id, epoch, addr, status, report, registered_at, heartbeat_at, drain";

fn node_from_row(row: &AnyRow) -> Result<NodeRow> {
    let id: String = row.try_get("id")?;
    let status: String = row.try_get("status")?;
    let status = NodeStatus::parse(&status)
        .ok_or_else(|| StoreError::Corrupt(format!("node {id}: unknown status {status:?}")))?;
    let report = serde_json::from_str(&row.try_get::<String, _>("report")?)
        .map_err(|e| StoreError::Corrupt(format!("node {id}: column report is not JSON: {e}")))?;
    Ok(NodeRow {
        epoch: epoch_from_db(row.try_get("epoch")?, || format!("node {id}"))?,
        addr: row.try_get("addr")?,
        status,
        report,
        registered_at: row.try_get("registered_at")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        drain: row.try_get::<i64, _>("drain")? != 0,
        id,
    })
}

impl Store {
    /// Registers the node `id`: a new one at epoch 1, a known one (whatever its status, `dead`
    /// included) at its epoch + 1, so whatever its previous incarnation still sends is refused.
    /// Either way it is `ready` (a drain asked of an earlier incarnation is over) and
    /// heartbeated at `now_ms`.
    pub async fn register_node(
        &self,
        id: &str,
        addr: &str,
        report: &serde_json::Value,
        now_ms: i64,
    ) -> Result<NodeRow> {
        let sql = format!(
            "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, 1, $2, $3, $4, $5, $5, 0) \
             ON CONFLICT (id) DO UPDATE SET epoch = nodes.epoch + 1, addr = excluded.addr, \
             status = excluded.status, report = excluded.report, \
             registered_at = excluded.registered_at, heartbeat_at = excluded.heartbeat_at, \
             drain = 0 \
             RETURNING {NODE_COLUMNS}"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(addr)
            .bind(NodeStatus::Ready.as_str())
            .bind(report.to_string())
            .bind(now_ms)
            .fetch_one(&self.pool)
            .await?;
        node_from_row(&row)
    }

    /// Records a heartbeat of the node's incarnation `epoch`: its status (a `suspect` node that
    /// reports becomes what it reports; one asked to drain is `draining` whatever it reports),
    /// its report, and `now_ms` as its last heartbeat. Returns whether it is asked to drain.
    ///
    /// Refused with [`StoreError::StaleEpoch`], writing nothing, when the node is unknown,
    /// registered again since, or dead: it must [`Store::register_node`] again.
    pub async fn heartbeat(
        &self,
        id: &str,
        epoch: u64,
        status: ReportedStatus,
        report: &serde_json::Value,
        now_ms: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE nodes SET status = CASE WHEN drain <> 0 THEN $7 ELSE $3 END, report = $4, \
             heartbeat_at = $5 WHERE id = $1 AND epoch = $2 AND status <> $6 RETURNING drain",
        )
        .bind(id)
        .bind(epoch_to_db(epoch))
        .bind(NodeStatus::from(status).as_str())
        .bind(report.to_string())
        .bind(now_ms)
        .bind(NodeStatus::Dead.as_str())
        .bind(NodeStatus::Draining.as_str())
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = done {
            return Ok(row.try_get::<i64, _>("drain")? != 0);
        }
        // Why it was refused, for the node's log; the refusal itself was the UPDATE's guard.
        let reason = match self.get_node(id).await? {
            None => StaleReason::Unknown,
            Some(n) if n.status == NodeStatus::Dead => StaleReason::Dead,
            Some(n) => StaleReason::Superseded { current: n.epoch },
        };
        Err(StoreError::StaleEpoch {
            node: id.to_owned(),
            epoch,
            reason,
        })
    }

    /// Asks node `id` to drain (`on`) or to take sandboxes again: from its next heartbeat on it
    /// is `draining` and learns it. Returns false when no such node is registered.
    pub async fn set_node_drain(&self, id: &str, on: bool) -> Result<bool> {
        let done = sqlx::query("UPDATE nodes SET drain = $1 WHERE id = $2")
            .bind(i64::from(on))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Every registered node, dead ones included, by id.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRow>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from_row).collect()
    }

    pub async fn get_node(&self, id: &str) -> Result<Option<NodeRow>> {
        let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    /// Marks the nodes whose heartbeat stopped: `ready`, `draining` or `suspect` ones last
    /// heard more than `dead_after` before `now_ms` become `dead` with their epoch bumped;
    /// `ready` and `draining` ones last heard more than `suspect_after` before become
    /// `suspect`. The sandboxes a dead node was running are marked `dead` ("node_lost",
    /// ended now; their handle kept, so the node stops them if it comes back): every round, so
    /// a create that completed on a node after its death is caught too. Paused ones stay
    /// paused (their checkpoint is on that node's disk), and ones in the middle of a pause or a
    /// resume are left to the replica running that operation, which settles them. Returns the
    /// changes, by id, and the sandboxes lost.
    ///
    /// `fence` is the caller's epoch of the [`NODE_HEALTH_LEASE`]: when the lease is at another
    /// epoch (someone took it over) nothing is changed and [`StoreError::Fenced`] is returned.
    /// The check holds the lease row until the changes commit, so a take-over waits for them.
    pub async fn sweep_nodes(
        &self,
        now_ms: i64,
        suspect_after: Duration,
        dead_after: Duration,
        fence: LeaseEpoch,
    ) -> Result<SweepOutcome> {
        let suspect_cut = now_ms.saturating_sub(duration_ms(suspect_after));
        let dead_cut = now_ms.saturating_sub(duration_ms(dead_after));
        let mut tx = self.pool.begin().await?;
        hold_fence(&mut tx, NODE_HEALTH_LEASE, fence).await?;
        let mut changes = Vec::new();
        let steps = [
            (NodeStatus::Ready, NodeStatus::Dead, dead_cut),
            (NodeStatus::Draining, NodeStatus::Dead, dead_cut),
            (NodeStatus::Suspect, NodeStatus::Dead, dead_cut),
            (NodeStatus::Ready, NodeStatus::Suspect, suspect_cut),
            (NodeStatus::Draining, NodeStatus::Suspect, suspect_cut),
        ];
        for (from, to, cut) in steps {
            let bump: i64 = if to == NodeStatus::Dead { 1 } else { 0 };
            let rows = sqlx::query(
                "UPDATE nodes SET status = $1, epoch = epoch + $2 \
                 WHERE status = $3 AND heartbeat_at < $4 RETURNING id, epoch",
            )
            .bind(to.as_str())
            .bind(bump)
            .bind(from.as_str())
            .bind(cut)
            .fetch_all(&mut *tx)
            .await?;
            for row in &rows {
                let id: String = row.try_get("id")?;
                let epoch = epoch_from_db(row.try_get("epoch")?, || format!("node {id}"))?;
                changes.push(NodeTransition {
                    id,
                    from,
                    to,
                    epoch,
                });
            }
        }
        let lost = mark_lost(&mut tx, now_ms).await?;
        tx.commit().await?;
        changes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(SweepOutcome { changes, lost })
    }
}

/// Marks the sandboxes whose processes were on a dead node `dead` (see `sweep_nodes`).
async fn mark_lost(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    now_ms: i64,
) -> Result<Vec<LostSandbox>> {
    let rows = sqlx::query(
        "UPDATE sandboxes SET state = $1, end_reason = $2, \
         end_at = CASE WHEN end_at > $3 THEN $3 ELSE end_at END \
         WHERE state IN ($4, $5, $6, $7) \
         AND node_id IN (SELECT id FROM nodes WHERE status = $8) \
         RETURNING id, node_id",
    )
    .bind(SandboxState::Dead.as_str())
    .bind(NODE_LOST)
    .bind(now_ms)
    .bind(SandboxState::Starting.as_str())
    .bind(SandboxState::Running.as_str())
    .bind(SandboxState::Snapshotting.as_str())
    .bind(SandboxState::Killing.as_str())
    .bind(NodeStatus::Dead.as_str())
    .fetch_all(&mut **tx)
    .await?;
    let mut lost = rows
        .iter()
        .map(|r| {
            Ok(LostSandbox {
                id: r.try_get("id")?,
                node: r.try_get("node_id")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    lost.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(lost)
}
