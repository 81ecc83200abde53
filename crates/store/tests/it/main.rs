//! The store's behaviour, run once against SQLite (a temp dir) and once against PostgreSQL when
//! `BULKHEAD_TEST_POSTGRES_URL` is set (see `.ci/postgres.sh`). Every Postgres test gets its own
//! schema, so the tests run in parallel against one database.

mod harness;
mod suite;

/// Generates one SQLite and one PostgreSQL test per suite function.
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let h = crate::harness::Harness::sqlite().await;
                    crate::suite::$name(&h).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(h) = crate::harness::Harness::postgres(stringify!($name)).await else {
                        return;
                    };
                    crate::suite::$name(&h).await;
                }
            )*
        }
    };
}

store_tests!(
    open_is_idempotent,
    api_keys_roundtrip,
    api_key_revoke_by_prefix,
    sandbox_roundtrip,
    sandbox_updates,
    sandbox_filters_and_counts,
    sandbox_keyset_pagination,
    sandbox_pagination_with_metadata_filter,
    delete_dead_sandboxes,
    templates_upsert_and_lookup,
    concurrent_writes,
);
