//! The `secrets` table: named values for header injection, each owned by a team (a name is
//! unique within its team, every lookup is scoped to one), versioned on every update, and
//! stored sealed with the server's secrets key ([`crate::secret_crypto`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::{conflict, now_ms};
use super::rows::to_json;
use crate::secret_crypto::{DEFAULT_KEY_FILE, SecretCipher, SecretsKey};
use crate::{Result, SecretRow, StoreError};

/// Metadata columns; the value is read only by [`Store::secret_value`].
const SECRET_COLUMNS: &str = "id, team_id, name, version, metadata, created_at, updated_at";
const KEY_CHECK_ID: &str = "current";

/// Where the secrets key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretsKeySource {
    /// A key file the operator made (`--secrets-key-file`); it must exist.
    File(PathBuf),
    /// `<dir>/secrets.key`, generated on the first start.
    DataDir(PathBuf),
}

impl SecretsKeySource {
    /// The operator's key file when given, else the one kept in `data_dir`.
    pub fn new(key_file: Option<&Path>, data_dir: &Path) -> Self {
        match key_file {
            Some(f) => SecretsKeySource::File(f.to_owned()),
            None => SecretsKeySource::DataDir(data_dir.to_owned()),
        }
    }
}

/// What [`Store::unlock_secrets`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretsUnlocked {
    pub key_file: PathBuf,
    /// The key file was created by this start.
    pub generated: bool,
    /// Secrets found in plain text (written before encryption) and sealed now.
    pub sealed_now: u64,
}

