//! What this host offers the jail driver, without forking (the server calls this from its
//! multi-threaded runtime). Kernel-version checks stand in for features that can only be
//! exercised from a child process; the first `start` proves the rest.

use serde::Serialize;

use crate::cgroup::{self, CgroupVersion};
use crate::sys;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HostReport {
    pub is_root: bool,
    pub kernel: Option<(u32, u32)>,
    /// User namespaces are enabled (`user.max_user_namespaces` > 0).
    pub user_namespaces: bool,
    /// `open_tree`/`mount_setattr(MOUNT_ATTR_IDMAP)` and idmapped overlay lower layers
    /// (kernel >= 5.19).
    pub idmapped_mounts: bool,
    /// overlayfs with `userxattr` inside a user namespace (built in, kernel >= 5.11).
    pub overlay_userxattr: bool,
    pub cgroup: Option<CgroupVersion>,
    /// seccomp filters with errno and kill-process actions.
    pub seccomp: bool,
    /// Landlock ABI (0 = unavailable; the driver then runs without it).
    pub landlock_abi: u32,
    /// pidfd_open + waitid(P_PIDFD) (kernel >= 5.4).
    pub pidfd: bool,
    /// One line per missing requirement.
    pub problems: Vec<String>,
}

impl HostReport {
    /// Can jail sandboxes run here? Landlock is optional (best effort).
    pub fn supported(&self) -> bool {
        self.problems.is_empty()
    }
}

fn at_least(k: Option<(u32, u32)>, want: (u32, u32)) -> bool {
    k.is_some_and(|k| k >= want)
}

pub fn probe() -> HostReport {
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let kernel = sys::kernel_version();
    let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
        && std::path::Path::new("/proc/self/ns/user").exists();
    let overlay = std::fs::read_to_string("/proc/filesystems").is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    });
    let seccomp =
        std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").is_ok_and(|s| {
            let w: Vec<&str> = s.split_whitespace().collect();
            w.contains(&"errno") && w.contains(&"kill_process")
        });
    let cgroup = cgroup::detect("bulkhead");
    let mut r = HostReport {
        is_root,
        kernel,
        user_namespaces,
        idmapped_mounts: at_least(kernel, (5, 19)),
        overlay_userxattr: overlay && at_least(kernel, (5, 11)),
        cgroup: cgroup.as_ref().ok().map(|b| b.version()),
        seccomp,
        landlock_abi: sys::landlock_abi(),
        pidfd: at_least(kernel, (5, 4)),
        problems: Vec::new(),
    };
    let mut need = |ok: bool, what: &str| {
        if !ok {
            r.problems.push(what.to_string());
        }
    };
    need(is_root, "the server must run as root");
    need(
        user_namespaces,
        "user namespaces are disabled (user.max_user_namespaces = 0)",
    );
    need(
        r.idmapped_mounts,
        "idmapped overlay lower layers need Linux 5.19 or newer",
    );
    need(
        r.overlay_userxattr,
        "overlayfs with userxattr is unavailable",
    );
    need(
        seccomp,
        "seccomp filters (errno, kill_process) are unavailable",
    );
    need(r.pidfd, "pidfds need Linux 5.4 or newer");
    if let Err(e) = cgroup {
        r.problems.push(e.to_string());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_something_coherent() {
        let r = probe();
        assert_eq!(r.supported(), r.problems.is_empty());
        if r.kernel.is_some_and(|k| k >= (5, 19)) {
            assert!(r.idmapped_mounts && r.pidfd);
        }
        println!("{r:#?}");
    }
}
