//! Idempotent creates over a real store shared by two engines (two API replicas on one
//! database): concurrent attempts with one key make one sandbox and all answer with it, another
//! request with the key is refused, a failed create frees the key, a killed sandbox is not
//! handed out again, and keys are per team.

use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::testing::{FakeDriver, fake_engine};
use bulkhead_engine::{
    Caller, CreateRequest, Engine, EngineConfig, EngineError, IdempotencyError, SandboxInfo,
};
use bulkhead_store::{SandboxFilter, Store};

fn request(template: &str) -> CreateRequest {
    let mut req = CreateRequest {
        template: template.into(),
        timeout: Some(120),
        secure: Some(true),
        ..Default::default()
    };
    req.metadata.insert("job".into(), "42".into());
    req.env_vars.insert("MODE".into(), "test".into());
    req
}

struct Replicas {
    _dir: tempfile::TempDir,
    store: Store,
    drivers: [Arc<FakeDriver>; 2],
    engines: [Arc<Engine>; 2],
    owner: Caller,
}

/// Two engines, each with its own driver and its own pool of connections to one SQLite file.
async fn replicas() -> Replicas {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        ..Default::default()
    };
    let template = bulkhead_engine::testing::base_template;
    let a = fake_engine(dir.path(), cfg(), template()).await;
    let store_b = Store::open_sqlite_in(dir.path()).await.unwrap();
    let driver_b = Arc::new(FakeDriver::default());
    let engine_b = Engine::new(store_b, driver_b.clone(), cfg());
    engine_b.register_template(template()).await.unwrap();
    Replicas {
        _dir: dir,
        store: a.store,
        drivers: [a.driver, driver_b],
        engines: [a.engine, engine_b],
        owner: a.owner,
    }
}

async fn sandboxes(store: &Store) -> i64 {
    store
        .count_sandboxes(&SandboxFilter::default())
        .await
        .unwrap()
}

fn idempotency(e: EngineError) -> IdempotencyError {
    match e {
        EngineError::Idempotency(i) => i,
        e => panic!("expected an idempotency refusal, got {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_with_one_key_on_two_replicas_make_one_sandbox() {
    let r = replicas().await;
    for d in &r.drivers {
        // Long enough that every attempt arrives while the first one is still creating.
        *d.start_delay.lock().unwrap() = Duration::from_millis(400);
    }
    let mut tasks = Vec::new();
    for i in 0..6 {
        let engine = r.engines[i % 2].clone();
        let owner = r.owner.clone();
        tasks.push(tokio::spawn(async move {
            engine
                .create_idempotent(&owner, request("base"), "order-7")
                .await
        }));
    }
    let mut answers: Vec<SandboxInfo> = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().expect("every attempt gets the sandbox"));
    }
    assert_eq!(sandboxes(&r.store).await, 1, "one sandbox for one key");
    let first = &answers[0];
    assert!(first.envd_access_token.is_some());
    for a in &answers {
        assert_eq!(
            (&a.id, &a.envd_access_token, &a.template_id),
            (&first.id, &first.envd_access_token, &first.template_id)
        );
    }
    let row = r.store.get_sandbox(&first.id).await.unwrap().unwrap();
    assert_eq!(row.envd_access_token, first.envd_access_token);

    // Later attempts, on either replica, answer with it too, without creating.
    for engine in &r.engines {
        let again = engine
            .create_idempotent(&r.owner, request("base"), "order-7")
            .await
            .unwrap();
        assert_eq!(
            (&again.id, &again.envd_access_token),
            (&first.id, &first.envd_access_token)
        );
    }
    assert_eq!(sandboxes(&r.store).await, 1);

    // The same key with another request is refused, whatever differs.
    let mut other_env = request("base");
    other_env.env_vars.insert("MODE".into(), "prod".into());
    let mut longer = request("base");
    longer.timeout = Some(121);
    for req in [other_env, longer] {
        let e = r.engines[1]
            .create_idempotent(&r.owner, req, "order-7")
            .await
            .unwrap_err();
        assert!(
            matches!(idempotency(e), IdempotencyError::Mismatch { ref key } if key == "order-7")
        );
    }
    // A plain create and another key each make a new sandbox.
    r.engines[0]
        .create(&r.owner, request("base"))
        .await
        .unwrap();
    let other = r.engines[1]
        .create_idempotent(&r.owner, request("base"), "order-8")
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
    assert_eq!(sandboxes(&r.store).await, 3);

    // Once its sandbox is killed, the key does not hand it out again.
    // Through the replica that made it (whichever won the race: each drives its own).
    let mut killed = false;
    for e in &r.engines {
        killed |= e.kill(&r.owner, &first.id).await.is_ok();
    }
    assert!(killed, "one of the replicas drives it");
    let e = r.engines[1]
        .create_idempotent(&r.owner, request("base"), "order-7")
        .await
        .unwrap_err();
    match idempotency(e) {
        IdempotencyError::Ended { key, sandbox_id } => {
            assert_eq!((key.as_str(), sandbox_id), ("order-7", first.id.clone()));
        }
        e => panic!("expected Ended, got {e:?}"),
    }
}

