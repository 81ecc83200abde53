//! [`FakeDriver`] (feature `testing`): "sandboxes" are in-memory HTTP agents answering
//! `/health` and `/init`, so code built on the [`Driver`] trait is tested without root.
//!
//! The sandboxes live on a [`FakeHost`] that several driver instances can share, which is how
//! a test restarts the server: a fresh `FakeDriver` on the same host adopts what the old one
//! started. It freezes and thaws (a frozen agent accepts connections and answers once thawed)
//! and offers a stand-in network link. It checkpoints for real within its model: the state a
//! fake agent holds in memory (the env and access token `/init` gave it, variables a test set)
//! and its "filesystem" (files a test wrote) go as JSON into the checkpoint directory, and
//! restore starts a new fake sandbox from that file (without the memory part when the
//! checkpoint is filesystem-only, as a cold boot would). It lists those files as the sandbox's
//! changes and exports them, and runs warm starts "in the background" until claimed, so that it
//! claims every capability and runs every conformance case.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::capability::{
    Capabilities, ChangeKind, ChangeSource, CheckpointInfo, CheckpointOptions, FileChange,
    NetworkLink, RestoreOptions,
};
use crate::driver::{AgentStream, Driver, ResourceUsage};
use crate::error::DriverError;
use crate::handle::{DriverHandle, SandboxSpec};

/// The name of a [`FakeDriver::on_host`] driver.
const NAME: &str = "fake";
/// The file a fake checkpoint is written to, inside the checkpoint directory.
pub const CHECKPOINT_FILE: &str = "fake-checkpoint.json";
/// Layout of [`CHECKPOINT_FILE`].
const CHECKPOINT_FORMAT: u32 = 1;

/// What a fake agent holds in memory: lost by a filesystem-only checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FakeMemory {
    /// Environment merged from every `/init`.
    pub env: BTreeMap<String, String>,
    /// The access token the last `/init` set.
    pub access_token: Option<String>,
    /// How many `/init` requests this agent (this process) received.
    pub inits: u32,
    /// Anything a test keeps "in a process" (a REPL variable, a background job).
    pub vars: BTreeMap<String, String>,
    /// Whether the host asked this agent to warm its kernels (`/bulkhead/warm`).
    #[serde(default)]
    pub warmed: bool,
    /// How many times this process was told it is a clone (`/bulkhead/cloned`).
    #[serde(default)]
    pub cloned: u32,
}

/// A fake checkpoint as written to [`CHECKPOINT_FILE`].
#[derive(serde::Serialize, serde::Deserialize)]
struct FakeImage {
    /// The name of the driver that wrote it.
    #[serde(default = "fake_name")]
    driver: String,
    format: u32,
    template_id: String,
    /// None: filesystem only.
    memory: Option<FakeMemory>,
    files: BTreeMap<String, String>,
}

fn fake_name() -> String {
    NAME.into()
}

/// The machine the fake sandboxes run on; clones share it.
#[derive(Clone, Default)]
pub struct FakeHost(Arc<HostState>);

#[derive(Default)]
struct HostState {
    next_pid: AtomicI32,
    next_start_time: AtomicU64,
    /// Pids of the sandboxes whose "process" exists.
    alive: Arc<Mutex<HashSet<i32>>>,
    sandboxes: Mutex<HashMap<i32, FakeSandbox>>,
}

struct FakeSandbox {
    start_time: u64,
    spec: SandboxSpec,
    /// true once it has died.
    dead: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    memory: Arc<Mutex<FakeMemory>>,
    /// Its filesystem changes: path → content.
    files: BTreeMap<String, String>,
    /// Started warm and not claimed yet.
    background: bool,
}

type FailSwitch = Mutex<Option<fn() -> DriverError>>;

