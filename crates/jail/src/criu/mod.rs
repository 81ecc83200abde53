//! CRIU, the checkpoint/restore tool behind pause, snapshot and fork: its command lines
//! ([`dump_args`], [`restore_args`]) and running it ([`Criu`]). The flags are the ones measured
//! on this kind of host (see `docs/persistence.md`):
//!
//! - `--tcp-established`: a sandbox has live loopback TCP connections (Jupyter's ZMQ);
//! - `--file-locks` on dump *and* restore (without it on restore the locks silently vanish);
//! - `--network-lock skip`: the sandbox's network namespace has no link while it is dumped
//!   (the driver removes it first), and hosts often lack iptables;
//! - `--ext-mount-map auto` for the host device nodes bound into `/dev`, plus explicit keys
//!   for the mounts whose host path differs per slot (the agent socket directory, volumes);
//! - `--manage-cgroups=ignore`: CRIU itself runs inside the new sandbox's cgroups, so the
//!   restored tree lands there.
//!
//! [`image`] rewrites an image for a different uid range (a fork lands in another slot).

pub mod image;

use std::ffi::{CString, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How CRIU failed; every message says what the operator can do.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "Pause, snapshot and fork need CRIU, which this server was not given: build it with \
         scripts/criu.sh and start the server with --criu <path> (or BULKHEAD_CRIU)"
    )]
    NotConfigured,
    #[error("Cannot run CRIU at {path}: {source}; rebuild it with scripts/criu.sh")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CRIU {action} did not finish within {} s; the host may be overloaded", .timeout.as_secs())]
    Timeout {
        action: &'static str,
        timeout: Duration,
    },
    #[error("CRIU {action} failed ({status}); its log ends with: {log_tail}")]
    Failed {
        action: &'static str,
        status: String,
        log_tail: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl CriuError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> CriuError {
        CriuError::Io {
            context: context.into(),
            source,
        }
    }

    /// Did the disk fill up (the operator's fix differs)?
    pub fn is_disk_full(&self) -> bool {
        match self {
            CriuError::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            CriuError::Failed { log_tail, .. } => log_tail.contains("No space left on device"),
            _ => false,
        }
    }
}

/// A mount inside the sandbox whose host source is given explicitly at restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalMount {
    /// Mount point inside the sandbox.
    pub mountpoint: String,
    /// Key recorded in the image.
    pub key: String,
}

const COMMON: &[&str] = &[
    "--tcp-established",
    "--file-locks",
    "--network-lock",
    "skip",
    "--ext-mount-map",
    "auto",
    "--manage-cgroups=ignore",
];

/// `criu dump` of the tree rooted at `pid` into `images`, leaving it running (the caller kills
/// it, or thaws it, afterwards). `freezer` is the sandbox's freezer cgroup, frozen beforehand:
/// CRIU leaves it frozen, so the filesystem can be copied consistently with the memory image.
pub fn dump_args(
    pid: i32,
    images: &Path,
    freezer: &Path,
    external: &[ExternalMount],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["dump".into(), "-t".into(), pid.to_string().into()];
    a.extend(["-D".into(), images.into()]);
    a.extend(COMMON.iter().map(OsString::from));
    a.push("--leave-running".into());
    // Collecting the tree waits at most this long for a task caught mid-exec or mid-exit
    // (CRIU's default is 10 s); the driver thaws and tries again (`is_transient`).
    a.extend(["--timeout".into(), "2".into()]);
    let mut fz = OsString::from("--freeze-cgroup=");
    fz.push(freezer);
    a.push(fz);
    for m in external {
        a.push("--external".into());
        a.push(format!("mnt[{}]:{}", m.mountpoint, m.key).into());
    }
    a.extend(["-o".into(), "dump.log".into()]);
    a
}

/// `criu restore` from `images` onto `root` (the sandbox's overlay, mounted on the host),
/// detached (the restored init is re-parented to the server, a child subreaper), its pid in
/// `pidfile`. `external` maps the image's keys to host paths.
pub fn restore_args(
    images: &Path,
    root: &Path,
    pidfile: &Path,
    external: &[(String, PathBuf)],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["restore".into(), "-D".into(), images.into()];
    a.extend(["--root".into(), root.into()]);
    a.extend(COMMON.iter().map(OsString::from));
    a.push("--restore-detached".into());
    a.extend(["--pidfile".into(), pidfile.into()]);
    for (key, path) in external {
        let mut v = OsString::from(format!("mnt[{key}]:"));
        v.push(path);
        a.push("--external".into());
        a.push(v);
    }
    a.extend(["-o".into(), "restore.log".into()]);
    a
}

/// The CRIU binary and how long it may take.
#[derive(Debug, Clone)]
pub struct Criu {
    pub binary: PathBuf,
    pub timeout: Duration,
}

