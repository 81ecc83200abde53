//! The `idempotency_keys` table: a create's `Idempotency-Key`, claimed by one guarded upsert so
//! that exactly one of the replicas racing with the same key creates (the others see its row),
//! then completed with the sandbox id or released on failure. Every write after the claim is
//! conditioned on the claim token, so an attempt whose claim lapsed and was taken over changes
//! nothing.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::leases::duration_ms;
use crate::{ClaimOutcome, IdempotencyClaim, IdempotencyRow, Result};

const COLUMNS: &str = "team_id, idem_key, fingerprint, claim_token, sandbox_id, created_at, \
     claim_expires_at, expires_at";

/// Claim attempts within one call when the row vanishes between the upsert and the read (it
/// was released or expired meanwhile).
const CLAIM_ROUNDS: usize = 3;

fn row_from(row: &AnyRow) -> Result<IdempotencyRow> {
    Ok(IdempotencyRow {
        team_id: row.try_get("team_id")?,
        key: row.try_get("idem_key")?,
        fingerprint: row.try_get("fingerprint")?,
        token: row.try_get("claim_token")?,
        sandbox_id: row.try_get("sandbox_id")?,
        created_at: row.try_get("created_at")?,
        claim_expires_at: row.try_get("claim_expires_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

impl Store {
    /// Claims `c.key` for `c.token`, or says who has it. The claim is one upsert that writes
    /// when the key is new, expired (`expires_at <= now`) or held by an abandoned attempt (no
    /// sandbox yet and `claim_expires_at <= now`); racing callers queue on the row (PostgreSQL)
    /// or the write lock (SQLite), and exactly one gets [`ClaimOutcome::Claimed`]. Otherwise the
    /// row decides: another fingerprint is [`ClaimOutcome::Mismatch`] (pending or not), a
    /// sandbox id [`ClaimOutcome::Completed`], else [`ClaimOutcome::InProgress`].
    pub async fn claim_idempotency_key(&self, c: &IdempotencyClaim<'_>) -> Result<ClaimOutcome> {
        let claim_expires_at = c.now_ms.saturating_add(duration_ms(c.claim_ttl));
        let expires_at = c.now_ms.saturating_add(duration_ms(c.key_ttl));
        for _ in 0..CLAIM_ROUNDS {
            let won = sqlx::query(
                "INSERT INTO idempotency_keys (team_id, idem_key, fingerprint, claim_token, \
                 sandbox_id, created_at, claim_expires_at, expires_at) \
                 VALUES ($1, $2, $3, $4, NULL, $5, $6, $7) \
                 ON CONFLICT (team_id, idem_key) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, claim_token = excluded.claim_token, \
                 sandbox_id = NULL, created_at = excluded.created_at, \
                 claim_expires_at = excluded.claim_expires_at, expires_at = excluded.expires_at \
                 WHERE idempotency_keys.expires_at <= $5 \
                 OR (idempotency_keys.sandbox_id IS NULL \
                     AND idempotency_keys.claim_expires_at <= $5) \
                 RETURNING claim_token",
            )
            .bind(c.team_id)
            .bind(c.key)
            .bind(c.fingerprint)
            .bind(c.token)
            .bind(c.now_ms)
            .bind(claim_expires_at)
            .bind(expires_at)
            .fetch_optional(&self.pool)
            .await?;
            if won.is_some() {
                return Ok(ClaimOutcome::Claimed);
            }
            let Some(row) = self.get_idempotency_key(c.team_id, c.key).await? else {
                continue;
            };
            if row.expires_at <= c.now_ms
                || (row.sandbox_id.is_none() && row.claim_expires_at <= c.now_ms)
            {
                // Lapsed between the two statements: the next round takes it.
                continue;
            }
            return Ok(if row.fingerprint != c.fingerprint {
                ClaimOutcome::Mismatch
            } else if let Some(sandbox_id) = row.sandbox_id {
                ClaimOutcome::Completed { sandbox_id }
            } else {
                ClaimOutcome::InProgress {
                    claim_expires_at: row.claim_expires_at,
                }
            });
        }
        // Claimed and let go under us every round: someone is working on it; ask again later.
        Ok(ClaimOutcome::InProgress {
            claim_expires_at: c.now_ms,
        })
    }

    /// Records the sandbox the claim made. False when `token` no longer holds a pending claim
    /// (it lapsed and was taken over, or was released): nothing is written.
    pub async fn complete_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        token: &str,
        sandbox_id: &str,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET sandbox_id = $4 \
             WHERE team_id = $1 AND idem_key = $2 AND claim_token = $3 AND sandbox_id IS NULL",
        )
        .bind(team_id)
        .bind(key)
        .bind(token)
        .bind(sandbox_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Keeps a pending claim alive until `claim_expires_at` while its create runs. False when
    /// `token` no longer holds it.
    pub async fn renew_idempotency_claim(
        &self,
        team_id: &str,
        key: &str,
        token: &str,
        claim_expires_at: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET claim_expires_at = $4 \
             WHERE team_id = $1 AND idem_key = $2 AND claim_token = $3 AND sandbox_id IS NULL",
        )
        .bind(team_id)
        .bind(key)
        .bind(token)
        .bind(claim_expires_at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Gives a pending claim up (its create failed): the key is free for the next attempt.
    /// False when `token` did not hold a pending claim; a completed key is never released.
    pub async fn release_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
        token: &str,
    ) -> Result<bool> {
        let done = sqlx::query(
            "DELETE FROM idempotency_keys \
             WHERE team_id = $1 AND idem_key = $2 AND claim_token = $3 AND sandbox_id IS NULL",
        )
        .bind(team_id)
        .bind(key)
        .bind(token)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The key as stored, expired or not.
    pub async fn get_idempotency_key(
        &self,
        team_id: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRow>> {
        let sql =
            format!("SELECT {COLUMNS} FROM idempotency_keys WHERE team_id = $1 AND idem_key = $2");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(team_id)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(row_from).transpose()
    }

    /// Deletes the keys whose `expires_at` is at or before `now_ms`; returns how many.
    pub async fn delete_expired_idempotency_keys(&self, now_ms: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= $1")
            .bind(now_ms)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
