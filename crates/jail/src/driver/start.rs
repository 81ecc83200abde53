//! Starting a sandbox, as one linear pipeline per slot:
//!
//! 1. a fresh slot directory (leftovers and stale cgroups of the slot removed) and the
//!    sandbox's disk (`disk.rs`) mounted in it;
//! 2. `/etc/resolv.conf` in the overlay upper dir (when a nameserver is configured);
//! 3. the slot's idmapped view of the template (the lower);
//! 4. the sandbox's cgroup with its limits;
//! 5. the launch: the launcher clones the init into the cgroup and exits;
//! 6. registration: pid file first, then pidfd and reaper, so a crash from here on never
//!    hands the slot out while the sandbox lives;
//! 7. waiting for the agent's socket, with the agent's log tail when it dies or is late.
//!
//! A start from a filesystem-only checkpoint ([`Seed`]) takes the checkpoint's disk in step 1.
//!
//! Any failure tears down whatever the steps left (the init, if any, is found in the cgroup).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bulkhead_driver::{AgentExit, DriverError, DriverHandle, SandboxSpec, StartError};

use super::agent_sock::{connect_agent, log_tail};
use super::ca::sandbox_ca_bundle;
use super::disk;
use super::fsutil::{chown, mkdir_mode};
use super::launch::LaunchError;
use super::resolv::write_resolv_conf;
use super::seed::{Seed, prepare_slot_removal};
use super::state::{DRIVER_NAME, HandleData, JailDriver, Sandbox};
use crate::cgroup::CgroupLimits;
use crate::mountplan::{AGENT_PATH, SOCK_DIR, SOCK_NAME};
use crate::slots::{self, SlotState};
use crate::spec::{LaunchReply, LaunchRequest, StartSpec};
use crate::sys::ExitInfo;
use crate::{IDS_PER_SLOT, JailError, sys};

impl JailDriver {
    /// `Driver::start`: reserve a slot, run the pipeline in it, clean up after a failure.
    /// `background`: a warm-pool start, at the lowest CPU weight until claimed.
    pub(super) async fn start_sandbox(
        &self,
        spec: &SandboxSpec,
        seed: Option<&Seed>,
        background: bool,
    ) -> Result<DriverHandle, DriverError> {
        let started = Instant::now();
        let deadline = started + self.inner.cfg.start_timeout;
        if !spec.rootfs.is_dir() {
            return Err(StartError::RootfsMissing.into());
        }
        let slot = self.reserve_slot_preferring(seed.map(|s| s.slot))?;
        let cgroup_name = format!("{slot}-{:08x}", sys::random_u64() as u32);
        match self
            .start_in_slot(slot, &cgroup_name, spec, deadline, seed, background)
            .await
        {
            Ok(h) => {
                tracing::debug!(slot, pid = h.pid, elapsed = ?started.elapsed(), "jail sandbox started");
                Ok(h)
            }
            Err(e) => {
                self.clean_failed_start(slot, &cgroup_name).await;
                Err(e)
            }
        }
    }

    /// After a failed start or restore: tear down what the steps left and free the slot. The
    /// init (if any) is in the cgroup: teardown finds it there even when the launcher (or
    /// CRIU) failed before telling us its pid.
    pub(super) async fn clean_failed_start(&self, slot: u32, cgroup_name: &str) {
        let registered = {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            slots.taken(slot).map(|sb| (sb.pid, sb.start_time))
        };
        let (pid, st) = registered.unwrap_or((0, 0));
        if let Err(te) = self.teardown(slot, pid, st, Some(cgroup_name), true).await {
            tracing::warn!(slot, error = %te, "cleanup after a failed start");
        }
        let mut slots = self.inner.slots.lock().expect("slot table poisoned");
        if matches!(slots.get(slot), Some(SlotState::Reserved)) {
            slots.free(slot);
        }
    }

