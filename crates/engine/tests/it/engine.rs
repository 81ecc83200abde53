//! Engine logic against a test double driver (no root): lifecycle, TTL, pool, recovery.
//! The double runs a real HTTP agent stand-in over in-memory pipes so `/init` is exercised.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::driver::{Driver, SandboxSpec};
use bulkhead_engine::testing::{FakeDriver, FakeEngine, fake_engine};
use bulkhead_engine::{
    CreateRequest, Engine, EngineConfig, EngineError, ListRequest, TemplateInfo,
};
use bulkhead_store::{SandboxState, Store};

/// A request for the `base` template with defaults.
fn base() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        ..Default::default()
    }
}

fn template() -> TemplateInfo {
    bulkhead_engine::testing::base_template()
}

async fn setup(
    pool: usize,
) -> (
    tempfile::TempDir,
    Arc<FakeDriver>,
    Arc<Engine>,
    bulkhead_engine::Caller,
    Store,
) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(pool),
        reap_interval: Duration::from_millis(20),
        ..Default::default()
    };
    let f = fake_engine(dir.path(), cfg, template()).await;
    (dir, f.driver, f.engine, f.owner, f.store)
}

#[tokio::test]
async fn create_get_list_kill() {
    let (_d, driver, engine, owner, store) = setup(0).await;
    let mut md = BTreeMap::new();
    md.insert("user".to_string(), "alice".to_string());
    let info = engine
        .create(
            &owner,
            CreateRequest {
                template: "debian".into(),
                metadata: md.clone(),
                secure: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(info.template_id, "base");
    assert_eq!(info.id.len(), 20);
    assert!(info.envd_access_token.is_some());
    let ttl = info.end_at - info.started_at;
    assert_eq!(ttl.num_seconds(), 300);

    let got = engine.get(&me(), &info.id).await.unwrap();
    assert_eq!(got.metadata, md);
    // Legacy `<id>-<clientID>` form.
    assert!(
        engine
            .get(&me(), &format!("{}-bulkhead", info.id))
            .await
            .is_ok()
    );

    let other = engine.create(&owner, base()).await.unwrap();
    let page = engine
        .list(
            &me(),
            &ListRequest {
                metadata: md.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].id, info.id);
    assert_eq!(page.total_running, 2);

    // Pagination: limit 1 gives a token, the second page has the other sandbox.
    let p1 = engine
        .list(
            &me(),
            &ListRequest {
                limit: Some(1),
                order_desc: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p1.items.len(), 1);
    let p2 = engine
        .list(
            &me(),
            &ListRequest {
                limit: Some(1),
                order_desc: true,
                next_token: p1.next_token.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(p2.items.len(), 1);
    assert_ne!(p1.items[0].id, p2.items[0].id);
    assert!(p2.next_token.is_none());

    engine.kill(&me(), &info.id).await.unwrap();
    assert!(matches!(
        engine.kill(&me(), &info.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
    assert!(matches!(
        engine.get(&me(), &info.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
    engine.kill(&me(), &other.id).await.unwrap();
    assert_eq!(driver.stopped.load(Ordering::SeqCst), 2);
    let row = store.get_sandbox(&info.id).await.unwrap().unwrap();
    assert_eq!(row.state, SandboxState::Dead);
    assert_eq!(row.end_reason.as_deref(), Some("killed"));
}

#[tokio::test]
async fn unknown_template_and_bad_timeout_are_rejected() {
    let (_d, driver, engine, owner, _store) = setup(0).await;
    let e = engine
        .create(
            &owner,
            CreateRequest {
                template: "nope".into(),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(e, Err(EngineError::TemplateNotFound(_))));
    let e = engine
        .create(
            &owner,
            CreateRequest {
                timeout: Some(10 * 24 * 3600),
                ..base()
            },
        )
        .await;
    assert!(matches!(e, Err(EngineError::BadRequest(_))));
    assert_eq!(
        driver.started.load(Ordering::SeqCst),
        0,
        "nothing started for rejected requests"
    );
}

#[tokio::test]
async fn ttl_reaper_kills_and_timeouts_move_end_at() {
    let (_d, _driver, engine, owner, store) = setup(0).await;
    engine.start_background();
    let sb = engine
        .create(
            &owner,
            CreateRequest {
                timeout: Some(1),
                ..base()
            },
        )
        .await
        .unwrap();
    // connect extends, never shortens.
    let (c, resumed) = engine
        .connect(
            &me(),
            &sb.id,
            bulkhead_engine::ResumeRequest {
                timeout: Some(60),
                memory: true,
            },
        )
        .await
        .unwrap();
    assert!(!resumed);
    assert!((c.end_at - c.started_at).num_seconds() >= 59);
    let (c2, _) = engine
        .connect(
            &me(),
            &sb.id,
            bulkhead_engine::ResumeRequest {
                timeout: Some(1),
                memory: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(c2.end_at, c.end_at);
    // set_timeout may shorten.
    engine.set_timeout(&me(), &sb.id, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        engine.get(&me(), &sb.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
    let row = store.get_sandbox(&sb.id).await.unwrap().unwrap();
    assert_eq!(row.end_reason.as_deref(), Some("timeout"));
}

#[tokio::test]
async fn dead_sandbox_is_noticed() {
    let (_d, driver, engine, owner, store) = setup(0).await;
    let sb = engine.create(&owner, base()).await.unwrap();
    let h: bulkhead_engine::driver::DriverHandle = serde_json::from_str(
        &store
            .get_sandbox(&sb.id)
            .await
            .unwrap()
            .unwrap()
            .driver_handle
            .unwrap(),
    )
    .unwrap();
    driver.crash(h.pid);
    for _ in 0..50 {
        if engine.get(&me(), &sb.id).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(
        engine.get(&me(), &sb.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn warm_pool_is_claimed_and_refilled_and_init_applies_identity() {
    let (_d, driver, engine, owner, _store) = setup(2).await;
    engine.start_background();
    for _ in 0..100 {
        if engine.pool_len("base") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(engine.pool_len("base"), 2);
    // Starts are slow from here: a cold start would still be counted when the create
    // returns, while a refill begun after the claim is not yet.
    *driver.start_delay.lock().unwrap() = Duration::from_millis(500);
    let started_before = driver.started.load(Ordering::SeqCst);
    let mut env = BTreeMap::new();
    env.insert("FOO".to_string(), "bar".to_string());
    let sb = engine
        .create(
            &owner,
            CreateRequest {
                env_vars: env,
                secure: Some(true),
                ..base()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        driver.started.load(Ordering::SeqCst),
        started_before,
        "create claimed from the pool"
    );
    *driver.start_delay.lock().unwrap() = Duration::ZERO;
    let inits = driver.inits.lock().unwrap().clone();
    let token = sb.envd_access_token.clone().unwrap();
    let mine = inits
        .iter()
        .find(|v| v["accessToken"] == token.as_str())
        .expect("init with the sandbox's token sent");
    assert_eq!(mine["envVars"]["FOO"], "bar");
    assert_eq!(mine["defaultUser"], "user");
    for _ in 0..100 {
        if engine.pool_len("base") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(engine.pool_len("base"), 2, "pool refilled");
    engine.shutdown().await;
}

#[test]
fn recover_readopts_live_and_buries_dead() {
    // The first "server" runs on its own runtime, dropped before the restart like an exiting
    // process: none of its tasks (watchers, reaper) survive into the second one.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (dir, driver, a, b, hb, orphan) = first.block_on(async {
        let (dir, driver, engine, owner, store) = setup(0).await;
        let a = engine.create(&owner, base()).await.unwrap();
        let b = engine.create(&owner, base()).await.unwrap();
        let hb: bulkhead_engine::driver::DriverHandle = serde_json::from_str(
            &store
                .get_sandbox(&b.id)
                .await
                .unwrap()
                .unwrap()
                .driver_handle
                .unwrap(),
        )
        .unwrap();
        // An orphan the store does not know about (e.g. a pool member of the dead server).
        let orphan = driver
            .start(&SandboxSpec {
                disk_mb: 0,
                template_id: "base".into(),
                rootfs: "/x".into(),
                cpu_count: 1,
                memory_mb: 1,
                pids_max: 1,
                volumes: Vec::new(),
            })
            .await
            .unwrap();
        (dir, driver, a, b, hb, orphan)
    });
    drop(first);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            // "Restart": a new engine over the same store and host; b died meanwhile.
            driver.alive.lock().unwrap().remove(&hb.pid);
            let store = Store::open_sqlite_in(dir.path()).await.unwrap();
            let engine2 = Engine::new(
                store.clone(),
                driver.clone(),
                EngineConfig {
                    pools: bulkhead_engine::PoolConfig::fixed(0),
                    ..Default::default()
                },
            );
            engine2.register_template(template()).await.unwrap();
            assert_eq!(engine2.recover().await.unwrap(), 1);
            assert!(engine2.get(&me(), &a.id).await.is_ok());
            assert!(engine2.get(&me(), &b.id).await.is_err());
            assert!(
                !driver.alive.lock().unwrap().contains(&orphan.pid),
                "orphan reclaimed"
            );
            let row = store.get_sandbox(&b.id).await.unwrap().unwrap();
            assert_eq!(row.end_reason.as_deref(), Some("lost on restart"));
        });
}

/// The caller of engine verbs in these tests (the engine checks no ownership yet).
fn me() -> bulkhead_engine::Caller {
    bulkhead_engine::Caller {
        key_id: "test".into(),
        team_id: "default".into(),
    }
}

#[tokio::test]
async fn metrics_are_sampled_into_a_bounded_series_by_range() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        metrics_interval: Duration::from_millis(300),
        ..Default::default()
    };
    let FakeEngine { engine, owner, .. } = fake_engine(dir.path(), cfg, template()).await;
    engine.start_background();
    let sb = engine.create(&owner, base()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let all = engine
        .usage_series(&owner, &sb.id, None, None)
        .await
        .unwrap();
    assert!((5..=9).contains(&all.len()), "{} samples", all.len());
    assert!(all.windows(2).all(|w| w[0].timestamp < w[1].timestamp));
    // Whole seconds, both ends inclusive.
    let first = all[0].timestamp.timestamp();
    let ranged = engine
        .usage_series(&owner, &sb.id, Some(first), Some(first))
        .await
        .unwrap();
    assert!(!ranged.is_empty());
    assert!(ranged.iter().all(|u| u.timestamp.timestamp() == first));
    let before = engine
        .usage_series(&owner, &sb.id, Some(first - 100), Some(first - 1))
        .await
        .unwrap();
    assert!(before.is_empty());
    assert!(matches!(
        engine.usage_series(&owner, &sb.id, Some(first), Some(first - 1)).await,
        Err(EngineError::BadRequest(m)) if m.contains("time range")
    ));
    engine.kill(&owner, &sb.id).await.unwrap();
    assert!(matches!(
        engine.usage_series(&owner, &sb.id, None, None).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}
