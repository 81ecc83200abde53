//! One store per test: SQLite in a temp dir, or a private schema in the PostgreSQL database
//! `BULKHEAD_TEST_POSTGRES_URL` names (dropped afterwards, even when the test fails).

use std::sync::atomic::{AtomicU32, Ordering};

use bulkhead_store::Store;
use bulkhead_testkit::POSTGRES_ENV;
use sqlx::Connection;

pub struct Harness {
    pub store: Store,
    /// URL that reopens the same database (same file / same schema).
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, schema: String },
}

impl Harness {
    pub async fn sqlite() -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open_sqlite_in(dir.path())
            .await
            .expect("open sqlite store");
        let url = format!("sqlite://{}", dir.path().join("bulkhead.db").display());
        Harness {
            store,
            url,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    /// A private schema in `BULKHEAD_TEST_POSTGRES_URL`'s database; fails the test without one.
    pub async fn postgres() -> Harness {
        let admin_url = bulkhead_testkit::postgres_url();
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!(
            "bh_test_{}_{}_{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        sqlx::any::install_default_drivers();
        let mut admin = sqlx::AnyConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("connect to {POSTGRES_ENV}: {e}"));
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .expect("create test schema");
        admin.close().await.ok();

        // libpq-style startup option: every pooled connection resolves tables in the schema.
        let sep = if admin_url.contains('?') { '&' } else { '?' };
        let url = format!("{admin_url}{sep}options=-c%20search_path%3D{schema}");
        let store = Store::open(&url).await.expect("open postgres store");
        Harness {
            store,
            url,
            cleanup: Cleanup::Postgres { admin_url, schema },
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let Cleanup::Postgres { admin_url, schema } = &self.cleanup else {
            return;
        };
        // Runs on panic too; a fresh thread and runtime because Drop cannot be async.
        let (admin_url, schema) = (admin_url.clone(), schema.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut c) = sqlx::AnyConnection::connect(&admin_url).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS {schema} CASCADE"
                    )))
                    .execute(&mut c)
                    .await;
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}
