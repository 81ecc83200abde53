//! The `usage_records` table: metered intervals, written with the credits they draw in one
//! transaction (an interval is either recorded and paid for, or neither), and summed per
//! sandbox for the usage API.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::{Bind, Where, bind_all, conflict};
use crate::{Result, UsageFilter, UsageRow, UsageSum};

impl Store {
    /// Records `rows` and draws each team's summed cost from its balance (teams without a
    /// balance are not drawn from). Returns the balances after the draw, per team that has one.
    pub async fn record_usage(&self, rows: &[UsageRow]) -> Result<HashMap<String, i64>> {
        let mut cost: HashMap<&str, i64> = HashMap::new();
        let mut tx = self.pool.begin().await?;
        for r in rows {
            sqlx::query(
                "INSERT INTO usage_records (sandbox_id, team_id, key_id, start_ms, end_ms, state, \
                 vcpu_ms, memory_mib_ms, storage_mib_ms, cost_micro) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(r.sandbox_id.as_str())
            .bind(r.team_id.as_str())
            .bind(r.key_id.as_str())
            .bind(r.start_ms)
            .bind(r.end_ms)
            .bind(r.state.as_str())
            .bind(r.vcpu_ms)
            .bind(r.memory_mib_ms)
            .bind(r.storage_mib_ms)
            .bind(r.cost_micro)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                conflict(e, || {
                    format!("Usage of sandbox {} from {}", r.sandbox_id, r.start_ms)
                })
            })?;
            *cost.entry(r.team_id.as_str()).or_default() += r.cost_micro;
        }
        let mut balances = HashMap::new();
        for (team, c) in cost {
            if c != 0 {
                sqlx::query(
                    "UPDATE teams SET credits_micro = credits_micro - $1 \
                     WHERE id = $2 AND credits_micro IS NOT NULL",
                )
                .bind(c)
                .bind(team)
                .execute(&mut *tx)
                .await?;
            }
            let b: Option<i64> = sqlx::query("SELECT credits_micro FROM teams WHERE id = $1")
                .bind(team)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.try_get(0))
                .transpose()?
                .flatten();
            if let Some(b) = b {
                balances.insert(team.to_owned(), b);
            }
        }
        tx.commit().await?;
        Ok(balances)
    }

    /// Where each of these sandboxes' metering stopped (the end of its last recorded
    /// interval); sandboxes never metered are absent.
    pub async fn metered_until(&self, sandbox_ids: &[String]) -> Result<HashMap<String, i64>> {
        let mut out = HashMap::new();
        for id in sandbox_ids {
            let end: Option<i64> =
                sqlx::query("SELECT MAX(end_ms) FROM usage_records WHERE sandbox_id = $1")
                    .bind(id.as_str())
                    .fetch_one(&self.pool)
                    .await?
                    .try_get(0)?;
            if let Some(end) = end {
                out.insert(id.clone(), end);
            }
        }
        Ok(out)
    }

    /// Usage matching `filter`, summed per sandbox, busiest (most vCPU time) first.
    pub async fn sum_usage(&self, filter: &UsageFilter) -> Result<Vec<UsageSum>> {
        let mut w = Where::default();
        for (col, v) in [
            ("team_id", &filter.team_id),
            ("key_id", &filter.key_id),
            ("sandbox_id", &filter.sandbox_id),
        ] {
            if let Some(v) = v {
                let p = w.placeholder(Bind::Text(v.clone()));
                w.push(format!("{col} = {p}"));
            }
        }
        if let Some(from) = filter.from_ms {
            let p = w.placeholder(Bind::Int(from));
            w.push(format!("end_ms > {p}"));
        }
        if let Some(to) = filter.to_ms {
            let p = w.placeholder(Bind::Int(to));
            w.push(format!("start_ms < {p}"));
        }
        let sql = format!(
            "SELECT sandbox_id, team_id, key_id, MIN(start_ms) AS start_ms, \
             MAX(end_ms) AS end_ms, \
             CAST(SUM(CASE WHEN state = 'running' THEN end_ms - start_ms ELSE 0 END) AS BIGINT) \
             AS running_ms, \
             CAST(SUM(CASE WHEN state = 'paused' THEN end_ms - start_ms ELSE 0 END) AS BIGINT) \
             AS paused_ms, \
             CAST(SUM(vcpu_ms) AS BIGINT) AS vcpu_ms, \
             CAST(SUM(memory_mib_ms) AS BIGINT) AS memory_mib_ms, \
             CAST(SUM(storage_mib_ms) AS BIGINT) AS storage_mib_ms, \
             CAST(SUM(cost_micro) AS BIGINT) AS cost_micro \
             FROM usage_records{} GROUP BY sandbox_id, team_id, key_id \
             ORDER BY vcpu_ms DESC, sandbox_id",
            w.sql()
        );
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                // Each SUM is cast to BIGINT (PostgreSQL's SUM of BIGINT is NUMERIC).
                let n = |c: &str| -> Result<i64> { Ok(r.try_get(c)?) };
                Ok(UsageSum {
                    sandbox_id: r.try_get("sandbox_id")?,
                    team_id: r.try_get("team_id")?,
                    key_id: r.try_get("key_id")?,
                    start_ms: r.try_get("start_ms")?,
                    end_ms: r.try_get("end_ms")?,
                    running_ms: n("running_ms")?,
                    paused_ms: n("paused_ms")?,
                    vcpu_ms: n("vcpu_ms")?,
                    memory_mib_ms: n("memory_mib_ms")?,
                    storage_mib_ms: n("storage_mib_ms")?,
                    cost_micro: n("cost_micro")?,
                })
            })
            .collect()
    }
}
