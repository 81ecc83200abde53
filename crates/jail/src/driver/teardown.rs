//! Teardown of a slot: kill the sandbox, wait for its init, remove its cgroups and files, free
//! the slot. Shared by `stop`, `reclaim_orphans` and a failed start.

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;

use bulkhead_driver::{DriverError, DriverHandle};

use super::pidfd::{verified_pidfd, watch_pidfd};
use super::seed::prepare_slot_removal;
use super::state::{CGROUP_DRAIN_BUDGET, DRIVER_NAME, JailDriver, STOP_EXIT_BUDGET};
use crate::slots::SlotState;
use crate::sys;
use crate::{cgroup, freezer};

impl JailDriver {
    /// Kill, wait, remove cgroups and the slot directory, free the slot.
    pub(super) async fn teardown(
        &self,
        slot: u32,
        pid: i32,
        start_time: u64,
        cgroup_name: Option<&str>,
        failed_start: bool,
    ) -> Result<(), DriverError> {
        let handle_like =
            DriverHandle::new(DRIVER_NAME, pid, start_time, slot, serde_json::Value::Null);
        let ours = self.lookup(&handle_like);
        // 1. SIGKILL the init: the kernel then kills the whole pid namespace.
        let foreign_fd = match &ours {
            Some(sb) => {
                let _ = sys::pidfd_send_signal(sb.pidfd.get_ref().as_fd(), libc::SIGKILL);
                None
            }
            None if pid > 0 => verified_pidfd(pid, start_time).inspect(|fd| {
                let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
            }),
            None => None,
        };
        // 2. Belt and braces: everything in the cgroup.
        if let Some(name) = cgroup_name {
            let _ = self.inner.cgroups.kill_all(name);
            // Frozen tasks (v1) die of SIGKILL only once thawed.
            freezer::thaw_now(self.inner.cgroups.freezer(name));
        }
        // 3. Wait (bounded) for the init to be gone.
        let waited = async {
            if let Some(sb) = &ours {
                let mut rx = sb.exit.clone();
                let _ = rx.wait_for(Option::is_some).await;
            } else if let Some(fd) = foreign_fd
                && let Ok(afd) = watch_pidfd(fd)
            {
                let _ = afd.readable().await;
                let _ = sys::waitid_pidfd(afd.get_ref().as_fd(), true);
            }
        };
        if tokio::time::timeout(STOP_EXIT_BUDGET, waited)
            .await
            .is_err()
        {
            tracing::warn!(
                pid,
                slot,
                "sandbox init did not exit within {STOP_EXIT_BUDGET:?} of SIGKILL"
            );
        }
        // 4. cgroups (rmdir fails until the last task is gone).
        let mut result = Ok(());
        if let Some(name) = cgroup_name {
            let inner = self.inner.clone();
            let owned = name.to_string();
            let r = tokio::task::spawn_blocking(move || {
                cgroup::remove_with_retry(inner.cgroups.as_ref(), &owned, CGROUP_DRAIN_BUDGET)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            if let Err(e) = r {
                self.inner
                    .stale_cgroups
                    .lock()
                    .expect("stale cgroups poisoned")
                    .push(name.to_string());
                result = Err(DriverError::io("remove the sandbox cgroup", e));
            }
        }
        // 5. The slot's files, unless the slot now belongs to somebody else. A free slot is
        // reserved while its directory goes, so a concurrent start cannot pick it meanwhile.
        let (slot_is_ours, cleaning) = {
            let mut slots = self.inner.slots.lock().expect("slot table poisoned");
            match slots.get(slot) {
                Some(SlotState::Taken(sb)) => (sb.pid == pid && sb.start_time == start_time, false),
                // Reserved: a start is in flight; only that start may clean up after itself.
                Some(SlotState::Reserved) => (failed_start, false),
                None => {
                    let ours = match self.slot_owner(slot) {
                        Some((p, st, _)) => {
                            (p == pid && st == start_time) || !self.slot_held_elsewhere(slot)
                        }
                        None => true,
                    };
                    (ours, ours && slots.reserve_at(slot))
                }
            }
        };
        if slot_is_ours {
            let dir = self.slot_dir(slot);
            let r = tokio::task::spawn_blocking(move || {
                prepare_slot_removal(&dir);
                match fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other
                        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
                }
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            if let Err(e) = r
                && result.is_ok()
            {
                result = Err(DriverError::io("remove the sandbox directory", e));
            }
        }
        if cleaning {
            self.inner
                .slots
                .lock()
                .expect("slot table poisoned")
                .free(slot);
        }
        // 6. Free the slot (only if this sandbox held it).
        if let Some(sb) = &ours {
            sb.reaper.abort();
            let mut slots = self.inner.slots.lock().expect("slot table poisoned");
            if slots.taken(slot).is_some_and(|cur| Arc::ptr_eq(cur, sb)) {
                slots.free(slot);
            }
        }
        result
    }
}
