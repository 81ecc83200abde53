//! The `templates` table: template ids and aliases mapped to their content hash and rootfs.
//! A template built through the API has a team (its alias is unique within it); a built-in
//! one has none and is public.

use sqlx::AssertSqlSafe;

use super::Store;
use super::query::conflict;
use super::rows::{TEMPLATE_COLUMNS, template_from_row};
use crate::{Result, TemplateRow};

impl Store {
    /// Inserts or replaces the template with this id (`created_at` of an existing row is kept).
    pub async fn upsert_template(&self, t: &TemplateRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO templates ({TEMPLATE_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (id) DO UPDATE SET alias = excluded.alias, \
             content_hash = excluded.content_hash, status = excluded.status, \
             rootfs_path = excluded.rootfs_path, cpu_count = excluded.cpu_count, \
             memory_mb = excluded.memory_mb, disk_size_mb = excluded.disk_size_mb, \
             updated_at = excluded.updated_at, team_id = excluded.team_id"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(t.id.as_str())
            .bind(t.alias.as_deref())
            .bind(t.content_hash.as_str())
            .bind(t.status.as_str())
            .bind(t.rootfs_path.as_str())
            .bind(t.cpu_count)
            .bind(t.memory_mb)
            .bind(t.disk_size_mb)
            .bind(t.created_at)
            .bind(t.updated_at)
            .bind(t.team_id.as_deref())
            .execute(&self.pool)
            .await
            .map_err(|e| {
                conflict(e, || {
                    format!(
                        "A template of this team with alias {:?}",
                        t.alias.as_deref().unwrap_or("")
                    )
                })
            })?;
        Ok(())
    }

    /// Looks a template up by id, or else a built-in (public) one by alias (an id match
    /// wins). A team's aliases are not global, so they are not looked up here.
    pub async fn get_template(&self, id_or_alias: &str) -> Result<Option<TemplateRow>> {
        let sql = format!(
            "SELECT {TEMPLATE_COLUMNS} FROM templates \
             WHERE id = $1 OR (alias = $1 AND team_id IS NULL) \
             ORDER BY CASE WHEN id = $1 THEN 0 ELSE 1 END LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id_or_alias)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(template_from_row).transpose()
    }

    /// All templates, oldest first.
    pub async fn list_templates(&self) -> Result<Vec<TemplateRow>> {
        let sql = format!("SELECT {TEMPLATE_COLUMNS} FROM templates ORDER BY created_at, id");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(template_from_row).collect()
    }

    /// Removes the template with this id (no error when it is absent).
    pub async fn delete_template(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM templates WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
