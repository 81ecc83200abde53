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

#[tokio::test]
async fn pause_and_connect_keep_memory_files_env_token_and_id() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/home/user/f.txt", "data");

    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert_eq!(s.state(&sb.id).await, SandboxState::Paused);
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    assert_eq!(info.state, "paused");
    assert_eq!(info.pause_memory, Some(true));
    assert!(
        !s.driver.alive.lock().unwrap().contains(&pid),
        "a paused sandbox has no process"
    );
    assert_eq!(
        files_under(&s.checkpoints()),
        2,
        "the image and its completion marker"
    );

    // Listed as paused; filters.
    let paused = s
        .engine
        .list(
            &s.owner,
            &ListRequest {
                states: vec![SandboxState::Paused.into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(paused.items.len(), 1);
    let running = s
        .engine
        .list(
            &s.owner,
            &ListRequest {
                states: vec![SandboxState::Running.into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(running.items.is_empty());

    let (c, resumed) = s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(c.id, sb.id);
    assert_eq!(c.envd_access_token, sb.envd_access_token);
    assert_eq!(c.state, "running");
    let new = s.pid(&sb.id).await;
    assert_ne!(new, pid);
    let mem = s.driver.memory(new).unwrap();
    assert_eq!(mem.vars["x"], "42");
    assert_eq!(mem.env["GREETING"], "hello");
    assert_eq!(mem.access_token, sb.envd_access_token);
    assert_eq!(
        s.driver.file(new, "/home/user/f.txt").as_deref(),
        Some("data")
    );
    // The restored agent was not given its identity again (its env would be reset).
    let last_init = s.driver.inits.lock().unwrap().last().cloned().unwrap();
    assert!(last_init.get("envVars").is_none(), "{last_init}");
    // The checkpoint is deleted in the background once the resume is recorded.
    assert_eq!(
        files_under_when_settled(&s.checkpoints()).await,
        0,
        "the checkpoint is deleted after a resume"
    );
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());

    // A second pause gets a fresh directory.
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let dirs = walk(&s.checkpoints());
    assert!(
        dirs.iter().all(|p| p.to_string_lossy().contains("/2/")),
        "{dirs:?}"
    );
}

#[tokio::test]
async fn refusals_as_e2b() {
    let s = setup().await;
    let sb = s.base().await;
    assert_eq!(
        refusal(
            s.engine
                .resume(&s.owner, &sb.id, resume())
                .await
                .unwrap_err()
        ),
        Refusal::AlreadyRunning
    );
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert_eq!(
        refusal(s.engine.pause(&s.owner, &sb.id, true).await.unwrap_err()),
        Refusal::AlreadyPaused
    );
    assert_eq!(
        refusal(
            s.engine
                .set_timeout(&s.owner, &sb.id, 60)
                .await
                .unwrap_err()
        ),
        Refusal::Paused
    );
    assert_eq!(
        refusal(s.engine.usage(&s.owner, &sb.id).await.unwrap_err()),
        Refusal::Paused
    );
    // Without auto-resume, traffic is told it is paused.
    assert_eq!(
        refusal(s.engine.agent_stream(&sb.id).await.err().unwrap()),
        Refusal::Paused
    );
    // The older resume resumes it.
    let info = s.engine.resume(&s.owner, &sb.id, resume()).await.unwrap();
    assert_eq!(info.state, "running");
    assert!(matches!(
        s.engine.pause(&s.owner, "nosuchsandbox", true).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn filesystem_only_pause_keeps_files_not_processes() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/f", "kept");
    s.engine.pause(&s.owner, &sb.id, false).await.unwrap();
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().pause_memory,
        Some(false)
    );
    s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    let new = s.pid(&sb.id).await;
    let mem = s.driver.memory(new).unwrap();
    assert!(mem.vars.is_empty(), "a fresh boot has no memory");
    assert_eq!(s.driver.file(new, "/f").as_deref(), Some("kept"));
    // It was given its identity again: env and token.
    assert_eq!(mem.env["GREETING"], "hello");
    assert_eq!(mem.access_token, sb.envd_access_token);
}

#[tokio::test]
async fn connect_without_memory_boots_a_full_checkpoint_afresh() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let req = ResumeRequest {
        timeout: Some(30),
        memory: false,
    };
    s.engine.connect(&s.owner, &sb.id, req).await.unwrap();
    let mem = s.driver.memory(s.pid(&sb.id).await).unwrap();
    assert!(mem.vars.is_empty());
    assert_eq!(mem.env["GREETING"], "hello");
}

#[tokio::test]
async fn a_failed_pause_leaves_the_sandbox_running_with_its_link() {
    let s = setup().await;
    let egress = Arc::new(RecordingEgress::default());
    s.engine.set_egress(egress.clone(), None);
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    *s.driver.fail_checkpoint.lock().unwrap() = Some(boom);
    let e = s.engine.pause(&s.owner, &sb.id, true).await.unwrap_err();
    assert!(matches!(e, EngineError::CheckpointFailed { .. }), "{e:?}");
    assert!(e.to_string().contains("keeps running"), "{e}");
    assert_eq!(s.state(&sb.id).await, SandboxState::Running);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "running"
    );
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(s.driver.memory(pid).unwrap().vars["x"], "42");
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
    assert!(
        egress.attached.lock().unwrap().contains_key(&sb.id),
        "link given back"
    );
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    // It is still watched: a death ends it.
    s.driver.crash(pid);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(s.engine.get(&s.owner, &sb.id).await.is_err());
}

#[tokio::test]
async fn pause_detaches_the_link_and_resume_gives_it_back() {
    let s = setup().await;
    let egress = Arc::new(RecordingEgress::default());
    s.engine.set_egress(egress.clone(), None);
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(!egress.attached.lock().unwrap().contains_key(&sb.id));
    s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    let attached = egress.attached.lock().unwrap().get(&sb.id).cloned();
    assert!(attached.expect("re-attached").allow_internet);
}

#[tokio::test]
async fn a_failed_restore_leaves_it_paused_and_resumable() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    *s.driver.fail_restore.lock().unwrap() = Some(boom);
    let e = s
        .engine
        .connect(&s.owner, &sb.id, resume())
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::RestoreFailed { .. }), "{e:?}");
    assert_eq!(s.state(&sb.id).await, SandboxState::Paused);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "paused"
    );
    *s.driver.fail_restore.lock().unwrap() = None;
    assert!(
        s.engine
            .connect(&s.owner, &sb.id, resume())
            .await
            .unwrap()
            .1
    );
}

