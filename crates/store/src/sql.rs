//! The sqlx implementation of the store over the `any` driver, so one binary serves SQLite and
//! PostgreSQL from a URL.
//!
//! Portability rules the queries below follow: `$N` placeholders (sqlx's SQLite driver maps `$N`
//! to the N-th bound argument, so a number may repeat), only `TEXT`/`BIGINT` columns decoded as
//! `String`/`i64`, row-value comparisons for keyset pagination, `ON CONFLICT … DO UPDATE` for
//! upserts. Nothing database-specific (JSON operators, `RETURNING` differences) is used; metadata
//! filters run in Rust over the SQL-filtered rows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Executor, Row};

use crate::{
    ApiKeyRow, EgressEventRow, Result, SandboxFilter, SandboxRow, SandboxState, SecretRow,
    StoreError, TemplateRow,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// SQLite waits this long for a competing writer before failing with "database is locked".
const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;

/// Rows fetched per round trip when a metadata filter forces filtering in Rust.
const METADATA_SCAN_BATCH: i64 = 200;

const SANDBOX_COLUMNS: &str = "id, template_id, alias, state, owner_key_id, metadata, env_vars, \
     envd_access_token, cpu_count, memory_mb, disk_size_mb, started_at, end_at, driver_handle, \
     end_reason, allow_internet, network";

const SECRET_COLUMNS: &str = "id, name, value, version, metadata, created_at, updated_at";

const EGRESS_EVENT_COLUMNS: &str =
    "sandbox_id, at, protocol, host, ip, port, allowed, rule, bytes_out, bytes_in";

const TEMPLATE_COLUMNS: &str = "id, alias, content_hash, status, rootfs_path, cpu_count, \
     memory_mb, disk_size_mb, created_at, updated_at";

const API_KEY_COLUMNS: &str = "id, name, hash, prefix, created_at, revoked_at";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// Handle to the database; cheap to clone (it wraps a connection pool).
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

/// A value bound to a dynamically built query, in placeholder order.
enum Bind {
    Text(String),
    Int(i64),
}

/// A WHERE clause under construction, numbering `$N` placeholders as values are added.
#[derive(Default)]
struct Where {
    clauses: Vec<String>,
    binds: Vec<Bind>,
}

impl Where {
    fn placeholder(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("${}", self.binds.len())
    }

    fn push(&mut self, clause: String) {
        self.clauses.push(clause);
    }

    fn sql(&self) -> String {
        if self.clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.clauses.join(" AND "))
        }
    }

    fn sandbox_filter(filter: &SandboxFilter) -> Self {
        let mut w = Where::default();
        if !filter.states.is_empty() {
            let list: Vec<String> = filter
                .states
                .iter()
                .map(|s| w.placeholder(Bind::Text(s.as_str().to_owned())))
                .collect();
            w.push(format!("state IN ({})", list.join(", ")));
        }
        if let Some(t) = &filter.template_id {
            let p = w.placeholder(Bind::Text(t.clone()));
            w.push(format!("template_id = {p}"));
        }
        if let Some(ts) = filter.started_after {
            let p = w.placeholder(Bind::Int(ts));
            w.push(format!("started_at > {p}"));
        }
        if let Some(owner) = &filter.owner_key_id {
            let p = w.placeholder(Bind::Text(owner.clone()));
            w.push(format!("owner_key_id = {p}"));
        }
        w
    }
}

fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    binds: &'q [Bind],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    for b in binds {
        q = match b {
            Bind::Text(s) => q.bind(s.as_str()),
            Bind::Int(i) => q.bind(*i),
        };
    }
    q
}