fn secret_from_row(row: &AnyRow) -> Result<SecretRow> {
    let id: String = row.try_get("id")?;
    let metadata: BTreeMap<String, String> =
        serde_json::from_str(&row.try_get::<String, _>("metadata")?).map_err(|e| {
            StoreError::Corrupt(format!(
                "secret {id}: column metadata is not a JSON string map: {e}"
            ))
        })?;
    Ok(SecretRow {
        team_id: row.try_get("team_id")?,
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        metadata,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

impl Store {
    fn cipher(&self) -> Result<&SecretCipher> {
        self.secrets.get().ok_or(StoreError::SecretsLocked)
    }

    /// Loads (or on the first start generates) the secrets key, checks that it is the key the
    /// stored secrets were sealed with, and seals any secret still in plain text. Secret values
    /// can be written and read only after this.
    pub async fn unlock_secrets(&self, source: &SecretsKeySource) -> Result<SecretsUnlocked> {
        let (key, key_file, generated) = match source {
            SecretsKeySource::File(path) => (SecretsKey::load(path)?, path.clone(), false),
            SecretsKeySource::DataDir(dir) => {
                let path = dir.join(DEFAULT_KEY_FILE);
                let (key, generated) = SecretsKey::load_or_create(&path)?;
                (key, path, generated)
            }
        };
        let sealed_now = self
            .unlock_secrets_with(&key, &key_file.display().to_string())
            .await?;
        Ok(SecretsUnlocked {
            key_file,
            generated,
            sealed_now,
        })
    }

    /// [`unlock_secrets`](Self::unlock_secrets) with a key in hand; `key_name` names it in
    /// errors. Returns how many plain-text secrets were sealed. Idempotent.
    pub async fn unlock_secrets_with(&self, key: &SecretsKey, key_name: &str) -> Result<u64> {
        let cipher = SecretCipher::new(key);
        let mismatch = || StoreError::SecretsKeyMismatch {
            key: key_name.to_string(),
        };
        let check: Option<String> =
            sqlx::query_scalar("SELECT sealed FROM secrets_key_check WHERE id = $1")
                .bind(KEY_CHECK_ID)
                .fetch_optional(&self.pool)
                .await?;
        match check {
            Some(c) if !cipher.matches_key_check(&c) => return Err(mismatch()),
            Some(_) => {}
            None => {
                // No check yet (a new database, or one from before encryption): a sealed row
                // would still tell a wrong key.
                let any = sqlx::query(
                    "SELECT id, team_id, value FROM secrets WHERE sealed = 1 ORDER BY id LIMIT 1",
                )
                .fetch_optional(&self.pool)
                .await?;
                if let Some(r) = any {
                    let (id, team, value): (String, String, String) =
                        (r.try_get("id")?, r.try_get("team_id")?, r.try_get("value")?);
                    if cipher.open(&team, &id, &value).is_err() {
                        return Err(mismatch());
                    }
                }
                sqlx::query(
                    "INSERT INTO secrets_key_check (id, sealed, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(KEY_CHECK_ID)
                .bind(cipher.key_check()?)
                .bind(now_ms())
                .execute(&self.pool)
                .await?;
                // Another server on the same database may have written its own first.
                let stored: String =
                    sqlx::query_scalar("SELECT sealed FROM secrets_key_check WHERE id = $1")
                        .bind(KEY_CHECK_ID)
                        .fetch_one(&self.pool)
                        .await?;
                if !cipher.matches_key_check(&stored) {
                    return Err(mismatch());
                }
            }
        }
        let plain = sqlx::query("SELECT id, team_id, value FROM secrets WHERE sealed = 0")
            .fetch_all(&self.pool)
            .await?;
        let mut sealed_now = 0;
        for r in &plain {
            let (id, team, value): (String, String, String) =
                (r.try_get("id")?, r.try_get("team_id")?, r.try_get("value")?);
            let done = sqlx::query(
                "UPDATE secrets SET value = $1, sealed = 1 WHERE id = $2 AND sealed = 0",
            )
            .bind(cipher.seal(&team, &id, &value)?)
            .bind(id.as_str())
            .execute(&self.pool)
            .await?;
            sealed_now += done.rows_affected();
        }
        if let Err(cipher) = self.secrets.set(cipher) {
            // Unlocked before: fine with the same key, not with another one.
            let current = self.cipher()?;
            if !current.matches_key_check(&cipher.key_check()?) {
                return Err(mismatch());
            }
        }
        Ok(sealed_now)
    }

    /// Inserts a secret with its value sealed to `(team_id, id)`.
    pub async fn insert_secret(&self, s: &SecretRow, value: &str) -> Result<()> {
        let sealed = self.cipher()?.seal(&s.team_id, &s.id, value)?;
        sqlx::query(
            "INSERT INTO secrets (id, team_id, name, value, sealed, version, metadata, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, 1, $5, $6, $7, $8)",
        )
        .bind(s.id.as_str())
        .bind(s.team_id.as_str())
        .bind(s.name.as_str())
        .bind(sealed)
        .bind(s.version)
        .bind(to_json(&s.metadata))
        .bind(s.created_at)
        .bind(s.updated_at)
        .execute(&self.pool)
        .await
        .map_err(|e| conflict(e, || format!("A secret named '{}'", s.name)))?;
        Ok(())
    }

    /// Looks a secret of `team_id` up by id, or else by name (an id match wins). Another
    /// team's secret is None, whatever its name or id.
    pub async fn get_secret(&self, team_id: &str, id_or_name: &str) -> Result<Option<SecretRow>> {
        let sql = format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 AND (id = $2 OR name = $2) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(team_id)
            .bind(id_or_name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(secret_from_row).transpose()
    }

    /// The decrypted value of `team_id`'s secret with this id or name (for header injection
    /// only), or None if the team has no such secret.
    pub async fn secret_value(&self, team_id: &str, id_or_name: &str) -> Result<Option<String>> {
        let cipher = self.cipher()?;
        let row = sqlx::query(
            "SELECT id, value, sealed FROM secrets WHERE team_id = $1 AND (id = $2 OR name = $2) \
             ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1",
        )
        .bind(team_id)
        .bind(id_or_name)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let id: String = row.try_get("id")?;
        let sealed: i64 = row.try_get("sealed")?;
        if sealed != 1 {
            // Every plain-text row is sealed at start; one now was written around the server.
            return Err(StoreError::SecretUnreadable { id });
        }
        let value: String = row.try_get("value")?;
        cipher
            .open(team_id, &id, &value)
            .map(Some)
            .map_err(|_| StoreError::SecretUnreadable { id })
    }

    /// `team_id`'s secrets ordered by `(created_at, id)`, strictly after the `after` cursor,
    /// at most `limit`.
    pub async fn list_secrets(
        &self,
        team_id: &str,
        limit: i64,
        after: Option<(i64, String)>,
    ) -> Result<Vec<SecretRow>> {
        let rows = match after {
            Some((ts, id)) => {
                let sql = format!(
                    "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 \
                     AND (created_at, id) > ($2, $3) ORDER BY created_at, id LIMIT $4"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(team_id)
                    .bind(ts)
                    .bind(id)
                    .bind(limit.max(0))
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                let sql = format!(
                    "SELECT {SECRET_COLUMNS} FROM secrets WHERE team_id = $1 \
                     ORDER BY created_at, id LIMIT $2"
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(team_id)
                    .bind(limit.max(0))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(secret_from_row).collect()
    }

    /// Stores a new value (version + 1, sealed with a fresh nonce) and, when given, replaces
    /// the metadata. Returns the updated secret, or None if `team_id` has no secret with this
    /// id or name.
    pub async fn update_secret(
        &self,
        team_id: &str,
        id_or_name: &str,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
        now: i64,
    ) -> Result<Option<SecretRow>> {
        let cipher = self.cipher()?;
        let Some(cur) = self.get_secret(team_id, id_or_name).await? else {
            return Ok(None);
        };
        let metadata = metadata.unwrap_or(&cur.metadata);
        let done = sqlx::query(
            "UPDATE secrets SET value = $1, sealed = 1, version = version + 1, metadata = $2, \
             updated_at = $3 WHERE id = $4 AND team_id = $5",
        )
        .bind(cipher.seal(&cur.team_id, &cur.id, value)?)
        .bind(to_json(metadata))
        .bind(now)
        .bind(cur.id.as_str())
        .bind(team_id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        self.get_secret(team_id, &cur.id).await
    }

    /// Deletes `team_id`'s secret with this id, or else this name. Returns false if there was
    /// none.
    pub async fn delete_secret(&self, team_id: &str, id_or_name: &str) -> Result<bool> {
        let Some(cur) = self.get_secret(team_id, id_or_name).await? else {
            return Ok(false);
        };
        let done = sqlx::query("DELETE FROM secrets WHERE id = $1 AND team_id = $2")
            .bind(cur.id.as_str())
            .bind(team_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