#[tokio::test]
async fn concurrent_resumes_coalesce_into_one_restore() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    *s.driver.restore_delay.lock().unwrap() = Duration::from_millis(200);
    // Traffic arriving once the resume is in flight (a resume first checks the caller's team,
    // so it is not in flight the moment it is called).
    let traffic = async {
        while s.driver.restores_started.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s.engine.agent_stream(&sb.id).await
    };
    let (a, b, c) = tokio::join!(
        s.engine.connect(&s.owner, &sb.id, resume()),
        s.engine.connect(&s.owner, &sb.id, resume()),
        traffic,
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.1 ^ b.1, "exactly one of them resumed it");
    // Traffic without auto-resume waits for the resume in flight, then reaches the agent.
    assert!(c.is_ok(), "{:?}", c.as_ref().err());
    assert_eq!(s.driver.restores.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn on_timeout_pause_pauses_at_the_ttl_and_connect_resumes() {
    let s = setup().await;
    s.engine.start_background();
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            timeout: Some(1),
            lifecycle: LifecyclePolicy {
                on_timeout: OnTimeout::Pause,
                ..Default::default()
            },
            ..Default::default()
        })
        .await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "1");
    let mut paused = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        if s.state(&sb.id).await == SandboxState::Paused {
            paused = true;
            break;
        }
    }
    assert!(paused, "paused at the end of its TTL");
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    assert_eq!(info.lifecycle.on_timeout, OnTimeout::Pause);
    let (_, resumed) = s.engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(s.driver.memory(s.pid(&sb.id).await).unwrap().vars["x"], "1");
    s.engine.shutdown().await;
}

#[tokio::test]
async fn auto_resume_on_traffic() {
    let s = setup().await;
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            timeout: Some(120),
            lifecycle: LifecyclePolicy {
                on_timeout: OnTimeout::Pause,
                auto_resume: true,
                pause_memory: true,
            },
            ..Default::default()
        })
        .await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
    assert_eq!(s.state(&sb.id).await, SandboxState::Running);
    let info = s.engine.get(&s.owner, &sb.id).await.unwrap();
    // The TTL restarts from the resume with the sandbox's own timeout.
    let ttl = (info.end_at - chrono::Utc::now()).num_seconds();
    assert!((100..=120).contains(&ttl), "{ttl}");

    // A filesystem-only pause is never resumed by traffic.
    s.engine.pause(&s.owner, &sb.id, false).await.unwrap();
    assert_eq!(
        refusal(s.engine.agent_stream(&sb.id).await.err().unwrap()),
        Refusal::Paused
    );
}

