//! The `sandboxes` table: one row per sandbox, live or recently ended, with keyset-paginated
//! listing filtered in SQL (state, template, start time, owner, team) and in Rust (metadata).

use std::collections::BTreeMap;

use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::{Bind, Where, bind_all, conflict};
use super::rows::{SANDBOX_COLUMNS, from_json, sandbox_from_row, to_json};
use crate::{Result, SandboxFilter, SandboxRow, SandboxState};

/// Rows fetched per round trip when a metadata filter forces filtering in Rust.
const METADATA_SCAN_BATCH: i64 = 200;

impl Store {
    pub async fn insert_sandbox(&self, sb: &SandboxRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(sb.id.as_str())
            .bind(sb.template_id.as_str())
            .bind(sb.alias.as_deref())
            .bind(sb.state.as_str())
            .bind(sb.owner_key_id.as_str())
            .bind(sb.team_id.as_str())
            .bind(to_json(&sb.metadata))
            .bind(to_json(&sb.env_vars))
            .bind(sb.envd_access_token.as_deref())
            .bind(sb.cpu_count)
            .bind(sb.memory_mb)
            .bind(sb.disk_size_mb)
            .bind(sb.started_at)
            .bind(sb.end_at)
            .bind(sb.driver_handle.as_deref())
            .bind(sb.end_reason.as_deref())
            .bind(i64::from(sb.allow_internet))
            .bind(sb.network.as_deref())
            .bind(sb.node_id.as_deref())
            .bind(sb.owner_replica.as_deref())
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("Sandbox {}", sb.id)))?;
        Ok(())
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    /// Sandboxes matching `filter`, ordered by `(started_at, id)` (descending if `order_desc`),
    /// starting strictly after the `after` cursor (the last row of the previous page) and at most
    /// `limit` of them.
    pub async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
        limit: Option<i64>,
        order_desc: bool,
        after: Option<(i64, String)>,
    ) -> Result<Vec<SandboxRow>> {
        let limit = limit.map(|l| l.max(0));
        if filter.metadata.is_empty() {
            return self
                .sandbox_page(filter, limit, order_desc, after.as_ref())
                .await;
        }
        // Metadata lives in a JSON column that the two databases query differently, so match it
        // here and keep pulling batches until the page is full or the table is exhausted.
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let want = limit.map(|l| l - out.len() as i64);
            if want == Some(0) {
                break;
            }
            let batch_size = want.map_or(METADATA_SCAN_BATCH, |w| w.max(METADATA_SCAN_BATCH));
            let batch = self
                .sandbox_page(filter, Some(batch_size), order_desc, cursor.as_ref())
                .await?;
            let exhausted = (batch.len() as i64) < batch_size;
            cursor = batch.last().map(|r| (r.started_at, r.id.clone()));
            for row in batch {
                if metadata_matches(&row.metadata, &filter.metadata) {
                    out.push(row);
                    if limit.is_some_and(|l| out.len() as i64 >= l) {
                        return Ok(out);
                    }
                }
            }
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    async fn sandbox_page(
        &self,
        filter: &SandboxFilter,
        limit: Option<i64>,
        order_desc: bool,
        after: Option<&(i64, String)>,
    ) -> Result<Vec<SandboxRow>> {
        let mut w = sandbox_where(filter);
        if let Some((started_at, id)) = after {
            let ts = w.placeholder(Bind::Int(*started_at));
            let id = w.placeholder(Bind::Text(id.clone()));
            let op = if order_desc { "<" } else { ">" };
            w.push(format!("(started_at, id) {op} ({ts}, {id})"));
        }
        let dir = if order_desc { "DESC" } else { "ASC" };
        let mut sql = format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes{} ORDER BY started_at {dir}, id {dir}",
            w.sql()
        );
        if let Some(limit) = limit {
            let p = w.placeholder(Bind::Int(limit));
            sql.push_str(&format!(" LIMIT {p}"));
        }
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(sandbox_from_row).collect()
    }

    pub async fn count_sandboxes(&self, filter: &SandboxFilter) -> Result<i64> {
        let w = sandbox_where(filter);
        if filter.metadata.is_empty() {
            let sql = format!("SELECT COUNT(*) FROM sandboxes{}", w.sql());
            let row = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
                .fetch_one(&self.pool)
                .await?;
            return Ok(row.try_get(0)?);
        }
        let sql = format!("SELECT id, metadata FROM sandboxes{}", w.sql());
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        let mut n = 0;
        for row in &rows {
            let id: String = row.try_get(0)?;
            let metadata = from_json(&row.try_get::<String, _>(1)?, &id, "metadata")?;
            if metadata_matches(&metadata, &filter.metadata) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sandboxes that are not dead, counted by (state, template): what `/metrics` shows.
    pub async fn count_sandboxes_by_state(&self) -> Result<Vec<(String, String, i64)>> {
        let rows = sqlx::query(
            "SELECT state, template_id, COUNT(*) FROM sandboxes WHERE state <> 'dead' \
             GROUP BY state, template_id ORDER BY state, template_id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect()
    }

    /// Returns false if there is no such sandbox.
    pub async fn set_sandbox_end_at(&self, id: &str, end_at: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE sandboxes SET end_at = $1 WHERE id = $2")
            .bind(end_at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets the state and replaces `end_reason` with `reason` (so `None` clears it, e.g. on
    /// resume). Returns false if there is no such sandbox.
    pub async fn set_sandbox_state(
        &self,
        id: &str,
        state: SandboxState,
        reason: Option<&str>,
    ) -> Result<bool> {
        let done = sqlx::query("UPDATE sandboxes SET state = $1, end_reason = $2 WHERE id = $3")
            .bind(state.as_str())
            .bind(reason)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records a sandbox's end with `reason`, unless it has ended already (its node or the
    /// health sweep may have recorded why first). Returns whether it did.
    pub async fn end_sandbox(&self, id: &str, reason: &str) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET state = $1, end_reason = $2 WHERE id = $3 AND state <> $1",
        )
        .bind(SandboxState::Dead.as_str())
        .bind(reason)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets the running sandbox's handle (None once its processes are gone) and, when `node` is
    /// given, the node it runs on; without one the node stays (a paused sandbox's checkpoint is
    /// on the node it ran on). Returns false if there is no such sandbox.
    pub async fn set_sandbox_driver_handle(
        &self,
        id: &str,
        handle: Option<&str>,
        node: Option<&str>,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET driver_handle = $1, node_id = COALESCE($2, node_id) WHERE id = $3",
        )
        .bind(handle)
        .bind(node)
        .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes dead sandboxes whose `end_at` is before `ts`; returns how many.
    pub async fn delete_dead_sandboxes_before(&self, ts: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM sandboxes WHERE state = $1 AND end_at < $2")
            .bind(SandboxState::Dead.as_str())
            .bind(ts)
            .execute(&self.pool)
            .await?;
        // Their volume mount records go with them.
        sqlx::query(
            "DELETE FROM sandbox_volumes WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Replaces a sandbox's network settings. Returns false if there is no such sandbox.
    pub async fn set_sandbox_network(
        &self,
        id: &str,
        allow_internet: bool,
        network: Option<&str>,
    ) -> Result<bool> {
        let done =
            sqlx::query("UPDATE sandboxes SET allow_internet = $1, network = $2 WHERE id = $3")
                .bind(i64::from(allow_internet))
                .bind(network)
                .bind(id)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() > 0)
    }
}

/// The SQL part of a sandbox filter (metadata is matched in Rust, see `list_sandboxes`).
fn sandbox_where(filter: &SandboxFilter) -> Where {
    let mut w = Where::default();
    if !filter.states.is_empty() {
        let list: Vec<String> = filter
            .states
            .iter()
            .map(|s| w.placeholder(Bind::Text(s.as_str().to_owned())))
            .collect();
        w.push(format!("state IN ({})", list.join(", ")));
    }
    if let Some(t) = &filter.template_id {
        let p = w.placeholder(Bind::Text(t.clone()));
        w.push(format!("template_id = {p}"));
    }
    if let Some(ts) = filter.started_after {
        let p = w.placeholder(Bind::Int(ts));
        // Inclusive, as E2B's API: a sandbox started exactly at the bound is listed.
        w.push(format!("started_at >= {p}"));
    }
    if let Some(owner) = &filter.owner_key_id {
        let p = w.placeholder(Bind::Text(owner.clone()));
        w.push(format!("owner_key_id = {p}"));
    }
    if let Some(team) = &filter.team_id {
        let p = w.placeholder(Bind::Text(team.clone()));
        w.push(format!("team_id = {p}"));
    }
    if let Some(replica) = &filter.owner_replica {
        let p = w.placeholder(Bind::Text(replica.clone()));
        w.push(format!("owner_replica = {p}"));
    }
    w
}

fn metadata_matches(have: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}
