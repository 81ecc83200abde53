//! The `egress_events` table: the audit trail of every sandbox's egress decisions.

use sqlx::AssertSqlSafe;

use super::Store;
use super::rows::{EGRESS_EVENT_COLUMNS, egress_event_from_row};
use crate::{EgressEventRow, Result};

impl Store {
    /// Inserts a batch of events in one transaction.
    pub async fn insert_egress_events(&self, events: &[EgressEventRow]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "INSERT INTO egress_events ({EGRESS_EVENT_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        );
        let mut tx = self.pool.begin().await?;
        for e in events {
            sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(e.sandbox_id.as_str())
                .bind(e.at)
                .bind(e.protocol.as_str())
                .bind(e.host.as_deref())
                .bind(e.ip.as_deref())
                .bind(e.port)
                .bind(i64::from(e.allowed))
                .bind(e.rule.as_str())
                .bind(e.bytes_out)
                .bind(e.bytes_in)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The newest `limit` events of a sandbox, oldest first.
    pub async fn list_egress_events(
        &self,
        sandbox_id: &str,
        limit: i64,
    ) -> Result<Vec<EgressEventRow>> {
        let sql = format!(
            "SELECT {EGRESS_EVENT_COLUMNS} FROM egress_events WHERE sandbox_id = $1 \
             ORDER BY at DESC LIMIT $2"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(sandbox_id)
            .bind(limit.max(0))
            .fetch_all(&self.pool)
            .await?;
        let mut out: Vec<EgressEventRow> = rows
            .iter()
            .map(egress_event_from_row)
            .collect::<Result<_>>()?;
        // Stable: events with the same millisecond keep their relative (insertion) order.
        out.reverse();
        Ok(out)
    }

    /// Deletes events older than `ts`; returns how many.
    pub async fn delete_egress_events_before(&self, ts: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM egress_events WHERE at < $1")
            .bind(ts)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