#[tokio::test]
async fn a_failed_create_frees_its_key_for_a_retry() {
    let r = replicas().await;
    *r.drivers[0].fail_start.lock().unwrap() =
        Some(|| bulkhead_engine::driver::DriverError::NotRunning);
    let e = r.engines[0]
        .create_idempotent(&r.owner, request("base"), "retry-me")
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Driver { .. }), "{e:?}");
    assert_eq!(sandboxes(&r.store).await, 0);
    assert_eq!(
        r.store
            .get_idempotency_key(&r.owner.team_id, "retry-me")
            .await
            .unwrap(),
        None,
        "the failed attempt released its claim"
    );
    // A refusal before anything started (an unknown template) frees it too.
    let e = r.engines[1]
        .create_idempotent(&r.owner, request("no-such-template"), "retry-me")
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::TemplateNotFound(_)), "{e:?}");

    // The retry, on the other replica, creates; the key then names its sandbox.
    let made = r.engines[1]
        .create_idempotent(&r.owner, request("base"), "retry-me")
        .await
        .unwrap();
    assert_eq!(sandboxes(&r.store).await, 1);
    let row = r
        .store
        .get_idempotency_key(&r.owner.team_id, "retry-me")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.sandbox_id.as_deref(), Some(made.id.as_str()));
    let again = r.engines[0]
        .create_idempotent(&r.owner, request("base"), "retry-me")
        .await
        .unwrap();
    assert_eq!(again.id, made.id);
}

#[tokio::test]
async fn keys_are_checked_and_scoped_to_the_team() {
    let r = replicas().await;
    for bad in ["", "has space", &"k".repeat(256), "caf\u{e9}"] {
        let e = r.engines[0]
            .create_idempotent(&r.owner, request("base"), bad)
            .await
            .unwrap_err();
        assert!(
            matches!(idempotency(e), IdempotencyError::InvalidKey { .. }),
            "{bad:?}"
        );
    }
    assert_eq!(
        sandboxes(&r.store).await,
        0,
        "nothing created for a bad key"
    );

    let mine = r.engines[0]
        .create_idempotent(&r.owner, request("base"), "shared")
        .await
        .unwrap();
    // Another team's same key is its own: it creates (even with another request).
    bulkhead_engine::teams::create(&r.store, "other", None)
        .await
        .unwrap();
    let (key, _) = bulkhead_engine::keys::create_in(&r.store, "k-other", "other")
        .await
        .unwrap();
    let theirs = key.caller();
    assert_ne!(theirs.team_id, r.owner.team_id);
    let made = r.engines[1]
        .create_idempotent(&theirs, request("debian"), "shared")
        .await
        .unwrap();
    assert_ne!(made.id, mine.id);
    assert_eq!(sandboxes(&r.store).await, 2);
}
