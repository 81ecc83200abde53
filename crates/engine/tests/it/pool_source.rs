//! Where warm-pool members come from (against the fake driver, no root): heavy templates are
//! restored from a warm checkpoint made once and reused across server starts, invalidated by a
//! new template or agent, and fall back to cold starts when checkpoints fail.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::driver::DriverError;
use bulkhead_engine::testing::{FakeDriver, FakeEngine, FakeHost, fake_engine};
use bulkhead_engine::{
    CheckpointPools, CreateRequest, Engine, EngineConfig, KERNELS_MANIFEST, PoolSource,
    TemplateInfo,
};
use bulkhead_store::Store;

struct Setup {
    dir: tempfile::TempDir,
    host: FakeHost,
    store: Store,
    driver: Arc<FakeDriver>,
    engine: Arc<Engine>,
    heavy: TemplateInfo,
}

fn cfg(dir: &tempfile::TempDir, pools: CheckpointPools) -> EngineConfig {
    EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        checkpoint_dir: dir.path().join("checkpoints"),
        checkpoint_pools: pools,
        ..Default::default()
    }
}

/// A template whose rootfs has the interpreter's kernel table (a heavy one under `auto`).
fn heavy_template(dir: &tempfile::TempDir) -> TemplateInfo {
    let rootfs = dir.path().join("interp-rootfs");
    let manifest = rootfs.join(KERNELS_MANIFEST);
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(&manifest, "{}").unwrap();
    TemplateInfo {
        id: "code-interpreter-v1".into(),
        aliases: vec![],
        rootfs,
        content_hash: "recipe-1".into(),
        ..bulkhead_engine::testing::base_template()
    }
}

async fn setup_with(pools: CheckpointPools) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let host = FakeHost::default();
    let driver = Arc::new(FakeDriver::on_host(&host));
    let engine = Engine::new(store.clone(), driver.clone(), cfg(&dir, pools));
    let heavy = heavy_template(&dir);
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    engine.register_template(heavy.clone()).await.unwrap();
    Setup {
        dir,
        host,
        store,
        driver,
        engine,
        heavy,
    }
}

async fn setup() -> Setup {
    setup_with(CheckpointPools::Auto).await
}