    /// The pipeline of the module docs, in a reserved slot.
    async fn start_in_slot(
        &self,
        slot: u32,
        cgroup_name: &str,
        spec: &SandboxSpec,
        deadline: Instant,
        seed: Option<&Seed>,
        background: bool,
    ) -> Result<DriverHandle, DriverError> {
        let dir = self.fresh_slot_dir(slot)?;
        self.make_disk(slot, spec.disk_mb, seed).await?;
        if let Some(ns) = self.inner.cfg.nameserver {
            write_resolv_conf(&self.upper_dir(slot), self.slot_uid(slot), ns)?;
        }
        let lower = self.ensure_lower(slot, &spec.rootfs).await?;
        let procs = self
            .inner
            .cgroups
            .create(
                cgroup_name,
                &CgroupLimits::new(spec.memory_mb, spec.pids_max, spec.cpu_count),
            )
            .map_err(|e| DriverError::io(format!("create cgroup {cgroup_name}"), e))?;
        if background {
            self.inner
                .cgroups
                .set_background(cgroup_name, true)
                .map_err(|e| DriverError::io(format!("set the CPU weight of {cgroup_name}"), e))?;
        }
        let start = self.start_spec(slot, &dir, lower.clone(), procs, spec)?;
        let (pid, start_time) = self.launch(start, deadline).await?;
        let sb = self
            .register_started(slot, &dir, pid, start_time, cgroup_name)
            .await?;
        sb.background.store(background, Ordering::SeqCst);
        let handle = DriverHandle::new(
            DRIVER_NAME,
            pid,
            start_time,
            slot,
            serde_json::to_value(HandleData {
                cgroup: cgroup_name.to_string(),
                cgroup_version: self.inner.cgroups.version(),
                lower,
                agent: Some(self.inner.agent.clone()),
                rootfs: Some(spec.rootfs.clone()),
                volumes: spec.volumes.iter().map(|v| v.path.clone()).collect(),
            })
            .expect("handle data serialises"),
        );
        self.wait_for_socket(slot, &sb, deadline).await?;
        Ok(handle)
    }

    /// A warm sandbox is claimed: the normal CPU weight from now on.
    /// Only a member started in the background has a weight to restore: claims of the others
    /// (an empty pool's full-priority start, a restored clone) cost nothing here.
    pub(super) fn set_foreground(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let Some(sb) = self.lookup(handle) else {
            return Ok(());
        };
        if !sb.background.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        self.inner
            .cgroups
            .set_background(&sb.cgroup, false)
            .map_err(|e| DriverError::io(format!("set the CPU weight of {}", sb.cgroup), e))
    }

    pub(super) fn slot_uid(&self, slot: u32) -> u32 {
        slots::slot_uid(self.inner.cfg.uid_base, slot)
    }

    /// Step 1: fresh per-sandbox directories; leftovers of a crashed run in this slot are
    /// removed together with their cgroups.
    pub(super) fn fresh_slot_dir(&self, slot: u32) -> Result<PathBuf, JailError> {
        let dir = self.slot_dir(slot);
        if dir.exists() {
            prepare_slot_removal(&dir);
            fs::remove_dir_all(&dir)
                .map_err(|e| JailError::io(format!("clean {}", dir.display()), e))?;
        }
        self.remove_stale_cgroups(slot);
        let uid = self.slot_uid(slot);
        mkdir_mode(&dir, 0o711)?;
        for (sub, owned) in [("merged", false), ("sock", true)] {
            let p = dir.join(sub);
            mkdir_mode(&p, 0o755)?;
            if owned {
                chown(&p, uid).map_err(|e| JailError::io(format!("chown {}", p.display()), e))?;
            }
        }
        Ok(dir)
    }

    fn remove_stale_cgroups(&self, slot: u32) {
        let prefix = format!("{slot}-");
        let mine: Vec<String> = {
            let mut stale = self
                .inner
                .stale_cgroups
                .lock()
                .expect("stale cgroups poisoned");
            let (mine, others) = stale.drain(..).partition(|n| n.starts_with(&prefix));
            *stale = others;
            mine
        };
        for n in mine {
            if self.inner.cgroups.remove(&n).is_err() {
                // Still busy (EBUSY): keep it for the next start in this slot.
                self.inner
                    .stale_cgroups
                    .lock()
                    .expect("stale cgroups poisoned")
                    .push(n);
            }
        }
    }

