//! Secrets: per-team CRUD, values sealed at rest, plain-text rows sealed by the first unlock,
//! and a wrong key refused (never served as empty secrets).

use bulkhead_store::{SecretRow, SecretsKey, SecretsKeySource, Store, StoreError};
use sqlx::{Connection, Row};

use crate::harness::Harness;
use crate::suite::map;

fn secret(team: &str, id: &str, name: &str, created_at: i64) -> SecretRow {
    SecretRow {
        id: id.to_owned(),
        team_id: team.to_owned(),
        name: name.to_owned(),
        version: 1,
        metadata: map(&[("owner", "ops")]),
        created_at,
        updated_at: created_at,
    }
}

async fn unlocked(h: &Harness) -> SecretsKey {
    let key = SecretsKey::generate().unwrap();
    h.store.unlock_secrets_with(&key, "test key").await.unwrap();
    key
}

/// A raw connection to the harness's database, to see what is really stored.
async fn raw(h: &Harness) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    sqlx::AnyConnection::connect(&h.url).await.unwrap()
}

async fn stored_value(h: &Harness, id: &str) -> (String, i64) {
    let row = sqlx::query("SELECT value, sealed FROM secrets WHERE id = $1")
        .bind(id)
        .fetch_one(&mut raw(h).await)
        .await
        .unwrap();
    (row.get("value"), row.get("sealed"))
}

pub async fn secrets_crud(h: &Harness) {
    let s = &h.store;
    unlocked(h).await;
    let a = secret("default", "sec_a", "openai-key", 10);
    s.insert_secret(&a, "value-of-openai-key").await.unwrap();
    assert_eq!(
        s.get_secret("default", "sec_a").await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(
        s.get_secret("default", "openai-key").await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(s.get_secret("default", "nope").await.unwrap(), None);
    assert_eq!(
        s.secret_value("default", "openai-key")
            .await
            .unwrap()
            .as_deref(),
        Some("value-of-openai-key")
    );
    // Names are unique within a team.
    let err = s
        .insert_secret(&secret("default", "sec_b", "openai-key", 11), "x")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");

    // Update by name: new value, version + 1, metadata kept when not given.
    let up = s
        .update_secret("default", "openai-key", "v2", None, 50)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((up.version, up.updated_at), (2, 50));
    assert_eq!(up.metadata, a.metadata);
    assert_eq!(up.created_at, 10);
    assert_eq!(
        s.secret_value("default", "sec_a").await.unwrap().as_deref(),
        Some("v2")
    );
    let up = s
        .update_secret("default", "sec_a", "v3", Some(&map(&[("k", "v")])), 60)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((up.version, up.metadata.clone()), (3, map(&[("k", "v")])));
    assert_eq!(
        s.update_secret("default", "nope", "x", None, 1)
            .await
            .unwrap(),
        None
    );

    // Keyset listing by (created_at, id).
    for (i, n) in ["b", "c", "d"].iter().enumerate() {
        s.insert_secret(
            &secret("default", &format!("sec_{n}"), n, 20 + i as i64),
            "v",
        )
        .await
        .unwrap();
    }
    let page1 = s.list_secrets("default", 2, None).await.unwrap();
    assert_eq!(
        page1.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sec_a", "sec_b"]
    );
    let last = page1.last().unwrap();
    let page2 = s
        .list_secrets("default", 2, Some((last.created_at, last.id.clone())))
        .await
        .unwrap();
    assert_eq!(
        page2.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sec_c", "sec_d"]
    );

    assert!(s.delete_secret("default", "c").await.unwrap());
    assert!(s.delete_secret("default", "sec_d").await.unwrap());
    assert!(!s.delete_secret("default", "sec_d").await.unwrap());
    assert_eq!(s.list_secrets("default", 10, None).await.unwrap().len(), 2);
    assert_eq!(s.secret_value("default", "sec_d").await.unwrap(), None);
}

pub async fn secrets_per_team(h: &Harness) {
    let s = &h.store;
    unlocked(h).await;
    // Two teams may each have `api-token`.
    let a = secret("team-a", "sec_a", "api-token", 10);
    let b = secret("team-b", "sec_b", "api-token", 11);
    s.insert_secret(&a, "A-VALUE").await.unwrap();
    s.insert_secret(&b, "B-VALUE").await.unwrap();
    s.insert_secret(&secret("team-a", "sec_a2", "only-a", 12), "A-ONLY")
        .await
        .unwrap();

    // Each team sees its own, by name; the other team's id is unknown.
    assert_eq!(
        s.get_secret("team-b", "api-token").await.unwrap(),
        Some(b.clone())
    );
    assert_eq!(s.get_secret("team-b", "sec_a").await.unwrap(), None);
    assert_eq!(s.get_secret("team-b", "only-a").await.unwrap(), None);
    let value =
        |t: &'static str, n: &'static str| async move { s.secret_value(t, n).await.unwrap() };
    assert_eq!(
        value("team-a", "api-token").await.as_deref(),
        Some("A-VALUE")
    );
    assert_eq!(
        value("team-b", "api-token").await.as_deref(),
        Some("B-VALUE")
    );
    assert_eq!(value("team-b", "only-a").await, None);
    assert_eq!(value("team-b", "sec_a").await, None);
    assert_eq!(value("team-c", "api-token").await, None);

    // B can neither overwrite nor delete A's secret, by id or by a name only A has.
    assert_eq!(
        s.update_secret("team-b", "sec_a", "HIJACK", None, 20)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.update_secret("team-b", "only-a", "HIJACK", None, 20)
            .await
            .unwrap(),
        None
    );
    assert!(!s.delete_secret("team-b", "sec_a").await.unwrap());
    assert!(!s.delete_secret("team-b", "only-a").await.unwrap());
    assert_eq!(
        value("team-a", "api-token").await.as_deref(),
        Some("A-VALUE")
    );
    assert_eq!(value("team-a", "only-a").await.as_deref(), Some("A-ONLY"));
    // B's update by the shared name changes B's only.
    s.update_secret("team-b", "api-token", "B-2", None, 30)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        value("team-a", "api-token").await.as_deref(),
        Some("A-VALUE")
    );
    assert_eq!(value("team-b", "api-token").await.as_deref(), Some("B-2"));

    let ids = |rows: Vec<SecretRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_secrets("team-a", 10, None).await.unwrap()),
        ["sec_a", "sec_a2"]
    );
    assert_eq!(
        ids(s.list_secrets("team-b", 10, None).await.unwrap()),
        ["sec_b"]
    );
    assert!(s.delete_secret("team-b", "api-token").await.unwrap());
    assert_eq!(
        value("team-a", "api-token").await.as_deref(),
        Some("A-VALUE")
    );
}

