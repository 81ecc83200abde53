//! The `teams` table: a team's name, credit balance and quotas. Balances change only by
//! relative, atomic updates (`credits_micro = credits_micro + $delta`), so an operator's top-up
//! and the metering loop's draw never overwrite each other.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::conflict;
use crate::{Result, TeamQuotas, TeamRow};

const TEAM_COLUMNS: &str = "id, name, created_at, credits_micro, max_sandboxes, max_vcpus, \
     max_memory_mb, max_timeout_secs, create_rate_milli, create_burst";

fn team_from_row(row: &AnyRow) -> Result<TeamRow> {
    Ok(TeamRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        created_at: row.try_get("created_at")?,
        credits_micro: row.try_get("credits_micro")?,
        quotas: TeamQuotas {
            max_sandboxes: row.try_get("max_sandboxes")?,
            max_vcpus: row.try_get("max_vcpus")?,
            max_memory_mb: row.try_get("max_memory_mb")?,
            max_timeout_secs: row.try_get("max_timeout_secs")?,
            create_rate_milli: row.try_get("create_rate_milli")?,
            create_burst: row.try_get("create_burst")?,
        },
    })
}

impl Store {
    pub async fn insert_team(&self, t: &TeamRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO teams ({TEAM_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        );
        let q = &t.quotas;
        sqlx::query(AssertSqlSafe(sql))
            .bind(t.id.as_str())
            .bind(t.name.as_str())
            .bind(t.created_at)
            .bind(t.credits_micro)
            .bind(q.max_sandboxes)
            .bind(q.max_vcpus)
            .bind(q.max_memory_mb)
            .bind(q.max_timeout_secs)
            .bind(q.create_rate_milli)
            .bind(q.create_burst)
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("Team {:?} (or one with its id)", t.name)))?;
        Ok(())
    }

    /// Every team, oldest first.
    pub async fn list_teams(&self) -> Result<Vec<TeamRow>> {
        let sql = format!("SELECT {TEAM_COLUMNS} FROM teams ORDER BY created_at, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(team_from_row).collect()
    }

    /// The team with this id, else the one with this name.
    pub async fn get_team(&self, id_or_name: &str) -> Result<Option<TeamRow>> {
        let sql = format!(
            "SELECT {TEAM_COLUMNS} FROM teams WHERE id = $1 OR name = $1 \
             ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id_or_name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(team_from_row).transpose()
    }

    /// Replaces the team's quotas; false when there is no such team.
    pub async fn set_team_quotas(&self, id: &str, q: &TeamQuotas) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE teams SET max_sandboxes = $1, max_vcpus = $2, max_memory_mb = $3, \
             max_timeout_secs = $4, create_rate_milli = $5, create_burst = $6 WHERE id = $7",
        )
        .bind(q.max_sandboxes)
        .bind(q.max_vcpus)
        .bind(q.max_memory_mb)
        .bind(q.max_timeout_secs)
        .bind(q.create_rate_milli)
        .bind(q.create_burst)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Adds `delta_micro` (negative to take away) to the balance, starting one at 0 for a team
    /// that had none. Returns the new balance, `None` when there is no such team.
    pub async fn add_team_credits(&self, id: &str, delta_micro: i64) -> Result<Option<i64>> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE teams SET credits_micro = COALESCE(credits_micro, 0) + $1 WHERE id = $2",
        )
        .bind(delta_micro)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        let balance: Option<i64> = sqlx::query("SELECT credits_micro FROM teams WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        tx.commit().await?;
        Ok(balance)
    }

    /// Removes the team's balance (it is no longer refused for credits); false when there is
    /// no such team.
    pub async fn clear_team_credits(&self, id: &str) -> Result<bool> {
        let done = sqlx::query("UPDATE teams SET credits_micro = NULL WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