    /// What the launcher needs to start the sandbox in `slot`.
    fn start_spec(
        &self,
        slot: u32,
        dir: &Path,
        lower: PathBuf,
        cgroup_procs: Vec<PathBuf>,
        spec: &SandboxSpec,
    ) -> Result<StartSpec, DriverError> {
        let cfg = &self.inner.cfg;
        let mut argv = vec![
            AGENT_PATH.to_string(),
            "--listen".to_string(),
            format!("unix:{SOCK_DIR}/{SOCK_NAME}"),
            // The code-interpreter API for the sandbox's own processes (E2B's localhost:49999).
            "--interpreter-listen".to_string(),
            "127.0.0.1:49999,[::1]:49999".to_string(),
        ];
        argv.extend(cfg.agent_args.iter().cloned());
        Ok(StartSpec {
            uid_base: self.slot_uid(slot),
            id_count: IDS_PER_SLOT,
            lower,
            upper: dir.join(disk::MOUNT).join(disk::UPPER),
            work: dir.join(disk::MOUNT).join(disk::WORK),
            merged: dir.join("merged"),
            sock_dir: dir.join("sock"),
            agent_binary: self.inner.agent.clone(),
            argv,
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/root".into(),
            ],
            hostname: "sandbox".into(),
            cgroup_procs,
            // tmpfs pages are charged to the sandbox's memory cgroup, so bound them by it.
            shm_size_mb: spec.memory_mb.clamp(1, 64),
            volatile_upper: true,
            // Leave a reserve of tasks for the agent (see `StartSpec::nproc_limit`).
            nproc_limit: Some(
                spec.pids_max
                    .saturating_sub((spec.pids_max / 8).clamp(8, 64))
                    .max(1),
            ),
            ca_bundle: sandbox_ca_bundle(cfg, &spec.rootfs)?,
            volumes: spec
                .volumes
                .iter()
                .map(|v| crate::spec::VolumeBind {
                    source: v.host_dir.clone(),
                    target: v.path.clone(),
                })
                .collect(),
        })
    }

    /// Step 5: the launcher starts the init and reports its pid and start time.
    async fn launch(&self, start: StartSpec, deadline: Instant) -> Result<(i32, u64), DriverError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let reply = self
            .inner
            .launcher
            .run(&LaunchRequest::Start(start), remaining)
            .await;
        let failure = match reply {
            Ok(LaunchReply::Started { pid, start_time }) => return Ok((pid, start_time)),
            Ok(LaunchReply::Failed { error }) => LaunchError::Failed(error),
            Ok(other) => LaunchError::Unexpected(other),
            Err(e) => e,
        };
        Err(StartError::setup(failure).into())
    }

    /// Step 6: record the owner first (if we crash from here on, the next run will not hand
    /// this slot out while the sandbox lives), then take it over.
    pub(super) async fn register_started(
        &self,
        slot: u32,
        dir: &Path,
        pid: i32,
        start_time: u64,
        cgroup_name: &str,
    ) -> Result<Arc<Sandbox>, DriverError> {
        let registered = fs::write(
            dir.join("pid"),
            format!("{pid} {start_time} {cgroup_name}\n"),
        )
        .map_err(|e| DriverError::io("record the sandbox pid", e))
        .and_then(|()| sys::pidfd_open(pid).map_err(|e| DriverError::io("pidfd_open", e)))
        .and_then(|fd| self.register(slot, pid, start_time, cgroup_name.to_string(), fd, false));
        if registered.is_err() {
            // No reaper watches it yet, and it is our child now: kill and reap it here.
            let _ = tokio::task::spawn_blocking(move || {
                // SAFETY: signalling and reaping our own (re-parented) child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            })
            .await;
        }
        registered
    }

    /// Step 7: until the agent accepts connections, it dies, or the deadline passes.
    pub(super) async fn wait_for_socket(
        &self,
        slot: u32,
        sb: &Sandbox,
        deadline: Instant,
    ) -> Result<(), DriverError> {
        let sock = self.sock_path(slot);
        let log = self.slot_dir(slot).join("sock/agent.log");
        let mut exit = sb.exit.clone();
        let mut delay = Duration::from_millis(1);
        loop {
            if let Some(info) = *exit.borrow() {
                return Err(StartError::AgentExited {
                    exit: agent_exit(info),
                    output: log_tail(&log),
                }
                .into());
            }
            if connect_agent(&sock).await.is_ok() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StartError::AgentTimeout {
                    timeout: self.inner.cfg.start_timeout,
                    output: log_tail(&log),
                }
                .into());
            }
            let nap = delay.min(deadline - now);
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = exit.changed() => {}
            }
            delay = (delay * 2).min(Duration::from_millis(20));
        }
    }
}

fn agent_exit(info: ExitInfo) -> AgentExit {
    match info {
        ExitInfo::Exited(c) => AgentExit::Exited(c),
        ExitInfo::Signaled(s) => AgentExit::Signaled(s),
        ExitInfo::Unknown => AgentExit::Unknown,
    }
}
