//! [`MicrovmDriver`]: the [`Driver`] trait over QEMU microVMs.

use std::collections::HashMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bulkhead_driver::{
    AgentExit, AgentStream, Capabilities, CheckpointInfo, CheckpointOptions, Driver, DriverError,
    DriverHandle, NetworkLink, ResourceUsage, RestoreOptions, SandboxSpec, StartError,
};
use bulkhead_vmchan::HostSession;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::image::{self, ImageStore};
use crate::jailer::{self, Jail};
use crate::probe::{self, AccelReport};
use crate::qemu::{self, MemoryFile, VmSpec};
use crate::qmp;
use crate::snapshot::Snapshots;
use crate::vm::{self, VmRecord};
use crate::{MicrovmConfig, MicrovmError};

const NAME: &str = "microvm";
/// Under the state dir: the (empty) mount point of QEMU's root.
const JAIL_ROOT: &str = "root";

/// The host side of one running VM this driver instance knows.
pub(crate) struct Vm {
    pub(crate) record: VmRecord,
    /// The agent channel, (re)connected on demand.
    pub(crate) session: tokio::sync::Mutex<Option<Arc<HostSession>>>,
    /// Generation of the NIC's link to the egress stack: each `open_network` takes the next
    /// one, and only the current link may take the carrier down when it ends.
    link: tokio::sync::Mutex<u64>,
}

pub struct MicrovmDriver {
    pub(crate) cfg: MicrovmConfig,
    accel: AccelReport,
    pub(crate) images: ImageStore,
    vms: Mutex<HashMap<u32, Arc<Vm>>>,
    /// What QEMU's jail holds, and the VMs' cgroups.
    qemu_files: jailer::QemuFiles,
    cgroups: jailer::Cgroups,
    pub(crate) snapshots: Snapshots,
    /// Per-snapshot-key state of snapshot taking (one build at a time, failures remembered).
    pub(crate) snap_state: crate::snapshot::SnapState,
}

/// How a VM starts.
pub(crate) enum Launch {
    /// From scratch, with an empty writable disk.
    Cold,
    /// The template VM of a snapshot: its RAM on the file `ram` (shared mapping).
    Template { ram: PathBuf },
    /// A clone of snapshot `key`: RAM mapped privately from the sealed memfd, its own copy of
    /// the snapshot's disk, the device state arriving over QMP.
    Clone {
        key: String,
        ram: Arc<std::os::fd::OwnedFd>,
    },
    /// A restore of a checkpoint in `dir` (pause/resume, fork): its disk, RAM and devices all
    /// from the checkpoint; `backend`: the VM had its RAM under the `mem0` backend (a clone).
    Checkpoint { dir: PathBuf, backend: bool },
}

