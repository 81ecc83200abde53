//! The versioned host↔agent protocol, engine side: the engine learns each agent's protocol at
//! claim (`/init`'s answer) and on adoption after a restart (the agent info route); an agent
//! older than the oldest supported one is kept (listed, killable) but every other operation on
//! it gets a clear error naming both versions. A test driver wraps the fake driver with an agent
//! that announces whatever version the test sets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bulkhead_engine::driver::{
    AgentStream, Driver, DriverError, DriverHandle, ResourceUsage, SandboxSpec,
};
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{CreateRequest, Engine, EngineConfig, EngineError, ListRequest, Operation};
use bulkhead_envd::protocol::{
    AGENT_INFO_PATH, AGENT_PROTOCOL_VERSION, AgentInfo, MIN_AGENT_PROTOCOL_VERSION,
};
use bulkhead_store::Store;

/// The fake driver, with an agent that announces `announce` (None: answers like an agent that
/// predates versioning — `/init` → 204, no info route).
#[derive(Default)]
struct VersionedDriver {
    inner: FakeDriver,
    announce: Mutex<Option<AgentInfo>>,
}

impl VersionedDriver {
    fn announce(&self, info: Option<AgentInfo>) {
        *self.announce.lock().unwrap() = info;
    }
}

#[async_trait]
impl Driver for VersionedDriver {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.inner.start(spec).await
    }
    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.inner.stop(h).await
    }
    async fn wait(&self, h: &DriverHandle) {
        self.inner.wait(h).await
    }
    async fn adopt(&self, h: &DriverHandle) -> bool {
        self.inner.adopt(h).await
    }
    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        if !self.inner.adopt(h).await {
            return Err(DriverError::NotRunning);
        }
        let info = self.announce.lock().unwrap().clone();
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let info = info.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let (status, body) = match (path.as_str(), &info) {
                            ("/init", None) => (204, String::new()),
                            ("/init", Some(i)) => (200, serde_json::to_string(i).unwrap()),
                            (p, Some(i)) if p == AGENT_INFO_PATH => {
                                (200, serde_json::to_string(i).unwrap())
                            }
                            _ => (404, String::new()),
                        };
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                                .unwrap(),
                        )
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server), svc)
                .await;
        });
        Ok(Box::new(client))
    }
    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.inner.usage(h).await
    }
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        self.inner.reclaim_orphans(keep).await
    }
}

fn info(protocol_version: u32) -> AgentInfo {
    AgentInfo {
        protocol_version,
        agent_build: format!("test-{protocol_version}"),
    }
}

async fn engine(dir: &tempfile::TempDir, driver: Arc<VersionedDriver>) -> Arc<Engine> {
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    let engine = Engine::new(
        store,
        driver,
        EngineConfig {
            pools: bulkhead_engine::PoolConfig::fixed(0),
            reap_interval: Duration::from_millis(20),
            ..Default::default()
        },
    );
    engine
        .register_template(bulkhead_engine::testing::base_template())
        .await
        .unwrap();
    engine
}

async fn owner(dir: &tempfile::TempDir) -> bulkhead_engine::Caller {
    let store = Store::open_sqlite_in(dir.path()).await.unwrap();
    bulkhead_engine::testing::owner(&store).await
}

fn base() -> CreateRequest {
    CreateRequest {
        template: "base".into(),
        ..Default::default()
    }
}

/// Every agent this server supports, old or new, is served at claim.
#[tokio::test]
async fn supported_agents_of_every_version_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(VersionedDriver::default());
    let engine = engine(&dir, driver.clone()).await;
    let owner = owner(&dir).await;
    let mut announced = vec![None];
    announced.extend((MIN_AGENT_PROTOCOL_VERSION..=AGENT_PROTOCOL_VERSION).map(|v| Some(info(v))));
    for a in announced {
        driver.announce(a.clone());
        let sb = engine.create(&owner, base()).await.unwrap();
        engine.usage(&me(), &sb.id).await.unwrap();
        engine.set_timeout(&me(), &sb.id, 60).await.unwrap();
        engine.kill(&me(), &sb.id).await.unwrap();
    }
}

/// A template whose agent is too old is refused at create, and nothing is left running.
#[tokio::test]
async fn create_refuses_an_unsupported_agent() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(VersionedDriver::default());
    let engine = engine(&dir, driver.clone()).await;
    let owner = owner(&dir).await;
    driver.announce(Some(info(MIN_AGENT_PROTOCOL_VERSION - 1)));
    let err = engine.create(&owner, base()).await.unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::AgentTooOld {
                op: Operation::Create,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(driver.inner.alive.lock().unwrap().is_empty());
}