pub struct FakeDriver {
    name: &'static str,
    host: FakeHost,
    /// Pids of live sandboxes on the host (shared by every driver on it). Removing one makes
    /// its process vanish silently (no `wait` wake-up), like a death the server missed.
    pub alive: Arc<Mutex<HashSet<i32>>>,
    /// Bodies of the `/init` requests the agents received, in order.
    pub inits: Arc<Mutex<Vec<serde_json::Value>>>,
    pub started: AtomicI32,
    pub stopped: AtomicI32,
    /// `open_network` calls (pids), and the peer ends of the fake links handed out.
    pub networks: Mutex<Vec<(i32, UnixDatagram)>>,
    /// While set, `start` fails with the error this makes (to provoke server errors in tests).
    pub fail_start: Mutex<Option<fn() -> DriverError>>,
    /// While set, `usage` fails with the error this makes.
    pub fail_usage: FailSwitch,
    /// While set, `checkpoint` fails with the error this makes, before touching anything (the
    /// sandbox keeps running, as a failed CRIU dump leaves it).
    pub fail_checkpoint: FailSwitch,
    /// While set, `restore` fails with the error this makes (the checkpoint stays as it was).
    pub fail_restore: FailSwitch,
    /// `checkpoint` and `restore` calls made through this driver.
    pub checkpoints: AtomicI32,
    pub restores: AtomicI32,
    /// Restores begun (counted before the delay), so tests can act while one is in flight.
    pub restores_started: AtomicI32,
    /// How long `restore` takes (to let tests overlap concurrent resumes).
    pub restore_delay: Mutex<std::time::Duration>,
    /// How long `checkpoint` takes (to let tests act while a pause is in flight).
    pub checkpoint_delay: Mutex<std::time::Duration>,
    /// How long `start` takes (to let tests overlap concurrent creates).
    pub start_delay: Mutex<std::time::Duration>,
    /// What [`Driver::checkpoint_key`] answers (a test changes it to stand for a new agent).
    pub checkpoint_key: Mutex<Option<String>>,
    /// While set, the fake agent answers `/bulkhead/warm` with 404 (an agent that predates it).
    pub old_agent: std::sync::atomic::AtomicBool,
}

impl Default for FakeDriver {
    fn default() -> Self {
        FakeDriver::on_host(&FakeHost::default())
    }
}

impl FakeDriver {
    /// A driver instance over `host` (a fresh one per simulated server run).
    pub fn on_host(host: &FakeHost) -> FakeDriver {
        FakeDriver::named(host, NAME)
    }