#[tokio::test]
async fn paused_retention_deletes_checkpoint_and_record() {
    let s = setup_with(|c| c.paused_retention = Duration::from_millis(50)).await;
    s.engine.start_background();
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        s.engine.get(&s.owner, &sb.id).await,
        Err(EngineError::SandboxNotFound(_))
    ));
    assert_eq!(s.state(&sb.id).await, SandboxState::Dead);
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    s.engine.shutdown().await;
}

#[tokio::test]
async fn killing_a_paused_sandbox_deletes_its_checkpoint() {
    let s = setup().await;
    let sb = s.base().await;
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    assert!(files_under(&s.checkpoints()) > 0);
    s.engine.kill(&s.owner, &sb.id).await.unwrap();
    assert_eq!(files_under_when_settled(&s.checkpoints()).await, 0);
    assert!(matches!(
        s.engine.connect(&s.owner, &sb.id, resume()).await,
        Err(EngineError::SandboxNotFound(_))
    ));
}

#[tokio::test]
async fn a_paused_sandbox_survives_a_restart() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    s.engine.shutdown().await;

    let (driver, engine) = s.restart().await;
    assert_eq!(engine.get(&s.owner, &sb.id).await.unwrap().state, "paused");
    let (info, resumed) = engine.connect(&s.owner, &sb.id, resume()).await.unwrap();
    assert!(resumed);
    assert_eq!(info.envd_access_token, sb.envd_access_token);
    assert_eq!(driver.memory(s.pid(&sb.id).await).unwrap().vars["x"], "42");
}

