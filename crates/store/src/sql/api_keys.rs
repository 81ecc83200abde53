//! The `api_keys` table: keys are stored by the SHA-256 of their secret, revoked not deleted.

use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::{conflict, now_ms};
use super::rows::{API_KEY_COLUMNS, api_key_from_row};
use crate::{ApiKeyRow, Result, StoreError};

impl Store {
    pub async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, hash, prefix, created_at, revoked_at, team_id, \
             last_used_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(key.id.as_str())
        .bind(key.name.as_str())
        .bind(key.hash.as_str())
        .bind(key.prefix.as_str())
        .bind(key.created_at)
        .bind(key.revoked_at)
        .bind(key.team_id.as_str())
        .bind(key.last_used_at)
        .execute(&self.pool)
        .await
        .map_err(|e| {
            conflict(e, || {
                format!("API key {} (or one with the same hash)", key.id)
            })
        })?;
        Ok(())
    }

    /// All keys, revoked ones included, oldest first.
    pub async fn list_api_keys(&self) -> Result<Vec<ApiKeyRow>> {
        let sql = format!("SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(api_key_from_row).collect()
    }

    /// Revokes the key whose id, or else whose stored prefix, equals `id_or_prefix`.
    ///
    /// Returns false when nothing matches or the key was already revoked. A prefix shared by
    /// several active keys is refused ([`StoreError::Ambiguous`]) rather than revoking them all.
    pub async fn revoke_api_key(&self, id_or_prefix: &str) -> Result<bool> {
        let now = now_ms();
        let by_id =
            sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(now)
                .bind(id_or_prefix)
                .execute(&self.pool)
                .await?;
        if by_id.rows_affected() > 0 {
            return Ok(true);
        }
        let exists_by_id: i64 = sqlx::query("SELECT COUNT(*) FROM api_keys WHERE id = $1")
            .bind(id_or_prefix)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        if exists_by_id > 0 {
            // The id names an already revoked key; do not fall through to prefix matching.
            return Ok(false);
        }
        let ids: Vec<String> =
            sqlx::query("SELECT id FROM api_keys WHERE prefix = $1 AND revoked_at IS NULL")
                .bind(id_or_prefix)
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<std::result::Result<_, _>>()?;
        match ids.as_slice() {
            [] => Ok(false),
            [id] => {
                let done = sqlx::query(
                    "UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                )
                .bind(now)
                .bind(id.as_str())
                .execute(&self.pool)
                .await?;
                Ok(done.rows_affected() > 0)
            }
            _ => Err(StoreError::Ambiguous {
                query: id_or_prefix.to_owned(),
                count: ids.len(),
            }),
        }
    }

    pub async fn find_active_api_key_by_hash(&self, hash: &str) -> Result<Option<ApiKeyRow>> {
        let sql = format!(
            "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE hash = $1 AND revoked_at IS NULL"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(api_key_from_row).transpose()
    }

    /// Records a request with the key (the caller rate-limits these writes).
    pub async fn touch_api_key(&self, id: &str, at_ms: i64) -> Result<()> {
        sqlx::query("UPDATE api_keys SET last_used_at = $1 WHERE id = $2")
            .bind(at_ms)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn count_active_api_keys(&self) -> Result<i64> {
        let row = sqlx::query("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }
}