impl Criu {
    /// Run CRIU with `args`; its log goes to `log` (inside the images dir). `cgroup_procs`:
    /// `cgroup.procs` files CRIU joins before it does anything, so a restored tree starts in
    /// the sandbox's cgroups.
    pub async fn run(
        &self,
        action: &'static str,
        args: &[OsString],
        log: &Path,
        cgroup_procs: &[PathBuf],
    ) -> Result<(), CriuError> {
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let procs: Vec<CString> = cgroup_procs
            .iter()
            .map(|p| CString::new(p.as_os_str().as_encoded_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|e| CriuError::io("cgroup path", std::io::Error::other(e)))?;
        if !procs.is_empty() {
            // SAFETY: only async-signal-safe calls (open, write, close) on memory prepared
            // before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    for p in &procs {
                        let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        if fd < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // "0" is the writing process itself.
                        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                        if n != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|source| CriuError::Spawn {
            path: self.binary.clone(),
            source,
        })?;
        let out = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| CriuError::Timeout {
                action,
                timeout: self.timeout,
            })?
            .map_err(|e| CriuError::io("wait for CRIU", e))?;
        if out.status.success() {
            return Ok(());
        }
        let mut tail = log_errors(log);
        if tail.is_empty() {
            tail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        }
        Err(CriuError::Failed {
            action,
            status: out.status.to_string(),
            log_tail: tail,
        })
    }

    /// `criu --version` answers: the binary exists and runs on this host.
    pub fn check(binary: &Path) -> Result<String, CriuError> {
        let out = std::process::Command::new(binary)
            .arg("--version")
            .output()
            .map_err(|source| CriuError::Spawn {
                path: binary.to_path_buf(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() {
            return Err(CriuError::Failed {
                action: "--version",
                status: out.status.to_string(),
                log_tail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(text)
    }
}

/// The last error lines of a CRIU log, without the noise every run on these hosts has
/// (no iptables, no CAP_SYS_RESOURCE for RLIMIT_NOFILE, lo's address re-added).
pub fn log_errors(log: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error") || l.contains("BUG"))
        .filter(|l| !is_noise(l))
        .collect();
    let start = errors.len().saturating_sub(4);
    errors[start..].join(" | ")
}

fn is_noise(line: &str) -> bool {
    ["iptables", "ip6tables", "RLIMIT_NOFILE", "already assigned"]
        .iter()
        .any(|n| line.contains(n))
}

/// CRIU processes still running `binary` whose command line names any of `marks` (a server's
/// state dir or cgroup subtree): what a server that died mid-dump or mid-restore left behind.
pub fn leftover_processes(binary: &Path, marks: &[String]) -> Vec<i32> {
    let Ok(binary) = std::fs::canonicalize(binary) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    marks.iter().any(|m| c.contains(m.as_str()))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(a: &[OsString]) -> Vec<String> {
        a.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn dump_leaves_the_frozen_tree_running_and_names_external_mounts() {
        let a = strs(&dump_args(
            42,
            Path::new("/c/images"),
            Path::new("/sys/fs/cgroup/freezer/b/1-x"),
            &[ExternalMount {
                mountpoint: "/run/bulkhead/sock".into(),
                key: "sock".into(),
            }],
        ));
        assert_eq!(a[..5], ["dump", "-t", "42", "-D", "/c/images"]);
        for f in [
            "--tcp-established",
            "--file-locks",
            "--leave-running",
            "--manage-cgroups=ignore",
            "--freeze-cgroup=/sys/fs/cgroup/freezer/b/1-x",
            "mnt[/run/bulkhead/sock]:sock",
        ] {
            assert!(a.iter().any(|x| x == f), "{f} missing from {a:?}");
        }
        let lock = a.iter().position(|x| x == "--network-lock").unwrap();
        assert_eq!(a[lock + 1], "skip");
    }

    #[test]
    fn restore_is_detached_onto_the_given_root_with_mapped_keys() {
        let a = strs(&restore_args(
            Path::new("/s/3/img"),
            Path::new("/s/3/merged"),
            Path::new("/s/3/restore.pid"),
            &[("sock".into(), PathBuf::from("/s/3/sock"))],
        ));
        assert_eq!(
            a[..5],
            ["restore", "-D", "/s/3/img", "--root", "/s/3/merged"]
        );
        for f in [
            "--restore-detached",
            "--tcp-established",
            "--file-locks",
            "mnt[sock]:/s/3/sock",
            "/s/3/restore.pid",
        ] {
            assert!(a.iter().any(|x| x == f), "{f} missing from {a:?}");
        }
    }

    #[test]
    fn log_errors_skip_the_known_noise() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("restore.log");
        std::fs::write(
            &log,
            "(0.1) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self\n\
             Error (criu/util.c:642): execvp(\"iptables-restore\") failed\n\
             (0.2) 1: Error (criu/files-reg.c:2353): Can't open file run/x on restore\n\
             (0.3) Error (criu/cr-restore.c:2331): Restoring FAILED.\n",
        )
        .unwrap();
        let e = log_errors(&log);
        assert!(e.starts_with("(0.2) 1: Error (criu/files-reg.c"), "{e}");
        assert!(e.ends_with("Restoring FAILED."), "{e}");
        assert!(!e.contains("iptables") && !e.contains("RLIMIT"));
        let full = CriuError::Failed {
            action: "dump",
            status: "exit status: 1".into(),
            log_tail: "Error: write pages: No space left on device".into(),
        };
        assert!(full.is_disk_full());
    }
}