impl Store {
    /// Opens (and for SQLite creates) the database and brings its schema up to date.
    ///
    /// Accepts `sqlite:///abs/path.db`, `sqlite:relative.db`, `sqlite::memory:` (any query such as
    /// `?mode=rwc` is kept; without `mode` the file is created) and `postgres://…` /
    /// `postgresql://…`.
    pub async fn open(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let (backend, url) = normalize_url(url)?;
        let options = AnyConnectOptions::from_str(&url).map_err(|source| StoreError::Connect {
            url: redact(&url),
            source,
        })?;

        let pool = match backend {
            Backend::Sqlite => {
                let in_memory = is_sqlite_memory(&url);
                // Each connection to `:memory:` is a separate database, so the pool must keep
                // exactly one connection alive forever.
                let mut pool_options =
                    AnyPoolOptions::new().max_connections(if in_memory { 1 } else { 8 });
                if in_memory {
                    pool_options = pool_options
                        .min_connections(1)
                        .idle_timeout(None)
                        .max_lifetime(None);
                }
                pool_options
                    .after_connect(move |conn, _meta| {
                        Box::pin(async move {
                            // WAL lets readers proceed during a write; it is persistent in the
                            // file, so re-issuing it on later connections is a no-op. NORMAL
                            // sync is durable enough in WAL mode (no corruption, at worst the
                            // last commits are lost on power failure).
                            let pragmas = if in_memory {
                                format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
                            } else {
                                format!(
                                    "PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}; \
                                     PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL"
                                )
                            };
                            conn.execute(AssertSqlSafe(pragmas)).await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await
            }
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(10)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options)
                    .await
            }
        }
        .map_err(|source| StoreError::Connect {
            url: redact(&url),
            source,
        })?;

        MIGRATOR.run(&pool).await.map_err(StoreError::Migrate)?;
        tracing::debug!(backend = backend_name(backend), url = %redact(&url), "store opened");
        Ok(Store { pool, backend })
    }

    /// Opens `<dir>/bulkhead.db`, creating the directory and the file as needed.
    pub async fn open_sqlite_in(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let dir = std::path::absolute(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join("bulkhead.db");
        Store::open(&format!("sqlite://{}?mode=rwc", encode_path(&path))).await
    }

    /// `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        backend_name(self.backend)
    }

    /// Closes the pool, waiting for connections to be returned (lets SQLite checkpoint the WAL).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ----- API keys -----

    pub async fn insert_api_key(&self, key: &ApiKeyRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, hash, prefix, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(key.id.as_str())
        .bind(key.name.as_str())
        .bind(key.hash.as_str())
        .bind(key.prefix.as_str())
        .bind(key.created_at)
        .bind(key.revoked_at)
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

    pub async fn count_active_api_keys(&self) -> Result<i64> {
        let row = sqlx::query("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    // ----- Sandboxes -----

    pub async fn insert_sandbox(&self, sb: &SandboxRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(sb.id.as_str())
            .bind(sb.template_id.as_str())
            .bind(sb.alias.as_deref())
            .bind(sb.state.as_str())
            .bind(sb.owner_key_id.as_str())
            .bind(to_json(&sb.metadata))
            .bind(to_json(&sb.env_vars))
            .bind(sb.envd_access_token.as_deref())
            .bind(sb.cpu_count)
            .bind(sb.memory_mb)
            .bind(sb.disk_size_mb)
            .bind(sb.started_at)
            .bind(sb.end_at)
            .bind(sb.driver_handle.as_deref())
            .bind(sb.end_reason.as_deref())
            .bind(i64::from(sb.allow_internet))
            .bind(sb.network.as_deref())
            .execute(&self.pool)
            .await
            .map_err(|e| conflict(e, || format!("Sandbox {}", sb.id)))?;
        Ok(())
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_from_row).transpose()
    }

    /// Sandboxes matching `filter`, ordered by `(started_at, id)` (descending if `order_desc`),
    /// starting strictly after the `after` cursor (the last row of the previous page) and at most
    /// `limit` of them.
    pub async fn list_sandboxes(
        &self,
        filter: &SandboxFilter,
        limit: Option<i64>,
        order_desc: bool,
        after: Option<(i64, String)>,
    ) -> Result<Vec<SandboxRow>> {
        let limit = limit.map(|l| l.max(0));
        if filter.metadata.is_empty() {
            return self
                .sandbox_page(filter, limit, order_desc, after.as_ref())
                .await;
        }
        // Metadata lives in a JSON column that the two databases query differently, so match it
        // here and keep pulling batches until the page is full or the table is exhausted.
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let want = limit.map(|l| l - out.len() as i64);
            if want == Some(0) {
                break;
            }
            let batch_size = want.map_or(METADATA_SCAN_BATCH, |w| w.max(METADATA_SCAN_BATCH));
            let batch = self
                .sandbox_page(filter, Some(batch_size), order_desc, cursor.as_ref())
                .await?;
            let exhausted = (batch.len() as i64) < batch_size;
            cursor = batch.last().map(|r| (r.started_at, r.id.clone()));
            for row in batch {
                if metadata_matches(&row.metadata, &filter.metadata) {
                    out.push(row);
                    if limit.is_some_and(|l| out.len() as i64 >= l) {
                        return Ok(out);
                    }
                }
            }
            if exhausted {
                break;
            }
        }
        Ok(out)
    }

    async fn sandbox_page(
        &self,
        filter: &SandboxFilter,
        limit: Option<i64>,
        order_desc: bool,
        after: Option<&(i64, String)>,
    ) -> Result<Vec<SandboxRow>> {
        let mut w = Where::sandbox_filter(filter);
        if let Some((started_at, id)) = after {
            let ts = w.placeholder(Bind::Int(*started_at));
            let id = w.placeholder(Bind::Text(id.clone()));
            let op = if order_desc { "<" } else { ">" };
            w.push(format!("(started_at, id) {op} ({ts}, {id})"));
        }
        let dir = if order_desc { "DESC" } else { "ASC" };
        let mut sql = format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes{} ORDER BY started_at {dir}, id {dir}",
            w.sql()
        );
        if let Some(limit) = limit {
            let p = w.placeholder(Bind::Int(limit));
            sql.push_str(&format!(" LIMIT {p}"));
        }
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(sandbox_from_row).collect()
    }

    pub async fn count_sandboxes(&self, filter: &SandboxFilter) -> Result<i64> {
        let w = Where::sandbox_filter(filter);
        if filter.metadata.is_empty() {
            let sql = format!("SELECT COUNT(*) FROM sandboxes{}", w.sql());
            let row = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
                .fetch_one(&self.pool)
                .await?;
            return Ok(row.try_get(0)?);
        }
        let sql = format!("SELECT id, metadata FROM sandboxes{}", w.sql());
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), &w.binds)
            .fetch_all(&self.pool)
            .await?;
        let mut n = 0;
        for row in &rows {
            let id: String = row.try_get(0)?;
            let metadata = from_json(&row.try_get::<String, _>(1)?, &id, "metadata")?;
            if metadata_matches(&metadata, &filter.metadata) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Returns false if there is no such sandbox.
    pub async fn set_sandbox_end_at(&self, id: &str, end_at: i64) -> Result<bool> {
        let done = sqlx::query("UPDATE sandboxes SET end_at = $1 WHERE id = $2")
            .bind(end_at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets the state and replaces `end_reason` with `reason` (so `None` clears it, e.g. on
    /// resume). Returns false if there is no such sandbox.
    pub async fn set_sandbox_state(
        &self,
        id: &str,
        state: SandboxState,
        reason: Option<&str>,
    ) -> Result<bool> {
        let done = sqlx::query("UPDATE sandboxes SET state = $1, end_reason = $2 WHERE id = $3")
            .bind(state.as_str())
            .bind(reason)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Returns false if there is no such sandbox.
    pub async fn set_sandbox_driver_handle(&self, id: &str, handle: Option<&str>) -> Result<bool> {
        let done = sqlx::query("UPDATE sandboxes SET driver_handle = $1 WHERE id = $2")
            .bind(handle)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes dead sandboxes whose `end_at` is before `ts`; returns how many.
    pub async fn delete_dead_sandboxes_before(&self, ts: i64) -> Result<u64> {
        let done = sqlx::query("DELETE FROM sandboxes WHERE state = $1 AND end_at < $2")
            .bind(SandboxState::Dead.as_str())
            .bind(ts)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Replaces a sandbox's network settings. Returns false if there is no such sandbox.
    pub async fn set_sandbox_network(
        &self,
        id: &str,
        allow_internet: bool,
        network: Option<&str>,
    ) -> Result<bool> {
        let done =
            sqlx::query("UPDATE sandboxes SET allow_internet = $1, network = $2 WHERE id = $3")
                .bind(i64::from(allow_internet))
                .bind(network)
                .bind(id)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() > 0)
    }

    // ----- Secrets -----

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

    // ----- Egress audit trail -----

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

    // ----- Templates -----

    /// Inserts or replaces the template with this id (`created_at` of an existing row is kept).
    pub async fn upsert_template(&self, t: &TemplateRow) -> Result<()> {
        let sql = format!(
            "INSERT INTO templates ({TEMPLATE_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (id) DO UPDATE SET alias = excluded.alias, \
             content_hash = excluded.content_hash, status = excluded.status, \
             rootfs_path = excluded.rootfs_path, cpu_count = excluded.cpu_count, \
             memory_mb = excluded.memory_mb, disk_size_mb = excluded.disk_size_mb, \
             updated_at = excluded.updated_at"
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
            .execute(&self.pool)
            .await
            .map_err(|e| {
                conflict(e, || {
                    format!(
                        "A template with alias {:?}",
                        t.alias.as_deref().unwrap_or("")
                    )
                })
            })?;
        Ok(())
    }

    /// Looks a template up by id, or else by alias (an id match wins).
    pub async fn get_template(&self, id_or_alias: &str) -> Result<Option<TemplateRow>> {
        let sql = format!(
            "SELECT {TEMPLATE_COLUMNS} FROM templates WHERE id = $1 OR alias = $1 \
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
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    }
}

/// Classifies the URL and, for SQLite, makes sure the file and its directory get created.
fn normalize_url(url: &str) -> Result<(Backend, String)> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((Backend::Postgres, url.to_owned()));
    }
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return Err(StoreError::InvalidUrl { url: redact(url) });
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: url.to_owned(),
        });
    }
    if is_sqlite_memory(url) {
        return Ok((Backend::Sqlite, url.to_owned()));
    }
    let has_mode = query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("mode=")));
    let mut query = query.unwrap_or("").to_owned();
    if !has_mode {
        // sqlx opens read-write without creating by default; a fresh data dir needs the file.
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str("mode=rwc");
    }
    let decoded = urlencoding_decode(path);
    if let Some(parent) = Path::new(&decoded)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    // `sqlite://` + relative path would make the first component a URL host; `sqlite:` keeps the
    // path opaque, and absolute paths read naturally as `sqlite:///abs`.
    let url = if path.starts_with('/') {
        format!("sqlite://{path}?{query}")
    } else {
        format!("sqlite:{path}?{query}")
    };
    Ok((Backend::Sqlite, url))
}

fn is_sqlite_memory(url: &str) -> bool {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    path == ":memory:" || query.split('&').any(|kv| kv == "mode=memory")
}

/// Percent-encodes a filesystem path for a `sqlite://` URL (sqlx decodes it again).
fn encode_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn urlencoding_decode(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Hides the password of a `postgres://user:pass@host` URL for messages and logs.
fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, host)) = rest.split_once('@')
        && let Some((user, _password)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_owned()
}

fn conflict(e: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict { what: what() }
        }
        _ => StoreError::Query(e),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn metadata_matches(have: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

fn to_json(map: &BTreeMap<String, String>) -> String {
    // A map of strings always serialises.
    serde_json::to_string(map).unwrap_or_else(|_| "{}".to_owned())
}

fn from_json(text: &str, id: &str, column: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::Corrupt(format!(
            "sandbox {id}: column {column} is not a JSON string map: {e}"
        ))
    })
}