    /// A driver instance called `name` (the name in its handles and checkpoints), to stand for
    /// one of several drivers of a server (see [`crate::ByTemplate`]).
    pub fn named(host: &FakeHost, name: &'static str) -> FakeDriver {
        FakeDriver {
            name,
            host: host.clone(),
            alive: host.0.alive.clone(),
            inits: Arc::default(),
            started: AtomicI32::new(0),
            stopped: AtomicI32::new(0),
            networks: Mutex::default(),
            fail_start: Mutex::default(),
            fail_usage: Mutex::default(),
            fail_checkpoint: Mutex::default(),
            fail_restore: Mutex::default(),
            checkpoints: AtomicI32::new(0),
            restores: AtomicI32::new(0),
            restores_started: AtomicI32::new(0),
            restore_delay: Mutex::default(),
            checkpoint_delay: Mutex::default(),
            start_delay: Mutex::default(),
            checkpoint_key: Mutex::new(Some("fake-agent-1".into())),
            old_agent: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// What the fake agent of `pid` holds in memory.
    pub fn memory(&self, pid: i32) -> Option<FakeMemory> {
        let sbs = self.host.0.sandboxes.lock().unwrap();
        sbs.get(&pid).map(|sb| sb.memory.lock().unwrap().clone())
    }

    /// Keep `key = value` in the memory of the fake agent of `pid` (like a REPL variable).
    pub fn set_var(&self, pid: i32, key: &str, value: &str) {
        if let Some(sb) = self.host.0.sandboxes.lock().unwrap().get(&pid) {
            sb.memory
                .lock()
                .unwrap()
                .vars
                .insert(key.into(), value.into());
        }
    }

    /// Write a file into the fake sandbox's filesystem.
    pub fn write_file(&self, pid: i32, path: &str, content: &str) {
        if let Some(sb) = self.host.0.sandboxes.lock().unwrap().get_mut(&pid) {
            sb.files.insert(path.into(), content.into());
        }
    }

    /// Does the fake sandbox of `pid` run in the background (started warm, not claimed)?
    pub fn in_background(&self, pid: i32) -> bool {
        let sbs = self.host.0.sandboxes.lock().unwrap();
        sbs.get(&pid).is_some_and(|sb| sb.background)
    }

    /// A file of the fake sandbox's filesystem.
    pub fn file(&self, pid: i32, path: &str) -> Option<String> {
        let sbs = self.host.0.sandboxes.lock().unwrap();
        sbs.get(&pid).and_then(|sb| sb.files.get(path).cloned())
    }

    /// Start a fake sandbox process holding `memory` and `files`.
    fn spawn(
        &self,
        spec: &SandboxSpec,
        memory: FakeMemory,
        files: BTreeMap<String, String>,
        background: bool,
    ) -> DriverHandle {
        let host = &self.host.0;
        let pid = host.next_pid.fetch_add(1, Ordering::SeqCst) + 100;
        let start_time = host.next_start_time.fetch_add(1, Ordering::SeqCst) + 1000;
        host.sandboxes.lock().unwrap().insert(
            pid,
            FakeSandbox {
                start_time,
                spec: spec.clone(),
                dead: watch::Sender::new(false),
                frozen: watch::Sender::new(false),
                memory: Arc::new(Mutex::new(memory)),
                files,
                background,
            },
        );
        self.alive.lock().unwrap().insert(pid);
        self.started.fetch_add(1, Ordering::SeqCst);
        DriverHandle::new(
            self.name,
            pid,
            start_time,
            pid as u32,
            serde_json::Value::Null,
        )
    }

    /// The host this driver runs its sandboxes on.
    pub fn host(&self) -> FakeHost {
        self.host.clone()
    }

    /// Simulate the sandbox dying on its own.
    pub fn crash(&self, pid: i32) {
        self.alive.lock().unwrap().remove(&pid);
        if let Some(sb) = self.host.0.sandboxes.lock().unwrap().get(&pid) {
            sb.frozen.send_replace(false);
            sb.dead.send_replace(true);
        }
    }

    /// Is `h` a live sandbox of this host (pid alive and started at the handle's time)?
    fn live(&self, h: &DriverHandle) -> bool {
        self.alive.lock().unwrap().contains(&h.pid)
            && self
                .host
                .0
                .sandboxes
                .lock()
                .unwrap()
                .get(&h.pid)
                .is_some_and(|sb| sb.start_time == h.pid_start_time)
    }

    fn frozen_rx(&self, pid: i32) -> Option<watch::Receiver<bool>> {
        let sbs = self.host.0.sandboxes.lock().unwrap();
        sbs.get(&pid).map(|sb| sb.frozen.subscribe())
    }

    /// The image in a checkpoint directory, if this driver wrote it.
    fn image(&self, dir: &Path) -> Result<(FakeImage, u64), DriverError> {
        let bytes = std::fs::read(dir.join(CHECKPOINT_FILE))
            .map_err(|e| DriverError::io("Cannot read the checkpoint", e))?;
        let image: FakeImage = serde_json::from_slice(&bytes)
            .ok()
            .filter(|i: &FakeImage| i.driver == self.name)
            .ok_or_else(|| {
                DriverError::io(
                    format!(
                        "{} is not a checkpoint of the {} driver",
                        dir.display(),
                        self.name
                    ),
                    std::io::Error::from(std::io::ErrorKind::InvalidData),
                )
            })?;
        Ok((image, bytes.len() as u64))
    }

    /// The files of a live sandbox.
    fn files_of(&self, h: &DriverHandle) -> Result<BTreeMap<String, String>, DriverError> {
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        let sbs = self.host.0.sandboxes.lock().unwrap();
        let sb = sbs.get(&h.pid).ok_or(DriverError::NotRunning)?;
        Ok(sb.files.clone())
    }

    async fn start_sandbox(
        &self,
        spec: &SandboxSpec,
        background: bool,
    ) -> Result<DriverHandle, DriverError> {
        let delay = *self.start_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(fail) = *self.fail_start.lock().unwrap() {
            return Err(fail());
        }
        Ok(self.spawn(spec, FakeMemory::default(), BTreeMap::new(), background))
    }

    fn set_frozen(&self, h: &DriverHandle, frozen: bool) -> Result<(), DriverError> {
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        if let Some(sb) = self.host.0.sandboxes.lock().unwrap().get(&h.pid) {
            sb.frozen.send_replace(frozen);
        }
        Ok(())
    }
}

#[async_trait]
impl Driver for FakeDriver {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            freeze: true,
            checkpoint: true,
            snapshot: true,
            // A datagram pair stands in for the TUN device.
            network: NetworkLink::TunInNetns,
            warm_start: true,
            changes: true,
            export_changes: true,
            checkpoint_key: self.checkpoint_key.lock().unwrap().is_some(),
        }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.start_sandbox(spec, false).await
    }

    async fn start_warm(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.start_sandbox(spec, true).await
    }

