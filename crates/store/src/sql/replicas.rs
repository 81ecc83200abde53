//! The `replicas` table and sandbox ownership: every `bulkhead api` registers (each
//! registration a new epoch) and heartbeats; a sandbox's `owner_replica` is the one replica
//! whose engine drives it. When an owner's heartbeat is older than `dead_after`, another
//! replica takes its sandboxes with one guarded UPDATE each call, so racing takers on
//! PostgreSQL never both get a sandbox; and the silent owner's next heartbeat is refused, so it
//! learns that it must give them up.

use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::leases::{duration_ms, epoch_from_db, epoch_to_db};
use super::rows::{SANDBOX_COLUMNS, sandbox_from_row};
use crate::{ReplicaRow, Result, SandboxOwner, SandboxRow, SandboxState, StoreError};

const REPLICA_COLUMNS: &str = "id, addr, epoch, heartbeat_at";

fn replica_from_row(row: &AnyRow) -> Result<ReplicaRow> {
    let id: String = row.try_get("id")?;
    Ok(ReplicaRow {
        epoch: epoch_from_db(row.try_get("epoch")?, || format!("replica {id}"))?,
        addr: row.try_get("addr")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        id,
    })
}

impl Store {
    /// Registers API replica `id` reachable at `addr`: epoch 1 the first time, its epoch + 1
    /// after, heartbeated at `now_ms`.
    pub async fn register_replica(&self, id: &str, addr: &str, now_ms: i64) -> Result<ReplicaRow> {
        let sql = format!(
            "INSERT INTO replicas ({REPLICA_COLUMNS}) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (id) DO UPDATE SET epoch = replicas.epoch + 1, addr = excluded.addr, \
             heartbeat_at = excluded.heartbeat_at RETURNING {REPLICA_COLUMNS}"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(addr)
            .bind(now_ms)
            .fetch_one(&self.pool)
            .await?;
        replica_from_row(&row)
    }

    /// Records a heartbeat of replica `id`'s incarnation `epoch` at `now_ms`.
    ///
    /// Refused with [`StoreError::ReplicaStale`], writing nothing, when the replica registered
    /// again since, is unknown, or its last heartbeat is older than `dead_after` (others may
    /// have taken its sandboxes meanwhile): it must register again and drop what it lost.
    pub async fn heartbeat_replica(
        &self,
        id: &str,
        epoch: u64,
        now_ms: i64,
        dead_after: Duration,
    ) -> Result<()> {
        let cut = now_ms.saturating_sub(duration_ms(dead_after));
        let done = sqlx::query(
            "UPDATE replicas SET heartbeat_at = $3 \
             WHERE id = $1 AND epoch = $2 AND heartbeat_at >= $4",
        )
        .bind(id)
        .bind(epoch_to_db(epoch))
        .bind(now_ms)
        .bind(cut)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::ReplicaStale {
                replica: id.to_owned(),
                epoch,
            });
        }
        Ok(())
    }

    pub async fn get_replica(&self, id: &str) -> Result<Option<ReplicaRow>> {
        let sql = format!("SELECT {REPLICA_COLUMNS} FROM replicas WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(replica_from_row).transpose()
    }

    /// Every registered replica, silent ones included, by id.
    pub async fn list_replicas(&self) -> Result<Vec<ReplicaRow>> {
        let sql = format!("SELECT {REPLICA_COLUMNS} FROM replicas ORDER BY id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replica_from_row).collect()
    }

    /// A replica stopping on purpose: its heartbeat is dropped to 0, so the others take its
    /// sandboxes at once instead of after `dead_after`. Only its incarnation `epoch` may.
    pub async fn retire_replica(&self, id: &str, epoch: u64) -> Result<()> {
        sqlx::query("UPDATE replicas SET heartbeat_at = 0 WHERE id = $1 AND epoch = $2")
            .bind(id)
            .bind(epoch_to_db(epoch))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Makes replica `me` the owner of the sandboxes (all, or only sandbox `only`) whose owner
    /// is another replica not heard from within `dead_after` of `now_ms` (or never
    /// registered), and which have not ended. Returns the rows taken, by id.
    ///
    /// First the silent owners are found, then each one's sandboxes are moved with one UPDATE
    /// guarded by that owner's id: PostgreSQL re-checks a plain column comparison against the
    /// row a concurrent taker committed (not a subquery), so of racing takers exactly one gets
    /// each sandbox.
    pub async fn take_over_sandboxes(
        &self,
        me: &str,
        now_ms: i64,
        dead_after: Duration,
        only: Option<&str>,
    ) -> Result<Vec<SandboxRow>> {
        let cut = now_ms.saturating_sub(duration_ms(dead_after));
        let one = if only.is_some() { " AND id = $4" } else { "" };
        let silent = "owner_replica IS NOT NULL AND owner_replica <> $1 AND state <> $3 \
             AND NOT EXISTS (SELECT 1 FROM replicas r \
                 WHERE r.id = sandboxes.owner_replica AND r.heartbeat_at >= $2)";
        let sql = format!("SELECT DISTINCT owner_replica FROM sandboxes WHERE {silent}{one}");
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(me)
            .bind(cut)
            .bind(SandboxState::Dead.as_str());
        if let Some(id) = only {
            query = query.bind(id);
        }
        let owners = query.fetch_all(&self.pool).await?;
        let mut taken = Vec::new();
        for owner in owners {
            let owner: String = owner.try_get("owner_replica")?;
            let sql = format!(
                "UPDATE sandboxes SET owner_replica = $1 WHERE owner_replica = $5 AND {silent}{one} \
                 RETURNING {SANDBOX_COLUMNS}"
            );
            let query = sqlx::query(AssertSqlSafe(sql))
                .bind(me)
                .bind(cut)
                .bind(SandboxState::Dead.as_str())
                // $4 is bound either way so that $5 keeps its number.
                .bind(only.unwrap_or(""))
                .bind(owner);
            for row in query.fetch_all(&self.pool).await? {
                taken.push(sandbox_from_row(&row)?);
            }
        }
        taken.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(taken)
    }

    /// Makes replica `me` the owner of the cluster's sandboxes that have none: those a single
    /// API replica created before replicas were registered (on a node, not ended). Returns
    /// how many. Racing callers each get a share; a sandbox gets one owner.
    pub async fn claim_unowned_sandboxes(&self, me: &str) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE sandboxes SET owner_replica = $1 \
             WHERE owner_replica IS NULL AND node_id IS NOT NULL AND state <> $2",
        )
        .bind(me)
        .bind(SandboxState::Dead.as_str())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Who drives each of `ids` and in which state the store has it (ids with no row are left
    /// out): a replica checks its live set against it.
    pub async fn sandbox_owners(&self, ids: &[String]) -> Result<Vec<SandboxOwner>> {
        let mut out = Vec::with_capacity(ids.len());
        // Bounded IN lists: SQLite allows 32 766 parameters, PostgreSQL 65 535.
        for chunk in ids.chunks(500) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT id, owner_replica, state FROM sandboxes WHERE id IN ({})",
                marks.join(", ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.as_str());
            }
            for row in query.fetch_all(&self.pool).await? {
                let id: String = row.try_get("id")?;
                let state: String = row.try_get("state")?;
                let state = SandboxState::parse(&state).ok_or_else(|| {
                    StoreError::Corrupt(format!("sandbox {id}: unknown state {state:?}"))
                })?;
                out.push(SandboxOwner {
                    owner_replica: row.try_get("owner_replica")?,
                    state,
                    id,
                });
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}
