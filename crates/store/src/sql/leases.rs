//! The `leases` table: one owner at a time for work that needs one (node health, object GC, pool
//! targets), without session advisory locks (a partitioned holder keeps one for as long as
//! its socket looks alive). A lease is a row taken by one guarded upsert; its epoch grows
//! whenever it changes hands and is the fencing token every change of the holder carries
//! ([`hold_fence`]). Rows are never deleted, so an epoch is never handed out twice.

use std::time::Duration;

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AssertSqlSafe, Row};

use super::Store;
use crate::{LeaseEpoch, LeaseRow, Result, StoreError};

const LEASE_COLUMNS: &str = "name, holder, epoch, expires_at";

/// Milliseconds of `d`, saturating.
pub(super) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An epoch as bound to a query. Stored epochs start at 1 and fit an `i64`; one that does not
/// (never handed out) is bound as -1, which matches no row.
pub(super) fn epoch_to_db(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(-1)
}

pub(super) fn epoch_from_db(epoch: i64, what: impl FnOnce() -> String) -> Result<u64> {
    u64::try_from(epoch)
        .map_err(|_| StoreError::Corrupt(format!("{}: negative epoch {epoch}", what())))
}

fn lease_from_row(row: &AnyRow) -> Result<LeaseRow> {
    let name: String = row.try_get("name")?;
    Ok(LeaseRow {
        epoch: LeaseEpoch(epoch_from_db(row.try_get("epoch")?, || {
            format!("lease {name}")
        })?),
        holder: row.try_get("holder")?,
        expires_at: row.try_get("expires_at")?,
        name,
    })
}

/// The fence of a change made in a transaction on behalf of a lease's holder: fails with
/// [`StoreError::Fenced`] unless `lease` is still at `epoch`, and otherwise keeps the lease
/// row locked (PostgreSQL: row lock; SQLite: the write lock, taken by this first write) until
/// the transaction ends, so no one takes the lease over while the change is being made. Call
/// it first in the transaction.
pub(super) async fn hold_fence(
    conn: &mut AnyConnection,
    lease: &str,
    epoch: LeaseEpoch,
) -> Result<()> {
    let held = sqlx::query("UPDATE leases SET epoch = epoch WHERE name = $1 AND epoch = $2")
        .bind(lease)
        .bind(epoch_to_db(epoch.0))
        .execute(&mut *conn)
        .await?;
    if held.rows_affected() > 0 {
        return Ok(());
    }
    let current = sqlx::query("SELECT epoch FROM leases WHERE name = $1")
        .bind(lease)
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| r.try_get::<i64, _>(0))
        .transpose()?
        .map(|e| epoch_from_db(e, || format!("lease {lease}")).map(LeaseEpoch))
        .transpose()?;
    Err(StoreError::Fenced {
        lease: lease.to_owned(),
        epoch,
        current,
    })
}

impl Store {
    /// Takes the lease `name` for `holder` until `now_ms + ttl`, if it is free (never taken,
    /// expired: `expires_at <= now_ms`, or released) or already `holder`'s. Returns the epoch
    /// the holder now has: +1 when the lease changes hands, the same when `holder` had it last
    /// (renewing, or taking it back before anyone else did); `None` while someone else holds it.
    ///
    /// One upsert: on PostgreSQL, callers racing for a free lease queue on its row and exactly
    /// one gets it. `holder` must name one incarnation (e.g. replica id and start time), not a
    /// host: a restarted holder must not inherit its predecessor's epoch.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
        now_ms: i64,
    ) -> Result<Option<LeaseEpoch>> {
        let row = sqlx::query(
            "INSERT INTO leases (name, holder, epoch, expires_at) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (name) DO UPDATE SET \
             epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch \
             ELSE leases.epoch + 1 END, \
             holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.expires_at <= $4 OR leases.holder = excluded.holder \
             RETURNING epoch",
        )
        .bind(name)
        .bind(holder)
        .bind(now_ms.saturating_add(duration_ms(ttl)))
        .bind(now_ms)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let epoch = r.try_get::<i64, _>(0)?;
            Ok(LeaseEpoch(epoch_from_db(epoch, || {
                format!("lease {name}")
            })?))
        })
        .transpose()
    }

    /// Extends `holder`'s lease to `now_ms + ttl`. Fails with [`StoreError::LeaseLost`] once
    /// the lease has expired (even if no one took it yet: [`Store::acquire_lease`] takes it
    /// back, at the same epoch if so) or is at another epoch.
    pub async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        epoch: LeaseEpoch,
        ttl: Duration,
        now_ms: i64,
    ) -> Result<()> {
        let done = sqlx::query(
            "UPDATE leases SET expires_at = $4 \
             WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > $5",
        )
        .bind(name)
        .bind(holder)
        .bind(epoch_to_db(epoch.0))
        .bind(now_ms.saturating_add(duration_ms(ttl)))
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() > 0 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost {
                lease: name.to_owned(),
                holder: holder.to_owned(),
                epoch,
            })
        }
    }

    /// Gives the lease up: it is free at once, for every caller whatever its clock (the row
    /// stays, with its epoch). Returns false when `holder` did not hold it at `now_ms` (it
    /// expired or changed hands), which changes nothing.
    pub async fn release_lease(
        &self,
        name: &str,
        holder: &str,
        epoch: LeaseEpoch,
        now_ms: i64,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE leases SET expires_at = 0 \
             WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > $4",
        )
        .bind(name)
        .bind(holder)
        .bind(epoch_to_db(epoch.0))
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The lease as stored, held or not ([`LeaseRow::is_held_at`]); `None` if never taken.
    pub async fn current_lease(&self, name: &str) -> Result<Option<LeaseRow>> {
        let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE name = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(lease_from_row).transpose()
    }
}
