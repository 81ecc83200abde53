//! The store's behaviour, run once against SQLite (a temp dir) and once against PostgreSQL
//! (`BULKHEAD_TEST_POSTGRES_URL`, see `.ci/postgres.sh`). The PostgreSQL half is gated with
//! `#[requires(Postgres)]`: ignored by plain `cargo test`, failed by `--include-ignored` without
//! a database. Every Postgres test gets its own schema, so they run in parallel on one database.

mod harness;
mod suite;
mod suite_idempotency;
mod suite_nodes;
mod suite_records;
mod suite_replicas;
mod suite_secrets;
mod suite_teams;

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
                #[bulkhead_testkit::requires(Postgres)]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let h = crate::harness::Harness::postgres().await;
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
    sandbox_network_updates,
    secrets_crud,
    secrets_per_team,
    secrets_sealed_at_rest,
    secrets_wrong_key,
    egress_events,
    persistence_roundtrip,
    snapshots_crud_and_pagination,
    volumes_crud,
    teams_credits_and_quotas,
    usage_records_and_sums,
    nodes_register_and_heartbeat,
    nodes_sweep_thresholds,
    nodes_sweep_is_fenced,
    nodes_sweep_marks_what_a_dead_node_ran_lost,
    node_sandboxes_expire_and_release,
    nodes_drain_through_the_store,
    leases_acquire_renew_expire,
    leases_race_has_one_winner,
    nodes_race_register,
    replicas_register_and_heartbeat,
    replicas_take_over_only_from_silent_owners,
    replicas_takeover_race_has_one_winner,
    idempotency_claim_complete_and_mismatch,
    idempotency_release_and_abandoned_claims,
    idempotency_keys_expire,
    idempotency_race_has_one_winner,
);

mod sqlite_only {
    #[tokio::test]
    async fn secrets_migrate_into_default_team() {
        crate::suite_secrets::secrets_migrate_into_default_team().await;
    }

    use bulkhead_store::{SandboxFilter, Store, StoreError};

    #[tokio::test]
    async fn memory_database_is_shared_by_the_pool() {
        let s = Store::open("sqlite::memory:").await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut row = crate::suite::sandbox_for_tests(&format!("m{i}"));
                row.started_at = i;
                s.insert_sandbox(&row).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            s.count_sandboxes(&SandboxFilter::default()).await.unwrap(),
            4
        );
    }

    #[tokio::test]
    async fn file_database_uses_wal_and_creates_directories() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a dir/with?odd#chars");
        let s = Store::open_sqlite_in(&nested).await.unwrap();
        assert_eq!(s.backend(), "sqlite");
        s.insert_sandbox(&crate::suite::sandbox_for_tests("x"))
            .await
            .unwrap();
        assert!(nested.join("bulkhead.db").is_file());
        // The -wal file exists while a WAL-mode database is open.
        assert!(nested.join("bulkhead.db-wal").is_file(), "journal_mode=WAL");

        let url = format!("sqlite://{}", dir.path().join("other/x.db").display());
        let s2 = Store::open(&url).await.unwrap();
        assert_eq!(s2.count_active_api_keys().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn unknown_scheme_is_rejected() {
        let err = Store::open("mysql://root@localhost/db").await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
        assert!(err.to_string().contains("sqlite:///abs/path.db"));
    }
}