#[tokio::test]
async fn recovery_after_a_death_mid_pause_or_mid_resume() {
    let s = setup().await;
    // (1) `pausing`, checkpoint complete, process gone: paused.
    let a = s.base().await;
    s.engine.pause(&s.owner, &a.id, true).await.unwrap();
    s.store
        .set_sandbox_state(&a.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (2) `pausing`, no completion marker, process still alive: running, leftover deleted.
    let b = s.base().await;
    let b_pid = s.pid(&b.id).await;
    let mut p = s.store.get_persistence(&b.id).await.unwrap().unwrap();
    let partial = s.checkpoints().join("sandboxes").join(&b.id).join("1");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("pages"), b"half").unwrap();
    p.checkpoint_dir = Some(partial.display().to_string());
    s.store.upsert_persistence(&p).await.unwrap();
    s.store
        .set_sandbox_state(&b.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (3) `pausing`, no marker, process gone: nothing to resume from, so it has ended.
    let c = s.base().await;
    let c_pid = s.pid(&c.id).await;
    let mut p = s.store.get_persistence(&c.id).await.unwrap().unwrap();
    p.checkpoint_dir = Some(partial.with_file_name("9").display().to_string());
    s.store.upsert_persistence(&p).await.unwrap();
    s.store
        .set_sandbox_state(&c.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    // (4) `resuming` with the checkpoint still complete and no new process: paused.
    let d = s.base().await;
    s.engine.pause(&s.owner, &d.id, true).await.unwrap();
    s.store
        .set_sandbox_state(&d.id, SandboxState::Resuming, None)
        .await
        .unwrap();
    // (5) `pausing`, the driver finished (its own record is there) but the server died before
    // writing the engine's marker: paused, and the marker is written now.
    let e = s.base().await;
    s.engine.pause(&s.owner, &e.id, true).await.unwrap();
    let e_dir = std::path::PathBuf::from(
        s.store
            .get_persistence(&e.id)
            .await
            .unwrap()
            .unwrap()
            .checkpoint_dir
            .unwrap(),
    );
    let marker = std::fs::read_dir(&e_dir)
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .find(|p| p.file_name().unwrap() != bulkhead_driver::fake::CHECKPOINT_FILE)
        .expect("the engine's marker");
    std::fs::remove_file(&marker).unwrap();
    s.store
        .set_sandbox_state(&e.id, SandboxState::Pausing, None)
        .await
        .unwrap();
    s.engine.shutdown().await;
    s.driver.crash(c_pid);

    let (_driver, engine) = s.restart().await;
    assert_eq!(s.state(&e.id).await, SandboxState::Paused);
    assert!(marker.exists(), "recovery completed the marker");
    assert!(engine.connect(&s.owner, &e.id, resume()).await.unwrap().1);
    assert_eq!(s.state(&a.id).await, SandboxState::Paused);
    assert_eq!(engine.get(&s.owner, &a.id).await.unwrap().state, "paused");
    assert_eq!(s.state(&b.id).await, SandboxState::Running);
    assert_eq!(s.pid(&b.id).await, b_pid);
    // The interrupted checkpoint is gone: adopting gave the sandbox back whatever the pause
    // had moved into it.
    assert!(!partial.exists());
    assert!(engine.agent_stream(&b.id).await.is_ok());
    assert_eq!(s.state(&c.id).await, SandboxState::Dead);
    assert_eq!(s.state(&d.id).await, SandboxState::Paused);
    engine.kill(&s.owner, &b.id).await.unwrap();
    assert!(engine.connect(&s.owner, &d.id, resume()).await.unwrap().1);
    assert!(engine.connect(&s.owner, &a.id, resume()).await.unwrap().1);
    // Only running sandboxes count as running (a, d and e resumed; b was killed above).
    let page = engine
        .list(&s.owner, &ListRequest::default())
        .await
        .unwrap();
    assert_eq!(page.total_running, 3);
}

#[tokio::test]
async fn snapshots_create_list_restore_delete() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    s.driver.write_file(pid, "/f", "v1");
    let snap = s
        .engine
        .create_snapshot(&s.owner, &sb.id, Some("my-snap"), true)
        .await
        .unwrap();
    assert_eq!(snap.snapshot_id, "my-snap:default");
    assert_eq!(snap.names, vec!["my-snap:default".to_string()]);
    // The parent ran on, untouched.
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "running"
    );
    let anon = s
        .engine
        .create_snapshot(&s.owner, &sb.id, None, false)
        .await
        .unwrap();
    assert!(anon.names.is_empty());
    assert!(anon.snapshot_id.ends_with(":default"));

    let all = s
        .engine
        .list_snapshots(&s.owner, None, None, None, None)
        .await
        .unwrap();
    assert_eq!(all.items.len(), 2);
    let by_sb = s
        .engine
        .list_snapshots(&s.owner, Some(&sb.id), None, None, None)
        .await
        .unwrap();
    assert_eq!(by_sb.items.len(), 2);
    let none = s
        .engine
        .list_snapshots(&s.owner, Some("othersandbox"), None, None, None)
        .await
        .unwrap();
    assert!(none.items.is_empty());
    let by_name = s
        .engine
        .list_snapshots(&s.owner, None, Some("my-snap"), None, None)
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    let p1 = s
        .engine
        .list_snapshots(&s.owner, None, None, Some(1), None)
        .await
        .unwrap();
    assert_eq!(p1.items.len(), 1);
    let p2 = s
        .engine
        .list_snapshots(&s.owner, None, None, Some(1), p1.next_token.as_deref())
        .await
        .unwrap();
    assert_eq!(p2.items.len(), 1);
    assert_ne!(p1.items[0].snapshot_id, p2.items[0].snapshot_id);
    assert!(p2.next_token.is_none());

    // Two independent sandboxes from the snapshot, each with its memory and files.
    let from = |t: &str| CreateRequest {
        template: t.into(),
        ..Default::default()
    };
    let c1 = s.create(from("my-snap")).await;
    let c2 = s.create(from("my-snap:default")).await;
    assert_ne!(c1.envd_access_token, sb.envd_access_token);
    let (p1, p2) = (s.pid(&c1.id).await, s.pid(&c2.id).await);
    assert_eq!(s.driver.memory(p1).unwrap().vars["x"], "42");
    assert_eq!(
        s.driver.memory(p1).unwrap().access_token,
        c1.envd_access_token
    );
    s.driver.write_file(p1, "/f", "changed");
    assert_eq!(s.driver.file(p2, "/f").as_deref(), Some("v1"));
    // The filesystem-only one boots fresh on the files.
    let c3 = s.create(from(&anon.snapshot_id)).await;
    let p3 = s.pid(&c3.id).await;
    assert!(s.driver.memory(p3).unwrap().vars.is_empty());
    assert_eq!(s.driver.memory(p3).unwrap().env["GREETING"], "hello");

    s.engine
        .delete_snapshot(&s.owner, "my-snap:default")
        .await
        .unwrap();
    assert!(matches!(
        s.engine.delete_snapshot(&s.owner, "my-snap").await,
        Err(EngineError::SnapshotNotFound(_))
    ));
    assert!(matches!(
        s.engine.create(&s.owner, from("my-snap")).await,
        Err(EngineError::TemplateNotFound(_))
    ));
    // A snapshot of a paused sandbox copies its checkpoint; it stays paused.
    s.engine.pause(&s.owner, &sb.id, true).await.unwrap();
    let ps = s
        .engine
        .create_snapshot(&s.owner, &sb.id, Some("from-paused"), true)
        .await
        .unwrap();
    assert_eq!(
        s.engine.get(&s.owner, &sb.id).await.unwrap().state,
        "paused"
    );
    let c4 = s.create(from(&ps.snapshot_id)).await;
    assert_eq!(
        s.driver.memory(s.pid(&c4.id).await).unwrap().vars["x"],
        "42"
    );
    assert!(
        s.engine
            .connect(&s.owner, &sb.id, resume())
            .await
            .unwrap()
            .1
    );
}