pub async fn secrets_sealed_at_rest(h: &Harness) {
    let key = unlocked(h).await;
    let s = &h.store;
    s.insert_secret(&secret("team-a", "sec_a", "tok", 10), "PLAIN-A-42")
        .await
        .unwrap();
    s.insert_secret(&secret("team-b", "sec_b", "tok", 11), "PLAIN-B-42")
        .await
        .unwrap();
    let (stored, sealed) = stored_value(h, "sec_a").await;
    assert_eq!(sealed, 1);
    assert!(!stored.contains("PLAIN-A-42"), "{stored}");
    // A fresh nonce per write: the same value sealed twice differs.
    s.update_secret("team-a", "sec_a", "PLAIN-A-42", None, 12)
        .await
        .unwrap();
    assert_ne!(stored_value(h, "sec_a").await.0, stored);

    // A row written before encryption (plain text, sealed = 0) ...
    let mut db = raw(h).await;
    sqlx::query(
        "INSERT INTO secrets (id, team_id, name, value, sealed, version, metadata, created_at, \
         updated_at) VALUES ('sec_old', 'default', 'legacy', 'LEGACY-PLAIN-7', 0, 1, '{}', 1, 1)",
    )
    .execute(&mut db)
    .await
    .unwrap();
    // ... is not served as is by a server that holds the key,
    assert!(matches!(
        s.secret_value("default", "legacy").await,
        Err(StoreError::SecretUnreadable { .. })
    ));
    // and a store that has no key serves no value at all, nor writes one.
    let locked = Store::open(&h.url).await.unwrap();
    assert!(matches!(
        locked.secret_value("team-a", "tok").await,
        Err(StoreError::SecretsLocked)
    ));
    assert!(matches!(
        locked
            .insert_secret(&secret("team-a", "sec_x", "x", 1), "v")
            .await,
        Err(StoreError::SecretsLocked)
    ));
    // Its unlock seals the plain-text row in place, once.
    assert_eq!(locked.unlock_secrets_with(&key, "k").await.unwrap(), 1);
    assert_eq!(locked.unlock_secrets_with(&key, "k").await.unwrap(), 0);
    let (stored, sealed) = stored_value(h, "sec_old").await;
    assert_eq!(sealed, 1);
    assert!(!stored.contains("LEGACY-PLAIN-7"), "{stored}");
    assert_eq!(
        locked
            .secret_value("default", "legacy")
            .await
            .unwrap()
            .as_deref(),
        Some("LEGACY-PLAIN-7")
    );

    // A's sealed value copied into B's row does not decrypt there (bound to team and id).
    let a_value = stored_value(h, "sec_a").await.0;
    sqlx::query("UPDATE secrets SET value = $1 WHERE id = 'sec_b'")
        .bind(a_value)
        .execute(&mut db)
        .await
        .unwrap();
    let err = s.secret_value("team-b", "tok").await.unwrap_err();
    assert!(
        matches!(&err, StoreError::SecretUnreadable { id } if id == "sec_b"),
        "{err:?}"
    );
    assert_eq!(
        s.secret_value("team-a", "tok").await.unwrap().as_deref(),
        Some("PLAIN-A-42")
    );
}