    async fn claimed(&self, h: &DriverHandle) -> Result<(), DriverError> {
        if self.live(h)
            && let Some(sb) = self.host.0.sandboxes.lock().unwrap().get_mut(&h.pid)
        {
            sb.background = false;
        }
        Ok(())
    }

    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        // Like a pidfd check: a handle whose start time is wrong names some other process.
        let ours = self
            .host
            .0
            .sandboxes
            .lock()
            .unwrap()
            .get(&h.pid)
            .is_some_and(|sb| sb.start_time == h.pid_start_time);
        if ours {
            self.crash(h.pid);
        }
        Ok(())
    }

    async fn wait(&self, h: &DriverHandle) {
        let dead = {
            let sbs = self.host.0.sandboxes.lock().unwrap();
            match sbs.get(&h.pid) {
                Some(sb) if sb.start_time == h.pid_start_time => sb.dead.subscribe(),
                _ => return,
            }
        };
        if !self.alive.lock().unwrap().contains(&h.pid) {
            return;
        }
        let mut dead = dead;
        let _ = dead.wait_for(|d| *d).await;
    }

    async fn adopt(&self, h: &DriverHandle) -> bool {
        h.driver == self.name && h.is_readable() && self.live(h)
    }

    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        let frozen = self.frozen_rx(h.pid).ok_or(DriverError::NotRunning)?;
        let memory = {
            let sbs = self.host.0.sandboxes.lock().unwrap();
            sbs.get(&h.pid)
                .map(|sb| sb.memory.clone())
                .ok_or(DriverError::NotRunning)?
        };
        let (client, server) = tokio::io::duplex(64 * 1024);
        let sink = Arc::clone(&self.inits);
        let old_agent = self.old_agent.load(Ordering::SeqCst);
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    let memory = memory.clone();
                    let mut frozen = frozen.clone();
                    async move {
                        use http_body_util::BodyExt;
                        // A frozen agent does not run: the request waits in its socket.
                        let _ = frozen.wait_for(|f| !*f).await;
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        if path == "/init" {
                            let init = serde_json::from_slice::<serde_json::Value>(&body).unwrap();
                            let mut m = memory.lock().unwrap();
                            m.inits += 1;
                            if let Some(env) = init["envVars"].as_object() {
                                for (k, v) in env {
                                    m.env.insert(k.clone(), v.as_str().unwrap_or("").into());
                                }
                            }
                            if let Some(t) = init["accessToken"].as_str() {
                                m.access_token = (!t.is_empty()).then(|| t.to_string());
                            }
                            sink.lock().unwrap().push(init);
                        }
                        let pool_route = path == "/bulkhead/warm" || path == "/bulkhead/cloned";
                        if pool_route && !old_agent {
                            let mut m = memory.lock().unwrap();
                            if path == "/bulkhead/warm" {
                                m.warmed = true;
                            } else {
                                m.cloned += 1;
                            }
                        }
                        let status =
                            if path == "/init" || path == "/health" || (pool_route && !old_agent) {
                                204
                            } else {
                                404
                            };
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
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

    async fn open_network(&self, h: &DriverHandle) -> Result<OwnedFd, DriverError> {
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        // A datagram pair stands in for the TUN device: packet-shaped, and the test keeps the
        // peer to see whether the engine still holds (or has closed) its end.
        let (ours, peer) =
            UnixDatagram::pair().map_err(|e| DriverError::io("Cannot create a socket pair", e))?;
        self.networks.lock().unwrap().push((h.pid, peer));
        Ok(ours.into())
    }

    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        if let Some(fail) = *self.fail_usage.lock().unwrap() {
            return Err(fail());
        }
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        let limit = self
            .host
            .0
            .sandboxes
            .lock()
            .unwrap()
            .get(&h.pid)
            .map_or(0, |sb| sb.spec.memory_mb << 20);
        Ok(ResourceUsage {
            cpu_usage_ns: 5_000_000,
            mem_used_bytes: 1 << 20,
            mem_limit_bytes: limit,
            pids_current: 1,
            ..Default::default()
        })
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let keep: HashSet<(i32, u64)> = keep.iter().map(|h| (h.pid, h.pid_start_time)).collect();
        let orphans: Vec<i32> = {
            let alive = self.alive.lock().unwrap();
            let sbs = self.host.0.sandboxes.lock().unwrap();
            alive
                .iter()
                .copied()
                .filter(|p| {
                    let st = sbs.get(p).map_or(0, |sb| sb.start_time);
                    !keep.contains(&(*p, st))
                })
                .collect()
        };
        for p in &orphans {
            self.crash(*p);
        }
        Ok(orphans.len())
    }

    async fn freeze(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.set_frozen(h, true)
    }

    async fn thaw(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.set_frozen(h, false)
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.checkpoint_key.lock().unwrap().clone()
    }

    fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        let (image, size_bytes) = self.image(dir).ok()?;
        Some(CheckpointInfo {
            driver: self.name.into(),
            format: image.format,
            dir: dir.to_path_buf(),
            size_bytes,
            memory: image.memory.is_some(),
        })
    }

    async fn checkpoint(
        &self,
        h: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        if let Some(fail) = *self.fail_checkpoint.lock().unwrap() {
            return Err(fail());
        }
        let delay = *self.checkpoint_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if !self.live(h) {
            return Err(DriverError::NotRunning);
        }
        let image = {
            let sbs = self.host.0.sandboxes.lock().unwrap();
            let sb = sbs.get(&h.pid).ok_or(DriverError::NotRunning)?;
            FakeImage {
                driver: self.name.into(),
                format: CHECKPOINT_FORMAT,
                template_id: sb.spec.template_id.clone(),
                memory: (!opts.filesystem_only).then(|| sb.memory.lock().unwrap().clone()),
                files: sb.files.clone(),
            }
        };
        let json = serde_json::to_vec_pretty(&image).expect("a fake image serializes");
        std::fs::create_dir_all(dir)
            .map_err(|e| DriverError::io("Cannot create the checkpoint directory", e))?;
        std::fs::write(dir.join(CHECKPOINT_FILE), &json)
            .map_err(|e| DriverError::io("Cannot write the checkpoint", e))?;
        self.checkpoints.fetch_add(1, Ordering::SeqCst);
        if !opts.leave_running {
            self.crash(h.pid);
        }
        Ok(CheckpointInfo {
            driver: self.name.into(),
            format: CHECKPOINT_FORMAT,
            dir: dir.to_path_buf(),
            size_bytes: json.len() as u64,
            memory: !opts.filesystem_only,
        })
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        self.restores_started.fetch_add(1, Ordering::SeqCst);
        let delay = *self.restore_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(fail) = *self.fail_restore.lock().unwrap() {
            return Err(fail());
        }
        let (image, _) = self.image(dir)?;
        if image.format != CHECKPOINT_FORMAT || image.template_id != spec.template_id {
            return Err(crate::StartError::Config(format!(
                "checkpoint of template '{}' (format {}) cannot be restored as '{}'",
                image.template_id, image.format, spec.template_id
            ))
            .into());
        }
        self.restores.fetch_add(1, Ordering::SeqCst);
        // The restored process has the memory it was checkpointed with, except the count of
        // `/init`s it received since (none yet); a filesystem-only image boots fresh.
        let memory = image
            .memory
            .filter(|_| !opts.filesystem_only)
            .map(|m| FakeMemory {
                inits: 0,
                cloned: 0,
                ..m
            })
            .unwrap_or_default();
        Ok(self.spawn(spec, memory, image.files, false))
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        let now = match of {
            ChangeSource::Running(h) => self.files_of(h)?,
            ChangeSource::Checkpoint(dir) => self.image(dir)?.0.files,
        };
        let base = match since {
            Some(dir) => self.image(dir)?.0.files,
            None => BTreeMap::new(),
        };
        let file = |path: &str, kind, content: Option<&String>| FileChange {
            path: path.into(),
            kind,
            file_type: "file".into(),
            size: content.map_or(0, |c| c.len() as u64),
            mtime: content.map(|_| 0),
        };
        let mut list: Vec<FileChange> = now
            .iter()
            .filter_map(|(path, content)| match base.get(path) {
                None => Some(file(path, ChangeKind::Created, Some(content))),
                Some(before) if before != content => {
                    Some(file(path, ChangeKind::Modified, Some(content)))
                }
                Some(_) => None,
            })
            .collect();
        list.extend(
            base.keys()
                .filter(|p| !now.contains_key(*p))
                .map(|p| file(p, ChangeKind::Deleted, None)),
        );
        list.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(list)
    }

    async fn export_changes(&self, h: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        let files = self.files_of(h)?;
        if dest.exists() {
            return Err(DriverError::io(
                format!("export target {} already exists", dest.display()),
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ));
        }
        let io = |e| DriverError::io("Cannot write the exported changes", e);
        std::fs::create_dir_all(dest).map_err(io)?;
        for (path, content) in &files {
            let target = dest.join(path.trim_start_matches('/'));
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&target, content).map_err(io)?;
        }
        // Taken like a filesystem-only pause: the sandbox has ended.
        self.crash(h.pid);
        Ok(())
    }
}
