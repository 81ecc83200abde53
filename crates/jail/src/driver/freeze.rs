//! Freeze and thaw through the sandbox's cgroup freezer (see [`crate::freezer`]).

use std::io;
use std::time::Duration;

use bulkhead_driver::{DriverError, DriverHandle, Operation};

use super::state::{DRIVER_NAME, JailDriver};

/// How long a freeze or thaw may take before it counts as failed (the kernel needs about a
/// millisecond; a task in a long uninterruptible sleep delays a v1 freeze).
const FREEZE_BUDGET: Duration = Duration::from_secs(5);

impl JailDriver {
    /// Does this host's cgroup layout have a freezer for sandboxes?
    pub(super) fn can_freeze(&self) -> bool {
        self.inner.cgroups.freezer("0-probe").is_some()
    }

    pub(super) async fn set_frozen(
        &self,
        handle: &DriverHandle,
        frozen: bool,
    ) -> Result<(), DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let op = if frozen {
            Operation::Freeze
        } else {
            Operation::Thaw
        };
        let freezer = self
            .inner
            .cgroups
            .freezer(&sb.cgroup)
            .ok_or(DriverError::unsupported(DRIVER_NAME, op))?;
        let r = tokio::task::spawn_blocking(move || {
            let r = freezer.set(frozen, FREEZE_BUDGET);
            if r.is_err() && frozen {
                // Never leave a sandbox half frozen.
                let _ = freezer.request(false);
            }
            r
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
        r.map_err(|e| {
            let context = if frozen {
                "Cannot freeze the sandbox; it keeps running"
            } else {
                "Cannot thaw the sandbox; retry, or stop it"
            };
            DriverError::io(context, e)
        })
    }
}