pub async fn secrets_wrong_key(h: &Harness) {
    let dir = tempfile::tempdir().unwrap();
    // First start: the key file is generated in the data dir and used.
    let source = SecretsKeySource::DataDir(dir.path().to_owned());
    let first = h.store.unlock_secrets(&source).await.unwrap();
    assert!(first.generated);
    assert_eq!(first.key_file, dir.path().join("secrets.key"));
    h.store
        .insert_secret(&secret("team-a", "sec_a", "tok", 10), "V")
        .await
        .unwrap();

    // The next start finds the same file.
    let again = Store::open(&h.url).await.unwrap();
    let second = again.unlock_secrets(&source).await.unwrap();
    assert!(!second.generated);
    assert_eq!(
        again
            .secret_value("team-a", "tok")
            .await
            .unwrap()
            .as_deref(),
        Some("V")
    );

    // A lost key file (a new one generated elsewhere) or another operator key is refused at
    // unlock, and that store still serves no value (never an empty or wrong one).
    let other_dir = tempfile::tempdir().unwrap();
    let wrong = Store::open(&h.url).await.unwrap();
    let err = wrong
        .unlock_secrets(&SecretsKeySource::DataDir(other_dir.path().to_owned()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::SecretsKeyMismatch { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("--secrets-key-file"), "{err}");
    let key_file = other_dir.path().join("operator.key");
    std::fs::write(&key_file, format!("{}\n", "7f".repeat(32))).unwrap();
    let err = wrong
        .unlock_secrets(&SecretsKeySource::File(key_file.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::SecretsKeyMismatch { key } if key.contains("operator.key")),
        "{err:?}"
    );
    assert!(matches!(
        wrong.secret_value("team-a", "tok").await,
        Err(StoreError::SecretsLocked)
    ));
    // An operator key file that is missing is an error, not a reason to make one.
    let err = wrong
        .unlock_secrets(&SecretsKeySource::File(other_dir.path().join("absent")))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::SecretCrypto(_)), "{err:?}");
    assert!(!other_dir.path().join("absent").exists());
    // A store already unlocked refuses a second, different key.
    let err = h
        .store
        .unlock_secrets(&SecretsKeySource::File(key_file))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::SecretsKeyMismatch { .. }),
        "{err:?}"
    );
}

/// Secrets saved before this change (no team, plain text) land in the default team, keep their
/// names, and are sealed by the first unlock. SQLite only: it replays the earlier migrations
/// into a file, writes an old-shape row, then opens the store (which runs the rest).
pub async fn secrets_migrate_into_default_team() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for e in std::fs::read_dir(&all).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.as_str() < "20261127000100" {
            std::fs::copy(all.join(&name), old.join(&name)).unwrap();
        }
    }
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("bulkhead.db").display()
    );
    sqlx::any::install_default_drivers();
    {
        let mut db = sqlx::AnyConnection::connect(&url).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&mut db)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO secrets (id, name, value, version, metadata, created_at, updated_at) \
             VALUES ('sec_old', 'openai', 'OLD-PLAIN-99', 3, '{\"a\":\"b\"}', 5, 6)",
        )
        .execute(&mut db)
        .await
        .unwrap();
        db.close().await.unwrap();
    }
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let row = store
        .get_secret("default", "openai")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.id.as_str(), row.team_id.as_str(), row.version),
        ("sec_old", "default", 3)
    );
    assert_eq!(row.metadata, map(&[("a", "b")]));
    let key = SecretsKey::generate().unwrap();
    assert_eq!(store.unlock_secrets_with(&key, "k").await.unwrap(), 1);
    assert_eq!(
        store
            .secret_value("default", "openai")
            .await
            .unwrap()
            .as_deref(),
        Some("OLD-PLAIN-99")
    );
    // Another team may now take the same name.
    store
        .insert_secret(&secret("team-b", "sec_new", "openai", 7), "B")
        .await
        .unwrap();
    let mut db = sqlx::AnyConnection::connect(&url).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT value FROM secrets WHERE id = 'sec_old'")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert!(!stored.contains("OLD-PLAIN-99"));
}
