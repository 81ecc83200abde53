//! The `volumes` and `sandbox_volumes` tables: E2B volumes and which sandboxes mount them.

use sqlx::{AssertSqlSafe, Row};

use super::Store;
use super::query::conflict;
use crate::{Result, SandboxVolumeRow, VolumeRow};

const VOLUME_COLUMNS: &str = "id, team, name, owner_key_id, token, max_bytes, created_at";

fn volume_from_row(row: &sqlx::any::AnyRow) -> Result<VolumeRow> {
    Ok(VolumeRow {
        id: row.try_get("id")?,
        team: row.try_get("team")?,
        name: row.try_get("name")?,
        owner_key_id: row.try_get("owner_key_id")?,
        token: row.try_get("token")?,
        max_bytes: row.try_get("max_bytes")?,
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// Records a new volume; a name already used in the team is a [`crate::StoreError::Conflict`].
    pub async fn insert_volume(&self, v: &VolumeRow) -> Result<()> {
        let sql =
            format!("INSERT INTO volumes ({VOLUME_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)");
        sqlx::query(AssertSqlSafe(sql))
            .bind(v.id.as_str())
            .bind(v.team.as_str())
            .bind(v.name.as_str())
            .bind(v.owner_key_id.as_str())
            .bind(v.token.as_str())
            .bind(v.max_bytes)
            .bind(v.created_at)
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("A volume named '{}'", v.name)))?;
        Ok(())
    }

    /// The team's volume with this id.
    pub async fn get_volume(&self, team: &str, id: &str) -> Result<Option<VolumeRow>> {
        let sql = format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team = $1 AND id = $2");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(team)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(volume_from_row).transpose()
    }

    /// The volume with this id, whatever its team (the content API checks its token).
    pub async fn find_volume(&self, id: &str) -> Result<Option<VolumeRow>> {
        let sql = format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(volume_from_row).transpose()
    }

    /// The team's volume with this name.
    pub async fn get_volume_by_name(&self, team: &str, name: &str) -> Result<Option<VolumeRow>> {
        let sql = format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team = $1 AND name = $2");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(team)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(volume_from_row).transpose()
    }

    /// The team's volumes, oldest first.
    pub async fn list_volumes(&self, team: &str) -> Result<Vec<VolumeRow>> {
        let sql =
            format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE team = $1 ORDER BY created_at, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(team)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(volume_from_row).collect()
    }

    /// Every volume of every team (the server checks their storage at start).
    pub async fn all_volumes(&self) -> Result<Vec<VolumeRow>> {
        let sql = format!("SELECT {VOLUME_COLUMNS} FROM volumes ORDER BY created_at, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(volume_from_row).collect()
    }

    /// Deletes the volume and its mount records. Returns false if there was none.
    pub async fn delete_volume(&self, id: &str) -> Result<bool> {
        sqlx::query("DELETE FROM sandbox_volumes WHERE volume_id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        let done = sqlx::query("DELETE FROM volumes WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records the volumes a sandbox mounts.
    pub async fn insert_sandbox_volumes(&self, mounts: &[SandboxVolumeRow]) -> Result<()> {
        for m in mounts {
            sqlx::query(
                "INSERT INTO sandbox_volumes (sandbox_id, volume_id, path) VALUES ($1, $2, $3)",
            )
            .bind(m.sandbox_id.as_str())
            .bind(m.volume_id.as_str())
            .bind(m.path.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("A mount at '{}'", m.path)))?;
        }
        Ok(())
    }

    /// The volumes a sandbox mounts, by path.
    pub async fn sandbox_volumes(&self, sandbox_id: &str) -> Result<Vec<SandboxVolumeRow>> {
        let rows = sqlx::query(
            "SELECT sandbox_id, volume_id, path FROM sandbox_volumes WHERE sandbox_id = $1 \
             ORDER BY path",
        )
        .bind(sandbox_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SandboxVolumeRow {
                    sandbox_id: r.try_get("sandbox_id")?,
                    volume_id: r.try_get("volume_id")?,
                    path: r.try_get("path")?,
                })
            })
            .collect()
    }

    /// Ids of the sandboxes that mount the volume and are not dead (any state from starting to
    /// paused keeps a volume in use).
    pub async fn volume_users(&self, volume_id: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT v.sandbox_id AS sandbox_id FROM sandbox_volumes v \
             JOIN sandboxes s ON s.id = v.sandbox_id \
             WHERE v.volume_id = $1 AND s.state <> 'dead' ORDER BY v.sandbox_id",
        )
        .bind(volume_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>("sandbox_id")?))
            .collect()
    }
}
