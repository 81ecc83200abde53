//! The `secrets` table: named values for header injection, versioned on every update.

use std::collections::BTreeMap;

use sqlx::AssertSqlSafe;

use super::Store;
use super::query::conflict;
use super::rows::{SECRET_COLUMNS, secret_from_row, to_json};
use crate::{Result, SecretRow};

impl Store {
    pub async fn insert_secret(&self, s: &SecretRow) -> Result<()> {
        let sql =
            format!("INSERT INTO secrets ({SECRET_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)");
        sqlx::query(AssertSqlSafe(sql))
            .bind(s.id.as_str())
            .bind(s.name.as_str())
            .bind(s.value.as_str())
            .bind(s.version)
            .bind(to_json(&s.metadata))
            .bind(s.created_at)
            .bind(s.updated_at)
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("A secret named {:?}", s.name)))?;
        Ok(())
    }

    /// Looks a secret up by id, or else by name (an id match wins).
    pub async fn get_secret(&self, id_or_name: &str) -> Result<Option<SecretRow>> {
        let sql = format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE id = $1 OR name = $1 \
             ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id_or_name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(secret_from_row).transpose()
    }

    /// Secrets ordered by `(created_at, id)`, strictly after the `after` cursor, at most `limit`.
    pub async fn list_secrets(
        &self,
        limit: i64,
        after: Option<(i64, String)>,
    ) -> Result<Vec<SecretRow>> {
        let rows = match after {
            Some((ts, id)) => {
                let sql = format!(
                    "SELECT {SECRET_COLUMNS} FROM secrets WHERE (created_at, id) > ($1, $2) \
                     ORDER BY created_at, id LIMIT $3"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(ts)
                    .bind(id)
                    .bind(limit.max(0))
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                let sql = format!(
                    "SELECT {SECRET_COLUMNS} FROM secrets ORDER BY created_at, id LIMIT $1"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(limit.max(0))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(secret_from_row).collect()
    }

    /// Stores a new value (version + 1) and, when given, replaces the metadata. Returns the
    /// updated secret, or None if no secret has this id or name.
    pub async fn update_secret(
        &self,
        id_or_name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
        now: i64,
    ) -> Result<Option<SecretRow>> {
        let Some(cur) = self.get_secret(id_or_name).await? else {
            return Ok(None);
        };
        let metadata = metadata.unwrap_or(&cur.metadata);
        let done = sqlx::query(
            "UPDATE secrets SET value = $1, version = version + 1, metadata = $2, updated_at = $3 \
             WHERE id = $4",
        )
        .bind(value)
        .bind(to_json(metadata))
        .bind(now)
        .bind(cur.id.as_str())
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        self.get_secret(&cur.id).await
    }

    /// Deletes the secret with this id, or else this name. Returns false if there was none.
    pub async fn delete_secret(&self, id_or_name: &str) -> Result<bool> {
        let Some(cur) = self.get_secret(id_or_name).await? else {
            return Ok(false);
        };
        let done = sqlx::query("DELETE FROM secrets WHERE id = $1")
            .bind(cur.id.as_str())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