fn api_key_from_row(row: &AnyRow) -> Result<ApiKeyRow> {
    Ok(ApiKeyRow {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        hash: row.try_get("hash")?,
        prefix: row.try_get("prefix")?,
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

fn sandbox_from_row(row: &AnyRow) -> Result<SandboxRow> {
    let id: String = row.try_get("id")?;
    let state: String = row.try_get("state")?;
    let state = SandboxState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("sandbox {id}: unknown state {state:?}")))?;
    let metadata = from_json(&row.try_get::<String, _>("metadata")?, &id, "metadata")?;
    let env_vars = from_json(&row.try_get::<String, _>("env_vars")?, &id, "env_vars")?;
    Ok(SandboxRow {
        template_id: row.try_get("template_id")?,
        alias: row.try_get("alias")?,
        state,
        owner_key_id: row.try_get("owner_key_id")?,
        metadata,
        env_vars,
        envd_access_token: row.try_get("envd_access_token")?,
        cpu_count: row.try_get("cpu_count")?,
        memory_mb: row.try_get("memory_mb")?,
        disk_size_mb: row.try_get("disk_size_mb")?,
        started_at: row.try_get("started_at")?,
        end_at: row.try_get("end_at")?,
        driver_handle: row.try_get("driver_handle")?,
        end_reason: row.try_get("end_reason")?,
        allow_internet: row.try_get::<i64, _>("allow_internet")? != 0,
        network: row.try_get("network")?,
        id,
    })
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
        name: row.try_get("name")?,
        value: row.try_get("value")?,
        version: row.try_get("version")?,
        metadata,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        id,
    })
}