impl Setup {
    fn gold_dirs(&self) -> Vec<std::path::PathBuf> {
        let root = self
            .dir
            .path()
            .join("checkpoints/pools")
            .join(&self.heavy.id);
        let mut v: Vec<_> = std::fs::read_dir(root)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// A second server run on the same host, data dir and database.
    fn restart(&self) -> (Arc<FakeDriver>, Arc<Engine>) {
        let driver = Arc::new(FakeDriver::on_host(&self.host));
        let engine = Engine::new(
            self.store.clone(),
            driver.clone(),
            cfg(&self.dir, CheckpointPools::Auto),
        );
        (driver, engine)
    }
}

/// Sandboxes the fake driver started (its `started` counts restores too).
fn cold_starts(d: &FakeDriver) -> i32 {
    d.started.load(Ordering::SeqCst) - d.restores.load(Ordering::SeqCst)
}

fn failing() -> DriverError {
    DriverError::io("CRIU is broken on this host", std::io::Error::other("boom"))
}

#[tokio::test]
async fn light_templates_start_cold_and_make_no_checkpoint() {
    let s = setup().await;
    let base = bulkhead_engine::testing::base_template();
    assert!(!s.engine.is_heavy(&base));
    let (h, from) = s.engine.new_pool_member_from(&base).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert!(s.driver.memory(h.pid).is_some());
    assert_eq!(s.driver.checkpoints.load(Ordering::SeqCst), 0);
    assert_eq!(s.driver.restores.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn heavy_templates_are_restored_from_one_warmed_checkpoint_and_reseeded() {
    let s = setup().await;
    assert!(s.engine.is_heavy(&s.heavy));
    let (a, from_a) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    let (b, from_b) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(
        (from_a, from_b),
        (PoolSource::Checkpoint, PoolSource::Checkpoint)
    );
    // One gold sandbox: started, warmed, checkpointed (and gone); two restores of it.
    assert_eq!(cold_starts(&s.driver), 1);
    assert_eq!(s.driver.checkpoints.load(Ordering::SeqCst), 1);
    assert_eq!(s.driver.restores.load(Ordering::SeqCst), 2);
    assert_eq!(s.gold_dirs().len(), 1);
    for h in [&a, &b] {
        let m = s.driver.memory(h.pid).unwrap();
        assert!(
            m.warmed,
            "the checkpoint was taken after the kernels were warm"
        );
        assert_eq!(m.cloned, 1, "each clone is told to re-seed, once");
        assert_eq!(m.inits, 0, "members get their identity only when claimed");
    }
    assert_ne!(a.pid, b.pid);
}

#[tokio::test]
async fn a_claimed_restored_member_gets_its_identity_through_init() {
    let dir = tempfile::tempdir().unwrap();
    let heavy = heavy_template(&dir);
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(1),
        ..cfg(&dir, CheckpointPools::Auto)
    };
    let FakeEngine {
        store,
        driver,
        engine,
        owner,
    } = fake_engine(dir.path(), cfg, heavy.clone()).await;
    engine.start_background();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.pool_len(&heavy.id) < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut env = std::collections::BTreeMap::new();
    env.insert("WHO".to_string(), "clone".to_string());
    let info = engine
        .create(
            &owner,
            CreateRequest {
                template: heavy.id.clone(),
                env_vars: env,
                secure: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let row = store.get_sandbox(&info.id).await.unwrap().unwrap();
    let claimed: bulkhead_engine::driver::DriverHandle =
        serde_json::from_str(row.driver_handle.as_deref().unwrap()).unwrap();
    let m = driver.memory(claimed.pid).unwrap();
    assert!(
        m.warmed && m.cloned == 1,
        "the create claimed a restored member"
    );
    assert_eq!(m.inits, 1);
    assert_eq!(m.env.get("WHO").map(String::as_str), Some("clone"));
    assert!(row.envd_access_token.is_some());
    assert_eq!(m.access_token, row.envd_access_token);
    engine.kill(&owner, &info.id).await.unwrap();
    engine.shutdown().await;
    assert!(driver.alive.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_restart_reuses_the_checkpoint_and_a_new_agent_or_template_replaces_it() {
    let s = setup().await;
    s.engine.new_pool_member(&s.heavy).await.unwrap();
    let first = s.gold_dirs();
    assert_eq!(first.len(), 1);

    // Same template, same agent: the next server restores what is on disk.
    let (driver, engine) = s.restart();
    let (_, from) = engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Checkpoint);
    assert_eq!(driver.checkpoints.load(Ordering::SeqCst), 0);
    assert_eq!(cold_starts(&driver), 0);
    assert_eq!(s.gold_dirs(), first);

    // A new agent build: a new checkpoint, the old one deleted.
    *driver.checkpoint_key.lock().unwrap() = Some("fake-agent-2".into());
    let (_, from) = engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Checkpoint);
    assert_eq!(driver.checkpoints.load(Ordering::SeqCst), 1);
    let second = s.gold_dirs();
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);

    // A rebuilt template (new recipe hash): again.
    let rebuilt = TemplateInfo {
        content_hash: "recipe-2".into(),
        ..s.heavy.clone()
    };
    engine.new_pool_member(&rebuilt).await.unwrap();
    assert_eq!(driver.checkpoints.load(Ordering::SeqCst), 2);
    let third = s.gold_dirs();
    assert_eq!(third.len(), 1);
    assert_ne!(third, second);
}

#[tokio::test]
async fn a_failing_checkpoint_falls_back_to_cold_starts_and_leaves_nothing() {
    let s = setup().await;
    *s.driver.fail_checkpoint.lock().unwrap() = Some(failing);
    let (h, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert!(
        s.driver.memory(h.pid).is_some(),
        "a usable member all the same"
    );
    assert!(s.gold_dirs().is_empty(), "no half-made checkpoint is kept");
    // The gold sandbox was stopped; only the cold member runs.
    assert_eq!(s.driver.started.load(Ordering::SeqCst), 2);
    assert_eq!(s.driver.alive.lock().unwrap().len(), 1);

    // Later refills do not retry at once (one warning, then cold starts).
    *s.driver.fail_checkpoint.lock().unwrap() = None;
    let (_, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert_eq!(s.driver.started.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_failing_restore_falls_back_to_cold_and_drops_the_checkpoint() {
    let s = setup().await;
    s.engine.new_pool_member(&s.heavy).await.unwrap();
    assert_eq!(s.gold_dirs().len(), 1);
    *s.driver.fail_restore.lock().unwrap() = Some(failing);
    let (h, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert!(s.driver.memory(h.pid).is_some());
    assert!(s.gold_dirs().is_empty());
}

#[tokio::test]
async fn an_agent_without_the_warm_route_or_a_driver_without_criu_means_cold_starts() {
    let s = setup().await;
    s.driver.old_agent.store(true, Ordering::SeqCst);
    let (_, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert_eq!(s.driver.checkpoints.load(Ordering::SeqCst), 0);
    assert!(s.gold_dirs().is_empty());

    let s = setup().await;
    *s.driver.checkpoint_key.lock().unwrap() = None;
    let (_, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);
    assert_eq!(
        s.driver.started.load(Ordering::SeqCst),
        1,
        "no gold sandbox"
    );
}

#[tokio::test]
async fn the_operator_chooses_which_templates_are_checkpoint_pooled() {
    let s = setup_with(CheckpointPools::Off).await;
    assert!(!s.engine.is_heavy(&s.heavy));
    let (_, from) = s.engine.new_pool_member_from(&s.heavy).await.unwrap();
    assert_eq!(from, PoolSource::Cold);

    let s = setup_with("base, other".parse().unwrap()).await;
    assert!(
        s.engine
            .is_heavy(&bulkhead_engine::testing::base_template())
    );
    assert!(!s.engine.is_heavy(&s.heavy));
    let (_, from) = s
        .engine
        .new_pool_member_from(&bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    assert_eq!(from, PoolSource::Checkpoint);
    assert!("".parse::<CheckpointPools>().is_err());
    assert_eq!("auto".parse::<CheckpointPools>(), Ok(CheckpointPools::Auto));
}

#[tokio::test]
async fn the_filler_refills_heavy_pools_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let heavy = heavy_template(&dir);
    let cfg = EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(2),
        ..cfg(&dir, CheckpointPools::Auto)
    };
    let FakeEngine { driver, engine, .. } = fake_engine(dir.path(), cfg, heavy.clone()).await;
    engine.start_background();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while engine.pool_len(&heavy.id) < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(engine.pool_len(&heavy.id), 2);
    assert_eq!(driver.checkpoints.load(Ordering::SeqCst), 1);
    assert_eq!(driver.restores.load(Ordering::SeqCst), 2);
    engine.shutdown().await;
    assert!(driver.alive.lock().unwrap().is_empty());
}
