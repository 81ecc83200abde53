//! The [`Driver`] implementation of [`JailDriver`]: the trait's methods over the start
//! pipeline, the reaper, the teardown and the slot table.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bulkhead_driver::{
    AgentStream, Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, Driver,
    DriverError, DriverHandle, FileChange, NetworkLink, ResourceUsage, RestoreOptions, SandboxSpec,
};

use super::agent_sock::connect_agent;
use super::pidfd::verified_pidfd;
use super::seed::reclaim_moved_disk;
use super::state::{CGROUP_DRAIN_BUDGET, DRIVER_NAME, HandleData, JailDriver};
use crate::sys;
use crate::{cgroup, freezer};

#[async_trait]
impl Driver for JailDriver {
    fn name(&self) -> &'static str {
        DRIVER_NAME
    }

    fn capabilities(&self) -> Capabilities {
        // Checkpoints freeze the cgroup first, so they need the freezer as well as CRIU; an
        // export is a filesystem-only checkpoint, which needs the freezer alone.
        let freeze = self.can_freeze();
        let checkpoint = freeze && self.inner.cfg.criu.is_some();
        Capabilities {
            freeze,
            checkpoint,
            snapshot: checkpoint,
            network: NetworkLink::TunInNetns,
            // Warm starts run at the smallest CPU weight of the sandbox's cgroup until claimed.
            warm_start: true,
            changes: true,
            export_changes: freeze,
            // `criu --version` (once): the key names the CRIU build.
            checkpoint_key: checkpoint && self.checkpoint_key().is_some(),
        }
    }

    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.start_sandbox(spec, None, false).await
    }

    async fn start_warm(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.start_sandbox(spec, None, true).await
    }

    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.set_foreground(handle)
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&std::path::Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        self.list_changes(of, since).await
    }

    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        self.export_sandbox_changes(handle, dest).await
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let data: Option<HandleData> = serde_json::from_value(handle.data.clone()).ok();
        let cgroup = match (&data, self.lookup(handle)) {
            (_, Some(sb)) => Some(sb.cgroup.clone()),
            (Some(d), None) => Some(d.cgroup.clone()),
            (None, None) => None,
        };
        self.teardown(
            handle.slot,
            handle.pid,
            handle.pid_start_time,
            cgroup.as_deref(),
            false,
        )
        .await
    }

    async fn wait(&self, handle: &DriverHandle) {
        self.wait_exit(handle).await
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        if handle.driver != DRIVER_NAME
            || !handle.is_readable()
            || handle.slot >= self.inner.cfg.max_slots
        {
            return false;
        }
        let Ok(data) = serde_json::from_value::<HandleData>(handle.data.clone()) else {
            return false;
        };
        if data.cgroup_version != self.inner.cgroups.version() {
            return false;
        }
        if let Some(sb) = self.lookup(handle) {
            return sb.exited().is_none();
        }
        if !fs::symlink_metadata(self.sock_path(handle.slot))
            .is_ok_and(|m| m.file_type().is_socket())
        {
            return false;
        }
        let Some(fd) = verified_pidfd(handle.pid, handle.pid_start_time) else {
            return false;
        };
        // A server that died during a pause may have moved the disk into the checkpoint:
        // back to the sandbox if that checkpoint is incomplete; if it is complete, the pause
        // is done but for the teardown, and the sandbox is paused, not running.
        if !reclaim_moved_disk(&self.slot_dir(handle.slot)) {
            let _ = self
                .teardown(
                    handle.slot,
                    handle.pid,
                    handle.pid_start_time,
                    Some(&data.cgroup),
                    false,
                )
                .await;
            return false;
        }
        // A server that died during a checkpoint leaves the sandbox frozen; nobody else ever
        // keeps one frozen across a restart.
        freezer::thaw_now(self.inner.cgroups.freezer(&data.cgroup));
        self.register(
            handle.slot,
            handle.pid,
            handle.pid_start_time,
            data.cgroup,
            fd,
            true,
        )
        .is_ok()
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let kept: BTreeSet<(u32, i32, u64)> = keep
            .iter()
            .filter(|h| h.driver == DRIVER_NAME)
            .map(|h| (h.slot, h.pid, h.pid_start_time))
            .collect();
        let kept_slots: BTreeSet<u32> = kept.iter().map(|k| k.0).collect();
        let mut reclaimed = 0;

        // 1. Sandboxes this driver tracks but the engine no longer wants.
        let tracked: Vec<(u32, i32, u64, String)> = {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            slots
                .iter_taken()
                .filter(|(n, sb)| !kept.contains(&(*n, sb.pid, sb.start_time)))
                .map(|(n, sb)| (n, sb.pid, sb.start_time, sb.cgroup.clone()))
                .collect()
        };
        for (n, pid, st, cg) in tracked {
            self.teardown(n, pid, st, Some(&cg), false).await?;
            reclaimed += 1;
        }

        // 2. Sandbox cgroups whose slot is free (e.g. a crash before the pid file was written,
        // or a restore the previous server did not get to register): their processes go
        // first, so that the slot directories' disks are free to unmount below.
        let names = self
            .inner
            .cgroups
            .list()
            .map_err(|e| DriverError::io("list sandbox cgroups", e))?;
        for name in names {
            let Some(n) = name.split('-').next().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if kept_slots.contains(&n) {
                continue;
            }
            // Hold the slot while its cgroup goes, so no start can pick it meanwhile. Slots
            // beyond max_slots (a previous configuration) cannot be started into anyway.
            let reserved = {
                let mut slots = self.inner.slots.lock().expect("slot table poisoned");
                if n < slots.max() && !slots.reserve_at(n) {
                    continue;
                }
                n < slots.max()
            };
            let inner = self.inner.clone();
            let r = tokio::task::spawn_blocking(move || {
                let _ = inner.cgroups.kill_all(&name);
                // A server may have died while this sandbox was frozen.
                freezer::thaw_now(inner.cgroups.freezer(&name));
                cgroup::remove_with_retry(inner.cgroups.as_ref(), &name, CGROUP_DRAIN_BUDGET)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            if reserved {
                self.inner
                    .slots
                    .lock()
                    .expect("slot table poisoned")
                    .free(n);
            }
            r.map_err(|e| DriverError::io("remove a leftover sandbox cgroup", e))?;
        }
        // 3. Slot directories left by a previous run (live or dead sandboxes).
        let free = |n: u32| {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            !slots.is_busy(n) && !kept_slots.contains(&n)
        };
        let sdir = self.inner.cfg.state_dir.join("s");
        let on_disk: Vec<u32> = fs::read_dir(&sdir)
            .map_err(|e| DriverError::io(format!("read {}", sdir.display()), e))?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        for n in on_disk.into_iter().filter(|n| free(*n)) {
            let (pid, st, cg) = self.slot_owner(n).unwrap_or((0, 0, None));
            self.teardown(n, pid, st, cg.as_deref(), false).await?;
            reclaimed += 1;
        }

        Ok(reclaimed)
    }

    async fn connect(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        match self.lookup(handle) {
            Some(sb) if sb.exited().is_none() => {}
            Some(_) => return Err(DriverError::NotRunning),
            None => {
                if verified_pidfd(handle.pid, handle.pid_start_time).is_none() {
                    return Err(DriverError::NotRunning);
                }
            }
        }
        let sock = self.sock_path(handle.slot);
        let s = connect_agent(&sock).await.map_err(DriverError::Connect)?;
        Ok(Box::new(s))
    }

    async fn open_network(&self, handle: &DriverHandle) -> Result<OwnedFd, DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let (pid, start_time) = (sb.pid, sb.start_time);
        tokio::task::spawn_blocking(move || {
            use std::os::fd::AsRawFd;
            // Open the namespace first, then check the pid still names the sandbox: the open
            // fd pins the namespace, so an adopted sandbox's pid recycled in between can never
            // make us configure somebody else's network.
            let ns = fs::File::open(format!("/proc/{pid}/ns/net"))
                .map_err(|_| DriverError::NotRunning)?;
            if sys::proc_start_time(pid).ok() != Some(start_time) {
                return Err(DriverError::NotRunning);
            }
            let path = PathBuf::from(format!("/proc/self/fd/{}", ns.as_raw_fd()));
            bulkhead_host::link::open_tun_in_netns(&path).map_err(|e| {
                DriverError::io("create the sandbox's network link", io::Error::other(e))
            })
        })
        .await
        .map_err(|e| DriverError::io("network link task", io::Error::other(e)))?
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let inner = self.inner.clone();
        let disk = self.slot_dir(handle.slot).join(super::disk::MOUNT);
        let name = sb.cgroup.clone();
        tokio::task::spawn_blocking(move || {
            let (disk_used_bytes, disk_total_bytes) = super::disk::usage(&disk);
            let cg = inner
                .cgroups
                .usage(&name)
                .map_err(|e| DriverError::io(format!("read cgroup {name}"), e))?;
            Ok(ResourceUsage {
                cpu_usage_ns: cg.cpu_usage_ns,
                mem_used_bytes: cg.mem_used_bytes,
                mem_cache_bytes: cg.mem_cache_bytes,
                mem_limit_bytes: cg.mem_limit_bytes,
                disk_used_bytes,
                disk_total_bytes,
                pids_current: cg.pids_current,
            })
        })
        .await
        .map_err(|e| DriverError::io("usage task", io::Error::other(e)))?
    }

    async fn freeze(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.set_frozen(handle, true).await
    }

    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.set_frozen(handle, false).await
    }

    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        self.checkpoint_sandbox(handle, dir, opts).await
    }

    fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        self.read_checkpoint_info(dir)
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.inner
            .checkpoint_key
            .get_or_init(|| self.compute_checkpoint_key())
            .clone()
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        self.restore_sandbox(spec, dir, opts).await
    }
}
