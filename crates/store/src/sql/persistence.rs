//! The `sandbox_persistence` and `snapshots` tables: lifecycle settings and checkpoints of
//! sandboxes, and snapshots with keyset-paginated listing.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::{Bind, Where, bind_all, conflict};
use super::rows::{from_json, to_json};
use crate::{PersistenceRow, Result, SnapshotFilter, SnapshotRow};

const PERSISTENCE_COLUMNS: &str = "sandbox_id, on_timeout, auto_resume, pause_memory, \
     timeout_ms, checkpoint_dir, checkpoint_memory, generation, paused_at, resume_on_traffic";

const SNAPSHOT_COLUMNS: &str = "id, name, sandbox_id, template_id, checkpoint_dir, memory, env_vars, envd_access_token, \
     created_at, team_id";

impl Store {
    /// Inserts or replaces a sandbox's persistence row.
    pub async fn upsert_persistence(&self, p: &PersistenceRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO sandbox_persistence ({PERSISTENCE_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (sandbox_id) DO UPDATE SET on_timeout = excluded.on_timeout, \
             auto_resume = excluded.auto_resume, pause_memory = excluded.pause_memory, \
             timeout_ms = excluded.timeout_ms, checkpoint_dir = excluded.checkpoint_dir, \
             checkpoint_memory = excluded.checkpoint_memory, generation = excluded.generation, \
             paused_at = excluded.paused_at, resume_on_traffic = excluded.resume_on_traffic"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(p.sandbox_id.as_str())
            .bind(p.on_timeout.as_str())
            .bind(i64::from(p.auto_resume))
            .bind(i64::from(p.pause_memory))
            .bind(p.timeout_ms)
            .bind(p.checkpoint_dir.as_deref())
            .bind(i64::from(p.checkpoint_memory))
            .bind(p.generation)
            .bind(p.paused_at)
            .bind(i64::from(p.resume_on_traffic))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn get_persistence(&self, sandbox_id: &str) -> Result<Option<PersistenceRow>> {
        let sql =
            format!("SELECT {PERSISTENCE_COLUMNS} FROM sandbox_persistence WHERE sandbox_id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(sandbox_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(persistence_from_row).transpose()
    }

    pub async fn delete_persistence(&self, sandbox_id: &str) -> Result<()> {
        sqlx::query("DELETE FROM sandbox_persistence WHERE sandbox_id = $1")
            .bind(sandbox_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records a new snapshot; a name already taken is a conflict.
    pub async fn insert_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO snapshots ({SNAPSHOT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(s.id.as_str())
            .bind(s.name.as_deref())
            .bind(s.sandbox_id.as_str())
            .bind(s.template_id.as_str())
            .bind(s.checkpoint_dir.as_str())
            .bind(i64::from(s.memory))
            .bind(to_json(&s.env_vars))
            .bind(s.envd_access_token.as_deref())
            .bind(s.created_at)
            .bind(s.team_id.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| {
                conflict(e, || {
                    format!("Snapshot {}", s.name.as_ref().unwrap_or(&s.id))
                })
            })?;
        Ok(())
    }

    /// A snapshot by id or by name.
    pub async fn get_snapshot(&self, id_or_name: &str) -> Result<Option<SnapshotRow>> {
        // An id match wins: a name that equals another snapshot's id never hides it.
        let sql = format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE id = $1 OR name = $1 \
             ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id_or_name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(snapshot_from_row).transpose()
    }

    /// Returns false if there is no such snapshot.
    pub async fn delete_snapshot(&self, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM snapshots WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Snapshots matching `filter`, newest first, strictly after the `after` cursor (the last
    /// row of the previous page), at most `limit`.
    pub async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        limit: i64,
        after: Option<(i64, String)>,
    ) -> Result<Vec<SnapshotRow>> {
        let mut w = Where::default();
        if let Some(s) = &filter.sandbox_id {
            let p = w.placeholder(Bind::Text(s.clone()));
            w.push(format!("sandbox_id = {p}"));
        }
        if let Some(n) = &filter.name {
            let p = w.placeholder(Bind::Text(n.clone()));
            w.push(format!("name = {p}"));
        }
        if let Some(t) = &filter.team_id {
            let p = w.placeholder(Bind::Text(t.clone()));
            w.push(format!("team_id = {p}"));
        }
        if let Some((at, id)) = after {
            let ts = w.placeholder(Bind::Int(at));
            let id = w.placeholder(Bind::Text(id));
            w.push(format!("(created_at, id) < ({ts}, {id})"));
        }
        let p = w.placeholder(Bind::Int(limit.max(0)));
        let sql = format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots{} ORDER BY created_at DESC, id DESC LIMIT {p}",
            w.sql()
        );
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(snapshot_from_row).collect()
    }
}

fn persistence_from_row(row: &AnyRow) -> Result<PersistenceRow> {
    Ok(PersistenceRow {
        sandbox_id: row.try_get("sandbox_id")?,
        on_timeout: row.try_get("on_timeout")?,
        auto_resume: row.try_get::<i64, _>("auto_resume")? != 0,
        pause_memory: row.try_get::<i64, _>("pause_memory")? != 0,
        timeout_ms: row.try_get("timeout_ms")?,
        checkpoint_dir: row.try_get("checkpoint_dir")?,
        checkpoint_memory: row.try_get::<i64, _>("checkpoint_memory")? != 0,
        generation: row.try_get("generation")?,
        paused_at: row.try_get("paused_at")?,
        resume_on_traffic: row.try_get::<i64, _>("resume_on_traffic")? != 0,
    })
}

fn snapshot_from_row(row: &AnyRow) -> Result<SnapshotRow> {
    let id: String = row.try_get("id")?;
    let env_vars = from_json(&row.try_get::<String, _>("env_vars")?, &id, "env_vars")?;
    Ok(SnapshotRow {
        name: row.try_get("name")?,
        sandbox_id: row.try_get("sandbox_id")?,
        template_id: row.try_get("template_id")?,
        checkpoint_dir: row.try_get("checkpoint_dir")?,
        memory: row.try_get::<i64, _>("memory")? != 0,
        env_vars,
        envd_access_token: row.try_get("envd_access_token")?,
        created_at: row.try_get("created_at")?,
        team_id: row.try_get("team_id")?,
        id,
    })
}
