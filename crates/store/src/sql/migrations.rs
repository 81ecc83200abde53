//! The schema migrations, embedded in the binary without sqlx's `migrate!` macro (its
//! proc-macro compiles sqlx and both database drivers a second time, for the host: a minute of
//! a first build). Version, description, type and checksum are made as the macro made them, so
//! a database migrated by an earlier build sees the same history; a test compares them with
//! sqlx's own reading of the directory.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};

/// Every file of `migrations/`, oldest first (a test fails when one is missing here).
const FILES: &[(&str, &str)] = &[
    (
        "20260101000000_initial.sql",
        include_str!("../../migrations/20260101000000_initial.sql"),
    ),
    (
        "20260301000000_network.sql",
        include_str!("../../migrations/20260301000000_network.sql"),
    ),
    (
        "20261120000000_persistence.sql",
        include_str!("../../migrations/20261120000000_persistence.sql"),
    ),
    (
        "20261124000000_volumes.sql",
        include_str!("../../migrations/20261124000000_volumes.sql"),
    ),
    (
        "20261125000000_teams.sql",
        include_str!("../../migrations/20261125000000_teams.sql"),
    ),
    (
        "20261127000000_template_teams.sql",
        include_str!("../../migrations/20261127000000_template_teams.sql"),
    ),
    (
        "20261127000100_secret_teams.sql",
        include_str!("../../migrations/20261127000100_secret_teams.sql"),
    ),
    (
        "20261201000000_nodes_and_leases.sql",
        include_str!("../../migrations/20261201000000_nodes_and_leases.sql"),
    ),
    (
        "20261202000000_sandbox_nodes.sql",
        include_str!("../../migrations/20261202000000_sandbox_nodes.sql"),
    ),
    (
        "20261202000200_node_drain.sql",
        include_str!("../../migrations/20261202000200_node_drain.sql"),
    ),
    (
        "20261202000100_idempotency_keys.sql",
        include_str!("../../migrations/20261202000100_idempotency_keys.sql"),
    ),
    (
        "20261202000300_replicas.sql",
        include_str!("../../migrations/20261202000300_replicas.sql"),
    ),
];

/// `<version>_<description>.sql` → a migration, as sqlx names one.
fn migration(file: &str, sql: &'static str) -> Migration {
    let (version, rest) = file.split_once('_').expect("<version>_<name>.sql");
    let migration_type = MigrationType::from_filename(rest);
    let description = rest
        .trim_end_matches(migration_type.suffix())
        .replace('_', " ");
    Migration::new(
        version.parse().expect("a numeric migration version"),
        Cow::Owned(description),
        migration_type,
        sqlx::SqlSafeStr::into_sql_str(sql),
        sql.starts_with("-- no-transaction"),
    )
}

pub(super) fn migrator() -> Migrator {
    Migrator::with_migrations(FILES.iter().map(|(f, sql)| migration(f, sql)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_embedded_migrations_are_sqlx_s_reading_of_the_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let read = Migrator::new(dir).await.expect("sqlx reads the migrations");
        let ours = migrator();
        let key = |m: &Migration| {
            (
                m.version,
                m.description.to_string(),
                m.migration_type,
                m.checksum.to_vec(),
                m.no_tx,
                m.sql.as_str().to_owned(),
            )
        };
        let a: Vec<_> = read.iter().map(key).collect();
        let b: Vec<_> = ours.iter().map(key).collect();
        assert_eq!(a, b);
    }
}