/// After a restart: a sandbox whose agent announces an older supported version is adopted and
/// served; one whose agent is unsupported is adopted, listed and killable, and everything else
/// gets the clear error; neither is lost.
#[test]
fn restart_adopts_old_agents_and_keeps_unsupported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(VersionedDriver::default());
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (old, too_old) = first.block_on(async {
        let engine = engine(&dir, driver.clone()).await;
        let owner = owner(&dir).await;
        driver.announce(Some(info(AGENT_PROTOCOL_VERSION)));
        let old = engine.create(&owner, base()).await.unwrap();
        let too_old = engine.create(&owner, base()).await.unwrap();
        (old, too_old)
    });
    drop(first);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            // The first sandbox's agent is legacy (no info route), the second one's too old.
            let store = Store::open_sqlite_in(dir.path()).await.unwrap();
            let h = |id: &str| {
                let store = store.clone();
                let id = id.to_string();
                async move {
                    let row = store.get_sandbox(&id).await.unwrap().unwrap();
                    serde_json::from_str::<DriverHandle>(&row.driver_handle.unwrap()).unwrap()
                }
            };
            let too_old_pid = h(&too_old.id).await.pid;
            let driver2 = Arc::new(PerPid {
                inner: driver.clone(),
                too_old_pid,
            });
            let engine2 = {
                let e = Engine::new(
                    store.clone(),
                    driver2,
                    EngineConfig {
                        pools: bulkhead_engine::PoolConfig::fixed(0),
                        ..Default::default()
                    },
                );
                e.register_template(bulkhead_engine::testing::base_template())
                    .await
                    .unwrap();
                e
            };
            assert_eq!(engine2.recover().await.unwrap(), 2, "both adopted");

            // Legacy agent: served as before.
            engine2.usage(&me(), &old.id).await.unwrap();
            engine2
                .connect(
                    &me(),
                    &old.id,
                    bulkhead_engine::ResumeRequest {
                        timeout: Some(60),
                        memory: true,
                    },
                )
                .await
                .unwrap();

            // Unsupported agent: listed and described, everything else refused clearly.
            let listed = engine2.list(&me(), &ListRequest::default()).await.unwrap();
            assert!(listed.items.iter().any(|s| s.id == too_old.id));
            assert!(engine2.get(&me(), &too_old.id).await.is_ok());
            for err in [
                engine2.usage(&me(), &too_old.id).await.unwrap_err(),
                engine2
                    .connect(
                        &me(),
                        &too_old.id,
                        bulkhead_engine::ResumeRequest::default(),
                    )
                    .await
                    .unwrap_err(),
                engine2
                    .set_timeout(&me(), &too_old.id, 60)
                    .await
                    .unwrap_err(),
                engine2.agent_stream(&too_old.id).await.err().unwrap(),
            ] {
                let EngineError::AgentTooOld {
                    agent_protocol,
                    min_protocol,
                    ..
                } = &err
                else {
                    panic!("expected AgentTooOld, got {err:?}");
                };
                assert_eq!(*agent_protocol, MIN_AGENT_PROTOCOL_VERSION - 1);
                assert_eq!(*min_protocol, MIN_AGENT_PROTOCOL_VERSION);
                let msg = err.to_string();
                assert!(
                    msg.contains(&format!(
                        "agent protocol {}",
                        MIN_AGENT_PROTOCOL_VERSION - 1
                    )) && msg.contains(&format!("at least {MIN_AGENT_PROTOCOL_VERSION}"))
                        && msg.contains("kill it and create a new sandbox"),
                    "{msg}"
                );
            }
            // Never killed on its own: still alive on the host and in the store.
            assert!(driver.inner.alive.lock().unwrap().contains(&too_old_pid));
            engine2.kill(&me(), &too_old.id).await.unwrap();
            assert!(!driver.inner.alive.lock().unwrap().contains(&too_old_pid));
        });
}

/// After the restart the sandboxes run different agents: the one at `too_old_pid` announces a
/// protocol below the minimum, the others predate versioning.
struct PerPid {
    inner: Arc<VersionedDriver>,
    too_old_pid: i32,
}

#[async_trait]
impl Driver for PerPid {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.inner.start(spec).await
    }
    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.inner.stop(h).await
    }
    async fn wait(&self, h: &DriverHandle) {
        self.inner.wait(h).await
    }
    async fn adopt(&self, h: &DriverHandle) -> bool {
        self.inner.adopt(h).await
    }
    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        // The announcement is read when the stream opens, so set it per call.
        let a = (h.pid == self.too_old_pid).then(|| info(MIN_AGENT_PROTOCOL_VERSION - 1));
        self.inner.announce(a);
        self.inner.connect(h).await
    }
    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.inner.usage(h).await
    }
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        self.inner.reclaim_orphans(keep).await
    }
}

/// The caller of engine verbs in these tests (the engine checks no ownership yet).
fn me() -> bulkhead_engine::Caller {
    bulkhead_engine::Caller {
        key_id: "test".into(),
        team_id: "default".into(),
    }
}
