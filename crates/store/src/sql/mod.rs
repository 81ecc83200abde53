//! The sqlx implementation of the store over the `any` driver, so one binary serves SQLite and
//! PostgreSQL from a URL.
//!
//! Portability rules the queries below follow: `$N` placeholders (sqlx's SQLite driver maps `$N`
//! to the N-th bound argument, so a number may repeat), only `TEXT`/`BIGINT` columns decoded as
//! `String`/`i64`, row-value comparisons for keyset pagination, `ON CONFLICT … DO UPDATE` for
//! upserts (with a `WHERE` for conditional ones), and `RETURNING` only as both read it: the
//! columns of the rows an `INSERT`/`UPDATE` wrote (SQLite ≥ 3.35), none when it wrote none.
//! Nothing database-specific (JSON operators, `RETURNING` differences) is used; metadata
//! filters run in Rust over the SQL-filtered rows.

mod api_keys;
mod egress;
mod idempotency;
mod leases;
mod migrations;
mod node_sandboxes;
mod nodes;
mod persistence;
mod query;
mod replicas;
mod rows;
mod sandboxes;
mod secrets;
mod teams;
mod templates;
mod url;
mod usage;
mod volumes;

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, AssertSqlSafe, Executor};

use self::url::{Backend, backend_name, encode_path, is_sqlite_memory, normalize_url, redact};
use crate::{Result, SecretCipher, StoreError};

pub use self::secrets::{SecretsKeySource, SecretsUnlocked};

/// SQLite waits this long for a competing writer before failing with "database is locked".
const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;

/// Handle to the database; cheap to clone (it wraps a connection pool).
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// Seals and opens secret values once [`Store::unlock_secrets`] has run; shared by clones.
    secrets: Arc<OnceLock<SecretCipher>>,
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

        migrations::migrator()
            .run(&pool)
            .await
            .map_err(StoreError::Migrate)?;
        tracing::debug!(backend = backend_name(backend), url = %redact(&url), "store opened");
        Ok(Store {
            pool,
            backend,
            secrets: Arc::default(),
        })
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
}