fn egress_event_from_row(row: &AnyRow) -> Result<EgressEventRow> {
    Ok(EgressEventRow {
        sandbox_id: row.try_get("sandbox_id")?,
        at: row.try_get("at")?,
        protocol: row.try_get("protocol")?,
        host: row.try_get("host")?,
        ip: row.try_get("ip")?,
        port: row.try_get("port")?,
        allowed: row.try_get::<i64, _>("allowed")? != 0,
        rule: row.try_get("rule")?,
        bytes_out: row.try_get("bytes_out")?,
        bytes_in: row.try_get("bytes_in")?,
    })
}

fn template_from_row(row: &AnyRow) -> Result<TemplateRow> {
    Ok(TemplateRow {
        id: row.try_get("id")?,
        alias: row.try_get("alias")?,
        content_hash: row.try_get("content_hash")?,
        status: row.try_get("status")?,
        rootfs_path: row.try_get("rootfs_path")?,
        cpu_count: row.try_get("cpu_count")?,
        memory_mb: row.try_get("memory_mb")?,
        disk_size_mb: row.try_get("disk_size_mb")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_get_create_mode() {
        let dir = tempfile::tempdir().unwrap();
        let abs = dir.path().join("sub/x.db");
        let (b, url) = normalize_url(&format!("sqlite://{}", abs.display())).unwrap();
        assert_eq!(b, Backend::Sqlite);
        assert_eq!(url, format!("sqlite://{}?mode=rwc", abs.display()));
        assert!(
            abs.parent().unwrap().is_dir(),
            "parent directory is created"
        );

        let (_, url) = normalize_url("sqlite:rel.db?mode=ro").unwrap();
        assert_eq!(url, "sqlite:rel.db?mode=ro");
        let (_, url) = normalize_url("sqlite::memory:").unwrap();
        assert_eq!(url, "sqlite::memory:");
        assert!(matches!(
            normalize_url("mysql://x"),
            Err(StoreError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn path_encoding_round_trips() {
        let p = Path::new("/tmp/a b/c?d#e%f.db");
        let enc = encode_path(p);
        assert!(!enc.contains(' ') && !enc.contains('?') && !enc.contains('#'));
        assert_eq!(urlencoding_decode(&enc), p);
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("sqlite:///x.db"), "sqlite:///x.db");
    }
}
