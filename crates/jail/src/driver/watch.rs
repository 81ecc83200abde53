//! Owning a running sandbox: its pidfd is registered with the reactor and a reaper task turns
//! its death into an [`ExitInfo`] that `wait`, `connect` and `stop` observe; the sandbox then
//! holds its slot.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use bulkhead_driver::{DriverError, DriverHandle, StartError};
use tokio::sync::watch;

use super::launch::LaunchError;
use super::pidfd::{verified_pidfd, watch_pidfd};
use super::state::{JailDriver, Sandbox};
use crate::sys::{self, ExitInfo};

impl JailDriver {
    /// Take ownership of a running sandbox: pidfd, reaper task, slot entry.
    pub(super) fn register(
        &self,
        slot: u32,
        pid: i32,
        start_time: u64,
        cgroup: String,
        pidfd: OwnedFd,
        adopting: bool,
    ) -> Result<Arc<Sandbox>, DriverError> {
        let afd = Arc::new(
            watch_pidfd(pidfd).map_err(|e| DriverError::io("watch the sandbox pidfd", e))?,
        );
        let (tx, rx) = watch::channel(None);
        let watched = afd.clone();
        let task = tokio::spawn(async move {
            // Readable = the process has exited. waitid reaps it when it is our child (started
            // by this process); an adopted one belongs to someone else (ECHILD).
            loop {
                let Ok(mut guard) = watched.readable().await else {
                    break;
                };
                match sys::waitid_pidfd(watched.get_ref().as_fd(), true) {
                    Ok(Some(info)) => {
                        let _ = tx.send(Some(info));
                        break;
                    }
                    Ok(None) => guard.clear_ready(),
                    Err(e) => {
                        tracing::warn!(pid, error = %e, "waitid on a sandbox pidfd failed");
                        let _ = tx.send(Some(ExitInfo::Unknown));
                        break;
                    }
                }
            }
        });
        let sb = Arc::new(Sandbox {
            pid,
            start_time,
            cgroup,
            pidfd: afd,
            exit: rx,
            reaper: task.abort_handle(),
            background: false.into(),
        });
        let mut slots = self.inner.slots.lock().expect("slot table poisoned");
        // Adoption must not steal a slot a start has reserved; a start completes its own.
        if (adopting && slots.is_busy(slot)) || slots.take(slot, sb.clone()).is_err() {
            task.abort();
            return Err(StartError::setup(LaunchError::SlotTaken(slot)).into());
        }
        Ok(sb)
    }

    /// Resolve when the sandbox of `handle` has died: through our reaper when we own it, else
    /// through a pidfd of the very process the handle names (none: it is gone already).
    pub(super) async fn wait_exit(&self, handle: &DriverHandle) {
        if let Some(sb) = self.lookup(handle) {
            let mut rx = sb.exit.clone();
            let _ = rx.wait_for(Option::is_some).await;
            return;
        }
        let Some(fd) = verified_pidfd(handle.pid, handle.pid_start_time) else {
            return;
        };
        if let Ok(afd) = watch_pidfd(fd) {
            let _ = afd.readable().await;
        }
    }
}
