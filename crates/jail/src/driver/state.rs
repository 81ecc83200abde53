//! The driver's state: the [`JailDriver`] handle, the sandboxes it owns (started or adopted)
//! in the slot table, and where a slot's files are.

use std::fs;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bulkhead_driver::{DriverError, DriverHandle, StartError};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use std::os::fd::OwnedFd;

use crate::JailConfig;
use crate::cgroup::{CgroupBackend, CgroupVersion};
use crate::mountplan::SOCK_NAME;
use crate::probe::{self, HostReport};
use crate::slots::SlotTable;
use crate::sys::{self, ExitInfo};

pub(super) const DRIVER_NAME: &str = "jail";
/// How long `stop` waits for the init to exit after SIGKILL before giving up on it.
pub(super) const STOP_EXIT_BUDGET: Duration = Duration::from_secs(5);
/// How long `stop` retries rmdir while the cgroup's tasks drain.
pub(super) const CGROUP_DRAIN_BUDGET: Duration = Duration::from_secs(5);

/// Driver data stored in [`DriverHandle::data`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct HandleData {
    pub(super) cgroup: String,
    pub(super) cgroup_version: CgroupVersion,
    pub(super) lower: PathBuf,
    /// The agent binary bound into the sandbox (absent in handles of older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) agent: Option<PathBuf>,
    /// The template root the lower is a view of (absent in handles of older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rootfs: Option<PathBuf>,
    /// Where volumes are mounted inside (a checkpoint names them for the restore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) volumes: Vec<String>,
}

/// A sandbox this driver owns (started or adopted).
pub(super) struct Sandbox {
    pub(super) pid: i32,
    pub(super) start_time: u64,
    pub(super) cgroup: String,
    pub(super) pidfd: Arc<AsyncFd<OwnedFd>>,
    pub(super) exit: watch::Receiver<Option<ExitInfo>>,
    pub(super) reaper: AbortHandle,
    /// A warm-pool member still at the background CPU weight (see `Driver::start_warm`).
    pub(super) background: std::sync::atomic::AtomicBool,
}

impl Sandbox {
    pub(super) fn matches(&self, h: &DriverHandle) -> bool {
        self.pid == h.pid && self.start_time == h.pid_start_time
    }
    pub(super) fn exited(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }
}

pub(super) struct Inner {
    pub(super) cfg: JailConfig,
    /// The driver's private copy of the agent binary (see `fsutil::install_agent`).
    pub(super) agent: PathBuf,
    pub(super) cgroups: Box<dyn CgroupBackend>,
    pub(super) slots: Mutex<SlotTable<Arc<Sandbox>>>,
    /// `Driver::checkpoint_key`, worked out once (it runs `criu --version`).
    pub(super) checkpoint_key: std::sync::OnceLock<Option<String>>,
    pub(super) launcher: super::launch::Launcher,
    /// Cgroups a teardown could not remove (a task still draining). The next start in their
    /// slot retries them; listing every hierarchy on each start instead cost more than the
    /// rest of the cgroup work. Leftovers of a crashed server are found by `reclaim_orphans`.
    pub(super) stale_cgroups: Mutex<Vec<String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Sandboxes outlive the driver (a restarted server adopts them); only our watchers go.
        if let Ok(slots) = self.slots.lock() {
            for (_, sb) in slots.iter_taken() {
                sb.reaper.abort();
            }
        }
    }
}

pub struct JailDriver {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for JailDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JailDriver")
            .field("state_dir", &self.inner.cfg.state_dir)
            .field("cgroups", &self.inner.cgroups.version())
            .finish()
    }
}

impl JailDriver {
    /// What this host supports (for deciding to use or skip the driver, loudly).
    pub fn probe() -> HostReport {
        probe::probe()
    }

    pub fn cgroup_version(&self) -> CgroupVersion {
        self.inner.cgroups.version()
    }

    pub fn config(&self) -> &JailConfig {
        &self.inner.cfg
    }

    /// Remove this driver's cgroup parent directories if no sandbox cgroup is left in them
    /// (called when the server stops; busy parents stay for the sandboxes that keep running).
    pub fn release_cgroup_parent(&self) {
        for d in self.inner.cgroups.parent_dirs() {
            // Only our own leaf: the shared top (`bulkhead`) may hold other servers' parents.
            let _ = fs::remove_dir(&d);
        }
    }

    pub(super) fn slot_dir(&self, slot: u32) -> PathBuf {
        self.inner.cfg.state_dir.join("s").join(slot.to_string())
    }

    /// The running sandbox's overlay upper dir, on its disk.
    pub(super) fn upper_dir(&self, slot: u32) -> PathBuf {
        self.slot_dir(slot)
            .join(super::disk::MOUNT)
            .join(super::disk::UPPER)
    }

    /// Formatted blank disks, one per size (see `disk.rs`).
    pub(super) fn disk_cache(&self) -> PathBuf {
        self.inner.cfg.state_dir.join("disks")
    }

    /// Mount points of checkpoints' disks opened for reading.
    pub(super) fn view_dir(&self) -> PathBuf {
        self.inner.cfg.state_dir.join("views")
    }

    pub(super) fn sock_path(&self, slot: u32) -> PathBuf {
        self.slot_dir(slot).join("sock").join(SOCK_NAME)
    }

    /// pid, start time and cgroup recorded in a slot directory by a (possibly previous) run.
    pub(super) fn slot_owner(&self, slot: u32) -> Option<(i32, u64, Option<String>)> {
        let s = fs::read_to_string(self.slot_dir(slot).join("pid")).ok()?;
        let mut it = s.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        Some((pid, start, it.next().map(str::to_owned)))
    }

    /// Is the slot held by a live sandbox this driver does not track?
    pub(super) fn slot_held_elsewhere(&self, slot: u32) -> bool {
        self.slot_owner(slot)
            .is_some_and(|(pid, st, _)| sys::proc_start_time(pid).is_ok_and(|t| t == st))
    }

    /// Reserve a free slot, `preferred` if it is free (a resumed sandbox gets its own uid
    /// range back when it can, so its files need no re-owning).
    pub(super) fn reserve_slot_preferring(
        &self,
        preferred: Option<u32>,
    ) -> Result<u32, DriverError> {
        if let Some(n) = preferred.filter(|n| *n < self.inner.cfg.max_slots)
            && !self.slot_held_elsewhere(n)
            && self
                .inner
                .slots
                .lock()
                .expect("slot table poisoned")
                .reserve_at(n)
        {
            return Ok(n);
        }
        self.reserve_slot()
    }

    pub(super) fn reserve_slot(&self) -> Result<u32, DriverError> {
        let mut slots = self.inner.slots.lock().expect("slot table poisoned");
        slots
            .reserve(|n| self.slot_held_elsewhere(n))
            .ok_or(DriverError::Start(StartError::NoFreeSlot {
                max: self.inner.cfg.max_slots,
            }))
    }

    pub(super) fn lookup(&self, h: &DriverHandle) -> Option<Arc<Sandbox>> {
        let slots = self.inner.slots.lock().expect("slot table poisoned");
        slots.taken(h.slot).filter(|sb| sb.matches(h)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_data_round_trips() {
        let d = HandleData {
            cgroup: "3-deadbeef".into(),
            cgroup_version: CgroupVersion::V1,
            lower: "/var/lib/bulkhead/jail/l/3-abc".into(),
            agent: None,
            rootfs: None,
            volumes: Vec::new(),
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["cgroup_version"], "v1");
        assert_eq!(serde_json::from_value::<HandleData>(v).unwrap(), d);
    }
}
