//! Guest mode: the sandbox's process limit, as the jail's pids cgroup sets it on the host.
//!
//! In a microVM the agent is the guest's pid 1 and every sandbox process is its descendant, so
//! a fork bomb would exhaust the guest's pids and leave the agent unable to start a thread or
//! a process. [`setup`] mounts cgroup v2 at `/sys/fs/cgroup` and makes a `sandbox` cgroup with
//! `pids.max`; every process the agent spawns joins it before `exec`
//! ([`crate::process::spawn`], through the descriptor [`procs_fd`] returns), while the agent
//! stays in the root cgroup, outside the limit. `pids.max` is the sandbox's `pids_max`: from
//! the kernel command line at boot (`BULKHEAD_GUEST_PIDS_MAX`), and from the host's
//! `POST /bulkhead/cloned` for a clone or a restore ([`set_pids_max`]).
//! Outside a VM nothing here runs and [`procs_fd`] is -1.

use std::fs;
use std::io;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::mount::{MsFlags, mount};

/// cgroup v2's mount point in the guest.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The cgroup of the sandbox's processes.
pub const SANDBOX_CGROUP: &str = "/sys/fs/cgroup/sandbox";

/// `sandbox/cgroup.procs`, open for writing (-1: no sandbox cgroup).
static PROCS_FD: AtomicI32 = AtomicI32::new(-1);

/// The descriptor a child writes "0" to, to join the sandbox cgroup; -1 outside a VM.
pub fn procs_fd() -> i32 {
    PROCS_FD.load(Ordering::Relaxed)
}

/// `pids.max`'s value for `limit` (0: no limit).
pub fn pids_max_value(limit: u64) -> String {
    if limit == 0 {
        "max".into()
    } else {
        limit.to_string()
    }
}

/// Creates the sandbox cgroup with `pids_max` (None: no limit until the host sets one). Runs
/// in pid 1 after `/sys` is mounted, before the server is forked (which inherits the fd).
pub fn setup(pids_max: Option<u64>) -> io::Result<()> {
    fs::create_dir_all(CGROUP_ROOT)?;
    mount(
        Some("cgroup2"),
        CGROUP_ROOT,
        Some("cgroup2"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    fs::write(format!("{CGROUP_ROOT}/cgroup.subtree_control"), "+pids")?;
    match fs::create_dir(SANDBOX_CGROUP) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    set_pids_max(pids_max.unwrap_or(0))?;
    let procs = fs::OpenOptions::new()
        .write(true)
        .open(format!("{SANDBOX_CGROUP}/cgroup.procs"))?;
    PROCS_FD.store(procs.into_raw_fd(), Ordering::Relaxed);
    Ok(())
}

/// Sets the sandbox cgroup's `pids.max` (0: no limit).
pub fn set_pids_max(limit: u64) -> io::Result<()> {
    fs::write(format!("{SANDBOX_CGROUP}/pids.max"), pids_max_value(limit))
}

/// The boot-time limit from the kernel command line (`BULKHEAD_GUEST_PIDS_MAX`).
pub fn boot_pids_max() -> Option<u64> {
    std::env::var("BULKHEAD_GUEST_PIDS_MAX").ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_no_limit() {
        assert_eq!(pids_max_value(0), "max");
        assert_eq!(pids_max_value(256), "256");
    }
}
