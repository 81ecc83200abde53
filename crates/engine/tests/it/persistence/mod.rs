//! Pause, resume, lifecycle, snapshots and fork against the fake driver (no root): every verb,
//! every refusal, recovery after a restart mid-operation, auto-pause, auto-resume, retention.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::driver::{DriverError, DriverHandle};
use bulkhead_engine::testing::{FakeDriver, FakeHost, RecordingEgress};
use bulkhead_engine::{
    Caller, CreateRequest, Engine, EngineConfig, EngineError, LifecyclePolicy, ListRequest,
    OnTimeout, Refusal, ResumeRequest, SandboxInfo,
};
use bulkhead_store::{SandboxState, Store};

struct Setup {
    dir: tempfile::TempDir,
    host: FakeHost,
    driver: Arc<FakeDriver>,
    engine: Arc<Engine>,
    store: Store,
    owner: Caller,
}

fn cfg(checkpoints: PathBuf) -> EngineConfig {
    EngineConfig {
        pools: bulkhead_engine::PoolConfig::fixed(0),
        reap_interval: Duration::from_millis(20),
        checkpoint_dir: checkpoints,
        ..Default::default()
    }
}

async fn setup() -> Setup {
    setup_with(|_| {}).await
}

async fn setup_with(tweak: impl FnOnce(&mut EngineConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let host = FakeHost::default();
    let driver = Arc::new(FakeDriver::on_host(&host));
    let mut c = cfg(dir.path().join("checkpoints"));
    tweak(&mut c);
    let engine = Engine::new(store.clone(), driver.clone(), c);
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    let owner = bulkhead_engine::testing::owner(&store).await;
    Setup {
        dir,
        host,
        driver,
        engine,
        store,
        owner,
    }
}

impl Setup {
    async fn create(&self, req: CreateRequest) -> SandboxInfo {
        self.engine.create(&self.owner, req).await.unwrap()
    }

    async fn base(&self) -> SandboxInfo {
        let mut env = BTreeMap::new();
        env.insert("GREETING".to_string(), "hello".to_string());
        self.create(CreateRequest {
            template: "base".into(),
            env_vars: env,
            ..Default::default()
        })
        .await
    }

    /// The fake pid of a running sandbox.
    async fn pid(&self, id: &str) -> i32 {
        let row = self.store.get_sandbox(id).await.unwrap().unwrap();
        let h: DriverHandle = serde_json::from_str(row.driver_handle.as_deref().unwrap()).unwrap();
        h.pid
    }

    async fn state(&self, id: &str) -> SandboxState {
        self.store.get_sandbox(id).await.unwrap().unwrap().state
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("checkpoints")
    }

    /// A second server run on the same host and database.
    async fn restart(&self) -> (Arc<FakeDriver>, Arc<Engine>) {
        let driver = Arc::new(FakeDriver::on_host(&self.host));
        let engine = Engine::new(self.store.clone(), driver.clone(), cfg(self.checkpoints()));
        engine
            .register_template(bulkhead_engine::testing::base_template())
            .await
            .unwrap();
        engine.recover().await.unwrap();
        (driver, engine)
    }
}

fn resume() -> ResumeRequest {
    ResumeRequest::default()
}

fn refusal(e: EngineError) -> Refusal {
    match e {
        EngineError::Refused { reason, .. } => reason,
        e => panic!("expected a refusal, got {e:?}"),
    }
}

fn files_under(dir: &std::path::Path) -> usize {
    walk(dir).len()
}

/// [`files_under`] once background deletions (`remove_later`) have had their chance: polls for
/// up to 10 s until the count is 0 (a loaded CI host may run the deleting task late).
async fn files_under_when_settled(dir: &std::path::Path) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = files_under(dir);
        if n == 0 || std::time::Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

fn boom() -> DriverError {
    DriverError::io(
        "CRIU failed",
        std::io::Error::other("criu: dump failed (no space left on device)"),
    )
}

mod pause;
mod snapshots;