impl MicrovmDriver {
    pub fn new(cfg: MicrovmConfig) -> Result<MicrovmDriver, MicrovmError> {
        if !cfg.kernel.is_file() {
            return Err(MicrovmError::Config(format!(
                "the guest kernel {} does not exist: build it with scripts/guest-kernel.sh",
                cfg.kernel.display()
            )));
        }
        if !cfg.agent_binary.is_file() {
            return Err(MicrovmError::Config(format!(
                "the agent binary {} does not exist: build bulkhead-agent",
                cfg.agent_binary.display()
            )));
        }
        let slots = cfg.state_dir.join("s");
        fs::create_dir_all(&slots).map_err(|e| MicrovmError::io("create the state dir", e))?;
        for d in [&cfg.state_dir, &slots] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o711))
                .map_err(|e| MicrovmError::io("set the state dir's mode", e))?;
        }
        let accel = match cfg.accel {
            Some(a) => AccelReport {
                accel: a,
                reason: "chosen by configuration".into(),
            },
            None => probe::detect(),
        };
        let images = ImageStore::new(&cfg.cache_dir);
        let jail_err = |e: jailer::JailerError| MicrovmError::Config(e.to_string());
        let qemu_files = jailer::QemuFiles::discover(&cfg.qemu).map_err(jail_err)?;
        let cgroups = jailer::Cgroups::detect(&cfg.state_dir).map_err(jail_err)?;
        // The mount point of every QEMU's root (each mounts its own tmpfs on it, in its own
        // mount namespace); empty on the host.
        fs::create_dir_all(cfg.state_dir.join(JAIL_ROOT))
            .map_err(|e| MicrovmError::io("create the jail root", e))?;
        let snapshots = Snapshots::new(cfg.snapshot_dir.clone());
        Ok(MicrovmDriver {
            cfg,
            accel,
            images,
            vms: Mutex::new(HashMap::new()),
            qemu_files,
            cgroups,
            snapshots,
            snap_state: Default::default(),
        })
    }

    /// The acceleration in use and why (for start-up logs and `doctor`).
    pub fn accel(&self) -> &AccelReport {
        &self.accel
    }

    pub(crate) fn slot_dir(&self, slot: u32) -> PathBuf {
        self.cfg.state_dir.join("s").join(slot.to_string())
    }

    pub(crate) fn vms(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Vm>>> {
        self.vms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims a free slot by creating its directory.
    pub(crate) fn claim_slot(&self) -> Result<(u32, PathBuf), DriverError> {
        for slot in 0..self.cfg.max_slots {
            let dir = self.slot_dir(slot);
            match fs::create_dir(&dir) {
                Ok(()) => return Ok((slot, dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(DriverError::io("create a slot directory", e)),
            }
        }
        Err(StartError::NoFreeSlot {
            max: self.cfg.max_slots,
        }
        .into())
    }

    /// The record of a handle of this driver whose VM is still running.
    pub(crate) fn live_record(&self, h: &DriverHandle) -> Option<VmRecord> {
        if h.driver != NAME || !h.is_readable() {
            return None;
        }
        let rec: VmRecord = serde_json::from_value(h.data.clone()).ok()?;
        let on_disk = VmRecord::load(&rec.dir)?;
        (on_disk == rec
            && rec.pid == h.pid
            && rec.pid_start_time == h.pid_start_time
            && vm::alive(rec.pid, rec.pid_start_time))
        .then_some(rec)
    }

    pub(crate) fn vm_for(&self, rec: VmRecord) -> Arc<Vm> {
        self.vms()
            .entry(rec.slot)
            .and_modify(|v| {
                if v.record != rec {
                    *v = new_vm(rec.clone());
                }
            })
            .or_insert_with(|| new_vm(rec.clone()))
            .clone()
    }

    pub(crate) async fn open_stream(&self, vm: &Vm) -> Result<AgentStream, DriverError> {
        let mut guard = vm.session.lock().await;
        let session = match guard.as_ref().filter(|s| s.is_alive()) {
            Some(s) => s.clone(),
            None => {
                let path = vm.record.dir.join(vm::AGENT_SOCKET);
                let s = tokio::net::UnixStream::connect(&path)
                    .await
                    .map_err(DriverError::Connect)?;
                let (r, w) = s.into_split();
                let id = session_id();
                let s = Arc::new(HostSession::start(r, w, id));
                *guard = Some(s.clone());
                s
            }
        };
        drop(guard);
        match session.open().await {
            Ok(s) => Ok(Box::new(s)),
            Err(e) => Err(DriverError::Connect(std::io::Error::other(e))),
        }
    }

    pub(crate) async fn boot(
        &self,
        spec: &SandboxSpec,
        slot: u32,
        dir: PathBuf,
        launch: &Launch,
    ) -> Result<VmRecord, DriverError> {
        if !spec.rootfs.is_dir() {
            return Err(StartError::RootfsMissing.into());
        }
        let root_disk = self.images.template_image(&spec.rootfs).await?;
        let boot_disk = self
            .images
            .boot_image(&self.cfg.agent_binary, self.cfg.sandbox_ca_pem.as_deref())
            .await?;
        let uid = self.cfg.uid_base + slot;
        let (agent_socket, qmp_socket, console_log, rw_disk) = vm::spec_paths(&dir);
        let setup = |e| DriverError::io("prepare the sandbox's slot directory", e);
        // mkfs.ext4 (a process to wait for) or a copy: not on a runtime worker.
        let (disk, mb) = (rw_disk.clone(), self.cfg.disk_mb);
        let made = match launch {
            Launch::Clone { key, .. } => {
                let snap = self.snapshots.path(key);
                tokio::task::spawn_blocking(move || crate::snapshot::copy_disk(&snap, &disk)).await
            }
            _ => tokio::task::spawn_blocking(move || image::writable_disk(&disk, mb)).await,
        };
        made.map_err(|e| setup(std::io::Error::other(e)))?
            .map_err(setup)?;
        std::os::unix::fs::chown(&rw_disk, Some(uid), Some(uid)).map_err(setup)?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(uid)).map_err(setup)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(setup)?;
        let (memory_file, inherit, snapshot) = match launch {
            Launch::Cold => (None, None, None),
            Launch::Template { ram } => (
                Some(MemoryFile {
                    path: Some(ram.clone()),
                    shared: true,
                }),
                None,
                None,
            ),
            Launch::Clone { key, ram } => {
                let fd = crate::snapshot::raw(ram);
                (
                    Some(MemoryFile {
                        path: Some(format!("/proc/self/fd/{fd}").into()),
                        shared: false,
                    }),
                    Some(fd),
                    Some(key.clone()),
                )
            }
            Launch::Checkpoint { backend, .. } => (
                backend.then_some(MemoryFile {
                    path: None,
                    shared: false,
                }),
                None,
                None,
            ),
        };
        let ram_backend = memory_file.is_some();
        let vm_spec = VmSpec {
            kernel: self.cfg.kernel.clone(),
            boot_disk,
            root_disk,
            rw_disk,
            agent_socket,
            qmp_socket,
            console_log,
            cpus: spec.cpu_count.max(1),
            memory_mb: spec.memory_mb,
            accel: self.accel.accel,
            agent_log: self.cfg.agent_log.clone(),
            clock: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            incoming: matches!(launch, Launch::Clone { .. } | Launch::Checkpoint { .. }),
            memory_file,
            pids_max: spec.pids_max,
        };
        let jail = self.jail(&vm_spec, slot, &dir)?;
        let (mut child, pid) = vm::spawn(&self.qemu_files.binary, &vm_spec, &dir, jail, inherit)
            .map_err(|e| {
                DriverError::io(
                    format!(
                        "start {} (install qemu-system-x86)",
                        self.cfg.qemu.display()
                    ),
                    e,
                )
            })?;
        let pid_start_time = bulkhead_host::sys::proc_start_time(pid)
            .map_err(|e| DriverError::io("read QEMU's start time", e))?;
        // Reap the jailer's intermediate (it exits at once); QEMU's liveness is judged from
        // /proc and pidfds.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let record = VmRecord {
            dir: dir.clone(),
            pid,
            pid_start_time,
            slot,
            memory_mb: spec.memory_mb,
            cpus: spec.cpu_count.max(1),
            disk_mb: self.cfg.disk_mb,
            accel: format!("{:?}", self.accel.accel).to_lowercase(),
            snapshot,
            ram_backend,
        };
        record
            .store()
            .map_err(|e| DriverError::io("write the VM record", e))?;
        Ok(record)
    }

    /// The jail of slot `slot`'s QEMU: a fresh cgroup with the VM's limits, the mount plan.
    fn jail(&self, spec: &VmSpec, slot: u32, dir: &std::path::Path) -> Result<Jail, DriverError> {
        let err = |e: jailer::JailerError| {
            DriverError::io("prepare QEMU's jail", std::io::Error::other(e))
        };
        let root = self.cfg.state_dir.join(JAIL_ROOT);
        let steps = jailer::plan(&root, &self.qemu_files, spec, dir).map_err(err)?;
        let limits = jailer::limits(spec.memory_mb, spec.cpus);
        let cgroup_procs = self.cgroups.create(slot, &limits).map_err(err)?;
        let uid = self.cfg.uid_base + slot;
        Ok(Jail {
            steps,
            cgroup_procs,
            uid,
            gid: uid,
            groups: Vec::new(),
            pid_fd: -1,
        })
    }

    /// Waits until the agent answers `GET /health` through the channel.
    pub(crate) async fn wait_ready(&self, vm: &Vm) -> Result<(), DriverError> {
        let deadline = Instant::now() + self.cfg.start_timeout;
        let rec = &vm.record;
        loop {
            if !vm::alive(rec.pid, rec.pid_start_time) {
                return Err(StartError::AgentExited {
                    exit: AgentExit::Unknown,
                    output: self.output(rec),
                }
                .into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StartError::AgentTimeout {
                    timeout: self.cfg.start_timeout,
                    output: self.output(rec),
                }
                .into());
            }
            let attempt = async {
                let mut s = self.open_stream(vm).await.ok()?;
                s.write_all(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
                    .await
                    .ok()?;
                let mut buf = Vec::new();
                s.read_to_end(&mut buf).await.ok()?;
                buf.starts_with(b"HTTP/1.1 2").then_some(())
            };
            match tokio::time::timeout(left.min(Duration::from_secs(5)), attempt).await {
                Ok(Some(())) => return Ok(()),
                // Short: a restored clone answers within milliseconds of its QEMU loading.
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    pub(crate) fn handle(&self, rec: &VmRecord) -> Result<DriverHandle, DriverError> {
        let data = serde_json::to_value(rec)
            .map_err(|e| DriverError::io("encode the handle", std::io::Error::other(e)))?;
        Ok(DriverHandle::new(
            NAME,
            rec.pid,
            rec.pid_start_time,
            rec.slot,
            data,
        ))
    }

    /// Boots a VM from scratch and waits for its agent.
    pub(crate) async fn start_cold(&self, spec: &SandboxSpec) -> Result<VmRecord, DriverError> {
        self.launch_and_wait(spec, &Launch::Cold).await
    }

    /// Claims a slot, launches, waits for the agent; cleans up on failure.
    pub(crate) async fn launch_and_wait(
        &self,
        spec: &SandboxSpec,
        launch: &Launch,
    ) -> Result<VmRecord, DriverError> {
        let (slot, dir) = self.claim_slot()?;
        let rec = match self.boot(spec, slot, dir.clone(), launch).await {
            Ok(r) => r,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let loaded = match launch {
            Launch::Clone { key, .. } => Some((
                self.load_state(
                    &rec,
                    self.snapshots.path(key).join(crate::snapshot::STATE),
                    true,
                )
                .await,
                format!("snapshot {key}"),
            )),
            Launch::Checkpoint { dir, .. } => Some((
                self.load_state(&rec, dir.join(crate::snapshot::STATE), false)
                    .await,
                format!("checkpoint {}", dir.display()),
            )),
            _ => None,
        };
        if let Some((Err(e), what)) = loaded {
            let e = DriverError::io(format!("restore {what} ({})", self.output(&rec)), e);
            self.teardown(&rec).await;
            return Err(e);
        }
        let vm = self.vm_for(rec.clone());
        // The carrier stays down until the engine connects the NIC (`open_network`); a restored
        // VM comes back with the carrier it was saved with.
        let ready = match self.wait_ready(&vm).await {
            Ok(()) => Self::set_link(&rec, false).await,
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            self.teardown(&rec).await;
            return Err(e);
        }
        Ok(rec)
    }

    /// Pauses (`stop`) or resumes (`cont`) every vCPU; both are idempotent in QEMU.
    async fn qmp(&self, h: &DriverHandle, command: &str) -> Result<(), DriverError> {
        let rec = self.live_record(h).ok_or(DriverError::NotRunning)?;
        qmp::execute(
            &rec.dir.join(vm::QMP_SOCKET),
            &[(command, serde_json::Value::Null)],
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            if vm::alive(rec.pid, rec.pid_start_time) {
                DriverError::io(format!("QEMU's `{command}` failed"), e)
            } else {
                DriverError::NotRunning
            }
        })
    }

    /// The NIC's carrier (QMP `set_link`). Down while the NIC is not connected to the egress
    /// stack, so that the guest, which ignores routes over a link without carrier, fails
    /// connections at once ("network unreachable") instead of waiting for ARP answers.
    pub(crate) async fn set_link(rec: &VmRecord, up: bool) -> Result<(), DriverError> {
        qmp::execute(
            &rec.dir.join(vm::QMP_SOCKET),
            &[(
                "set_link",
                serde_json::json!({ "name": qemu::NIC, "up": up }),
            )],
        )
        .await
        .map(|_| ())
        .map_err(|e| DriverError::io("set the VM's NIC link over QMP", e))
    }

    pub(crate) fn output(&self, rec: &VmRecord) -> String {
        let qemu = vm::tail(&rec.dir.join(vm::QEMU_LOG), 1000);
        let console = vm::tail(&rec.dir.join(vm::CONSOLE_LOG), 2000);
        format!("qemu: {qemu}; console: {console}")
    }

    /// Kills the VM (if it still runs) and removes its slot directory.
    pub(crate) async fn teardown(&self, rec: &VmRecord) {
        vm::kill(rec.pid, rec.pid_start_time).await;
        self.cgroups.remove(rec.slot);
        {
            let mut vms = self.vms();
            if vms.get(&rec.slot).is_some_and(|v| v.record == *rec) {
                vms.remove(&rec.slot);
            }
        }
        let _ = fs::remove_dir_all(&rec.dir);
    }
}

fn new_vm(record: VmRecord) -> Arc<Vm> {
    Arc::new(Vm {
        record,
        session: tokio::sync::Mutex::new(None),
        link: tokio::sync::Mutex::new(0),
    })
}

/// A session id unlikely to repeat across server runs (stream ids derive from it).
fn session_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

#[async_trait]
impl Driver for MicrovmDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            freeze: true,
            network: NetworkLink::VmNic,
            checkpoint: true,
            snapshot: true,
            // QEMU's cgroup keeps its CPU weight; a warm start is a plain start.
            warm_start: false,
            // The sandbox's files are on an ext4 image inside the guest.
            changes: false,
            export_changes: false,
            // Not yet: a VM checkpoint depends on QEMU, the guest kernel and the agent.
            checkpoint_key: false,
        }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        let rec = self.start_vm(spec).await?;
        self.handle(&rec)
    }

    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        let Ok(rec) = serde_json::from_value::<VmRecord>(h.data.clone()) else {
            return Ok(());
        };
        // Only a slot that still records this VM is ours to clean; a reused slot is not.
        if VmRecord::load(&rec.dir).is_some_and(|r| r != rec) {
            return Ok(());
        }
        self.teardown(&rec).await;
        Ok(())
    }

    async fn wait(&self, h: &DriverHandle) {
        let Some(fd) = vm::pidfd(h.pid, h.pid_start_time) else {
            return;
        };
        vm::exited(fd).await;
    }

    async fn adopt(&self, h: &DriverHandle) -> bool {
        match self.live_record(h) {
            Some(rec) => {
                // A server that died during a pause, snapshot or fork leaves the VM stopped,
                // maybe still migrating into a descriptor nobody reads: cancel that and run
                // on (nothing keeps a VM stopped across a restart; both are no-ops otherwise).
                let qmp = rec.dir.join(vm::QMP_SOCKET);
                if let Err(e) = qmp::execute(
                    &qmp,
                    &[
                        ("migrate_cancel", serde_json::Value::Null),
                        ("cont", serde_json::Value::Null),
                    ],
                )
                .await
                {
                    tracing::warn!(slot = h.slot, error = %e, "could not resume an adopted VM");
                }
                self.vm_for(rec);
                true
            }
            None => false,
        }
    }

    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        let rec = self.live_record(h).ok_or(DriverError::NotRunning)?;
        let vm = self.vm_for(rec);
        self.open_stream(&vm).await
    }

    /// Connects QEMU's NIC socket and bridges its Ethernet frames to IP packets
    /// ([`bulkhead_host::link::ethernet_link`]); closing the returned end disconnects the NIC.
    async fn open_network(&self, h: &DriverHandle) -> Result<OwnedFd, DriverError> {
        let rec = self.live_record(h).ok_or(DriverError::NotRunning)?;
        let vm = self.vm_for(rec.clone());
        let mut link = vm.link.lock().await;
        let path = rec.dir.join(qemu::NET_SOCKET);
        let stream = tokio::net::UnixStream::connect(&path).await.map_err(|e| {
            DriverError::io(format!("connect to the VM's NIC at {}", path.display()), e)
        })?;
        let (fd, bridge) = bulkhead_host::link::ethernet_link(stream)
            .map_err(|e| DriverError::io("bridge the VM's NIC to the egress stack", e))?;
        Self::set_link(&rec, true).await?;
        *link += 1;
        let generation = *link;
        drop(link);
        // The engine closing its end (detach) ends the bridge: carrier down again, unless a
        // newer link has been opened meanwhile.
        tokio::spawn(async move {
            let _ = bridge.await;
            let link = vm.link.lock().await;
            if *link == generation && vm::alive(rec.pid, rec.pid_start_time) {
                let _ = Self::set_link(&rec, false).await;
            }
        });
        Ok(fd)
    }

    async fn freeze(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.qmp(h, "stop").await
    }

    async fn thaw(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.qmp(h, "cont").await
    }

    async fn checkpoint(
        &self,
        h: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        self.checkpoint_vm(h, dir, opts).await
    }

    fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        self.checkpoint_dir_info(dir)
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        let rec = self.restore_vm(spec, dir, opts).await?;
        self.handle(&rec)
    }

    async fn usage(&self, h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        let rec = self.live_record(h).ok_or(DriverError::NotRunning)?;
        let (cpu_ns, rss, threads) =
            vm::proc_usage(rec.pid).map_err(|_| DriverError::NotRunning)?;
        let disk = fs::metadata(rec.dir.join(vm::RW_DISK))
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        Ok(ResourceUsage {
            cpu_usage_ns: cpu_ns,
            // The VMM's resident memory: what the host pays for the sandbox.
            mem_used_bytes: rss,
            mem_cache_bytes: 0,
            mem_limit_bytes: rec.memory_mb << 20,
            disk_used_bytes: disk,
            disk_total_bytes: rec.disk_mb << 20,
            // Host tasks of the VM (QEMU's threads); the guest's own processes are not counted.
            pids_current: threads,
        })
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let slots = self.cfg.state_dir.join("s");
        let entries = fs::read_dir(&slots).map_err(|e| DriverError::io("list the slots", e))?;
        let mut reclaimed = 0;
        for e in entries.flatten() {
            let dir = e.path();
            let Some(rec) = VmRecord::load(&dir) else {
                // A start that died before writing its record; nothing runs there.
                if e.metadata().is_ok_and(|m| {
                    m.modified()
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > self.cfg.start_timeout)
                }) {
                    let _ = fs::remove_dir_all(&dir);
                }
                continue;
            };
            let kept = keep.iter().any(|h| {
                h.driver == NAME && h.pid == rec.pid && h.pid_start_time == rec.pid_start_time
            });
            if kept {
                continue;
            }
            if vm::alive(rec.pid, rec.pid_start_time) {
                reclaimed += 1;
            }
            self.teardown(&rec).await;
        }
        Ok(reclaimed)
    }
}
