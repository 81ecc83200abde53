//! One VM's host side: its slot directory and record, spawning QEMU with least privilege, and
//! checks on the QEMU process (alive, the same process, killed).
//!
//! QEMU runs as the slot's own uid and gid with no supplementary groups (plus the group owning
//! `/dev/kvm` when KVM is used), in the jail of [`crate::jailer`] (its own cgroup, pid, mount,
//! user, network, IPC and UTS namespaces, a root holding only its files), with its `-sandbox`
//! seccomp filter. It owns only its slot directory; everything else it sees is read-only.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bulkhead_host::sys;
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;

use crate::jailer::{self, Jail};
use crate::qemu::{self, Accel, VmSpec};

/// Files of a slot directory.
pub const RECORD: &str = "vm.json";
pub const AGENT_SOCKET: &str = "agent.sock";
pub const QMP_SOCKET: &str = "qmp.sock";
pub const CONSOLE_LOG: &str = "console.log";
pub const QEMU_LOG: &str = "qemu.log";
pub const RW_DISK: &str = "rw.img";

/// What a slot directory records about its VM (also the handle's `data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub dir: PathBuf,
    pub pid: i32,
    pub pid_start_time: u64,
    pub slot: u32,
    pub memory_mb: u64,
    pub cpus: u32,
    pub disk_mb: u64,
    pub accel: String,
    /// The template snapshot this VM was cloned from; None for a cold boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Its RAM is under the `mem0` memory backend (clones and their restores): a checkpoint's
    /// restore must use the same (migration matches RAM blocks by id).
    #[serde(default)]
    pub ram_backend: bool,
}

impl VmRecord {
    pub fn load(dir: &Path) -> Option<VmRecord> {
        serde_json::from_slice(&fs::read(dir.join(RECORD)).ok()?).ok()
    }

    pub fn store(&self) -> io::Result<()> {
        let tmp = self.dir.join(format!("{RECORD}.tmp"));
        fs::write(&tmp, serde_json::to_vec(self).map_err(io::Error::other)?)?;
        fs::rename(tmp, self.dir.join(RECORD))
    }
}

/// The paths QEMU gets for slot directory `dir`.
pub fn spec_paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    (
        dir.join(AGENT_SOCKET),
        dir.join(QMP_SOCKET),
        dir.join(CONSOLE_LOG),
        dir.join(RW_DISK),
    )
}

/// Spawns QEMU for `spec` in `jail` (its uid, gid, cgroup and root; see [`crate::jailer`]).
/// Returns the spawned intermediate process (it exits at once; reap it) and QEMU's host pid.
/// `inherit` stays open in QEMU at the same number (a clone's sealed RAM memfd).
pub fn spawn(
    qemu_bin: &Path,
    spec: &VmSpec,
    dir: &Path,
    mut jail: Jail,
    inherit: Option<i32>,
) -> io::Result<(tokio::process::Child, i32)> {
    let log = fs::File::create(dir.join(QEMU_LOG))?;
    fs::set_permissions(dir.join(QEMU_LOG), fs::Permissions::from_mode(0o600))?;
    std::os::unix::fs::chown(dir.join(QEMU_LOG), Some(jail.uid), Some(jail.gid))?;
    jail.groups = match spec.accel {
        Accel::Kvm => vec![fs::metadata("/dev/kvm")?.gid()],
        Accel::Tcg => Vec::new(),
    };
    let (pid_r, pid_w) = jailer::pid_pipe()?;
    jail.pid_fd = pid_w.as_raw_fd();
    let mut cmd = tokio::process::Command::new(qemu_bin);
    cmd.args(qemu::args(spec))
        .env_clear()
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = inherit {
                // Only this child's descriptor table changes: the server keeps it CLOEXEC.
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            jailer::enter(&jail, &mut jailer::LiveSys)
        });
    }
    let child = cmd.spawn()?;
    drop(cmd);
    drop(pid_w);
    let pid = jailer::read_pid(&pid_r)?;
    Ok((child, pid))
}

/// Is `pid` still the process recorded (same start time) and not a zombie?
pub fn alive(pid: i32, start_time: u64) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_ascii_whitespace().next());
    sys::parse_stat_start_time(&stat) == Some(start_time) && state != Some("Z")
}

/// A pidfd for the recorded process, or None when it is gone (or the pid was reused).
pub fn pidfd(pid: i32, start_time: u64) -> Option<OwnedFd> {
    let fd = sys::pidfd_open(pid).ok()?;
    // Checked after opening: the pidfd now pins this process, so the check cannot race.
    alive(pid, start_time).then_some(fd)
}

/// Resolves when the process behind `fd` has exited.
pub async fn exited(fd: OwnedFd) {
    // SAFETY: the OwnedFd owns the descriptor for the AsyncFd's whole lifetime and always
    // reports the same raw fd.
    let Ok(afd) = (unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) })
    else {
        return;
    };
    let _ = afd.readable().await;
}

/// SIGKILL the recorded process and wait (bounded) until it is gone.
pub async fn kill(pid: i32, start_time: u64) {
    let Some(fd) = pidfd(pid, start_time) else {
        return;
    };
    let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
    let reap = fd.try_clone();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), exited(fd)).await;
    // QEMU's parent (the jailer's intermediate) is gone: a server that is a child subreaper
    // (the jail driver makes it one) inherits QEMU and must reap it.
    if let Ok(fd) = reap {
        let _ = sys::waitid_pidfd(fd.as_fd(), true);
    }
}

/// (cpu ns, rss bytes, threads) of a process, from /proc.
pub fn proc_usage(pid: i32) -> io::Result<(u64, u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| io::Error::other("malformed /proc/PID/stat"))?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the comm.
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        ticks * 1_000_000_000 / hz,
        field("VmRSS:") * 1024,
        field("Threads:"),
    ))
}

/// The last `max` bytes of a log file, for error messages.
pub fn tail(path: &Path, max: usize) -> String {
    let data = fs::read(path).unwrap_or_default();
    let start = data.len().saturating_sub(max);
    String::from_utf8_lossy(&data[start..]).trim().to_owned()
}