#[tokio::test]
async fn fork_makes_independent_copies_and_leaves_the_parent() {
    let s = setup().await;
    let sb = s.base().await;
    let pid = s.pid(&sb.id).await;
    s.driver.set_var(pid, "x", "42");
    let forks = s.engine.fork(&s.owner, &sb.id, 2, Some(60)).await.unwrap();
    assert_eq!(forks.len(), 2);
    let forks: Vec<SandboxInfo> = forks.into_iter().map(Result::unwrap).collect();
    assert_ne!(forks[0].id, forks[1].id);
    assert_ne!(forks[0].id, sb.id);
    assert_ne!(forks[0].envd_access_token, forks[1].envd_access_token);
    assert_ne!(forks[0].envd_access_token, sb.envd_access_token);
    for f in &forks {
        let m = s.driver.memory(s.pid(&f.id).await).unwrap();
        assert_eq!(m.vars["x"], "42");
        assert_eq!(m.env["GREETING"], "hello");
        assert_eq!(m.access_token, f.envd_access_token);
    }
    assert_eq!(s.pid(&sb.id).await, pid);
    assert_eq!(
        s.driver.memory(pid).unwrap().access_token,
        sb.envd_access_token
    );
    assert_eq!(
        files_under_when_settled(&s.checkpoints()).await,
        0,
        "the fork's snapshot is deleted"
    );
    assert!(matches!(
        s.engine.fork(&s.owner, &sb.id, 21, None).await,
        Err(EngineError::BadRequest(_))
    ));
    // A fork that cannot start is reported on its own.
    *s.driver.fail_restore.lock().unwrap() = Some(boom);
    let failed = s.engine.fork(&s.owner, &sb.id, 1, None).await.unwrap();
    assert!(failed[0].is_err());
}

#[tokio::test]
async fn a_checkpoint_cuts_proxied_streams_and_a_snapshot_gives_the_link_back() {
    use tokio::io::AsyncReadExt;
    let s = setup().await;
    let egress = Arc::new(RecordingEgress::default());
    s.engine.set_egress(egress.clone(), None);
    let sb = s
        .create(CreateRequest {
            template: "base".into(),
            allow_internet_access: Some(true),
            ..Default::default()
        })
        .await;
    let mut open = s.engine.agent_stream(&sb.id).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1];
        open.read(&mut buf).await
    });
    s.engine
        .create_snapshot(&s.owner, &sb.id, None, true)
        .await
        .unwrap();
    let cut = tokio::time::timeout(Duration::from_secs(2), reader)
        .await
        .expect("the open stream ended")
        .unwrap();
    assert!(cut.is_err());
    let calls = egress.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            format!("attach {}", sb.id),
            format!("detach {}", sb.id),
            format!("attach {}", sb.id)
        ]
    );
    // New streams work after the snapshot.
    assert!(s.engine.agent_stream(&sb.id).await.is_ok());
}

#[tokio::test]
async fn paused_sandboxes_do_not_count_against_capacity() {
    let s = setup_with(|c| c.max_sandboxes = 1).await;
    let a = s.base().await;
    s.engine.pause(&s.owner, &a.id, true).await.unwrap();
    let b = s.base().await;
    // Resuming `a` now would exceed the limit: refused, and it stays paused.
    assert!(matches!(
        s.engine.connect(&s.owner, &a.id, resume()).await,
        Err(EngineError::Capacity)
    ));
    assert_eq!(s.engine.get(&s.owner, &a.id).await.unwrap().state, "paused");
    s.engine.kill(&s.owner, &b.id).await.unwrap();
    assert!(s.engine.connect(&s.owner, &a.id, resume()).await.unwrap().1);
}
