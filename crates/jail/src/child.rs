//! The sandbox init before `execve`: runs in the launcher's clone child, inside the fresh
//! namespaces, single-threaded.
//!
//! The sequence is data, like the mount plan ([`crate::mountplan`]): [`plan`] lists the
//! [`InitStep`]s for a [`StartSpec`] and [`execute`] runs them in order through an [`InitSys`].
//! [`LiveInit`] makes the system calls (through `nix` where it wraps them); a recording fake
//! checks the order in the unit tests, without privileges. Every failure is returned as
//! "<step>: <error>" and travels to the launcher parent over the error pipe.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::signal::{SigSet, SigmaskHow};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};
use seccompiler::BpfProgram;

use crate::confine;
use crate::mountplan::{self, AGENT_LOG, MountSys};
use crate::seccomp;
use crate::spec::StartSpec;
use crate::sys;

/// One step of the sandbox init, from the clone to the agent's `execve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitStep<'a> {
    /// Wait until the parent has written our uid/gid maps and cgroup membership (one byte on
    /// the release pipe), then close the pipe.
    AwaitRelease,
    /// A session of its own (CRIU needs the init to be a session leader inside the namespace).
    NewSession,
    /// No supplementary groups; gid, then uid 0 (real, effective, saved) in the user namespace.
    BecomeRoot,
    /// A cgroup namespace, made now that the parent has moved us into the sandbox cgroup, so
    /// that its root is that cgroup (a namespace made by `clone` would be rooted at the
    /// launcher's).
    NewCgroupNamespace,
    /// The file mode creation mask.
    Umask(u32),
    /// The sandbox's filesystem ([`mountplan::plan`]), ending with the volumes after
    /// `pivot_root`.
    Mounts(Vec<mountplan::Step>),
    Hostname(&'a str),
    /// `lo` up ([`bulkhead_host::netif`]).
    LoopbackUp,
    /// stdin from `/dev/null`, stdout and stderr appended to the agent log in the socket
    /// directory.
    Stdio,
    Chdir(&'static str),
    /// Nothing of the launcher may leak into the sandbox: every inherited fd beyond stdio
    /// (including the error pipe, which must stay open until exec) closes on exec.
    CloseInheritedOnExec,
    /// Default dispositions and an empty signal mask (see [`reset_signals`]).
    ResetSignals,
    /// `RLIMIT_NPROC` for the agent and everything it starts.
    NprocLimit(u64),
    /// Landlock, seccomp and the capability sets go on while the init still holds
    /// CAP_SYS_ADMIN in the sandbox's user namespace, which the kernel accepts in place of
    /// `no_new_privs`. Without that bit, set-uid programs work inside (`sudo`, as on E2B): they
    /// reach the sandbox's own root with the capability set below, never anything outside the
    /// user namespace, and the filters stay.
    Landlock,
    Seccomp,
    LimitCapabilities,
    /// `execve` the agent; returns only on failure.
    Exec {
        argv: &'a [String],
        env: &'a [String],
    },
}

/// The init sequence for `spec`.
pub fn plan(spec: &StartSpec) -> Vec<InitStep<'_>> {
    let mut steps = vec![
        InitStep::AwaitRelease,
        InitStep::NewSession,
        InitStep::BecomeRoot,
        InitStep::NewCgroupNamespace,
        // Mount points and tmpfs roots get exactly the modes we ask for; the agent gets 022.
        InitStep::Umask(0),
        InitStep::Mounts(mountplan::plan(spec)),
        InitStep::Hostname(&spec.hostname),
        InitStep::LoopbackUp,
        InitStep::Stdio,
        InitStep::Chdir("/"),
        InitStep::CloseInheritedOnExec,
        InitStep::ResetSignals,
    ];
    steps.extend(spec.nproc_limit.map(InitStep::NprocLimit));
    steps.extend([
        InitStep::Umask(0o022),
        InitStep::Landlock,
        InitStep::Seccomp,
        InitStep::LimitCapabilities,
        InitStep::Exec {
            argv: &spec.argv,
            env: &spec.env,
        },
    ]);
    steps
}

/// What runs the steps: [`LiveInit`], or a fake in tests. An error is the complete message
/// ("<step>: <error>").
pub trait InitSys {
    fn apply(&mut self, step: &InitStep<'_>) -> Result<(), String>;
}

/// Run `plan` in order, stopping at the first failure. A live `Exec` does not return; a fake
/// one lets this return `Ok`.
pub fn execute(plan: &[InitStep<'_>], sys: &mut impl InitSys) -> Result<(), String> {
    plan.iter().try_for_each(|step| sys.apply(step))
}

/// Run the child and never return: `execve` on success, `_exit` after reporting a failure.
pub fn run(
    spec: &StartSpec,
    programs: &[BpfProgram],
    volume_fds: &[BorrowedFd<'_>],
    release: OwnedFd,
    err: OwnedFd,
) -> ! {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut live = LiveInit {
            programs,
            volume_fds,
            release: Some(release),
        };
        execute(&plan(spec), &mut live)
    }));
    let msg = match outcome {
        Ok(Err(msg)) => msg,
        Ok(Ok(())) => "the sandbox init ended without exec".to_string(),
        Err(_) => "panic in the sandbox init before exec".to_string(),
    };
    write_all(err.as_fd(), msg.as_bytes());
    // SAFETY: _exit is always safe; it skips atexit handlers that belong to the launcher.
    unsafe { libc::_exit(126) }
}

/// Write all of `buf`, giving up quietly on an error (the reader reports a missing message).
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) {
    while !buf.is_empty() {
        match nix::unistd::write(fd, buf) {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// "<what>: <error>".
fn failed(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> String {
    move |e| format!("{what}: {}", io::Error::from(e))
}

/// The real system calls.
pub struct LiveInit<'a> {
    programs: &'a [BpfProgram],
    /// The launcher's idmapped volume copies, by index.
    volume_fds: &'a [BorrowedFd<'a>],
    /// Read end of the release pipe, until [`InitStep::AwaitRelease`] has consumed it.
    release: Option<OwnedFd>,
}

impl InitSys for LiveInit<'_> {
    fn apply(&mut self, step: &InitStep<'_>) -> Result<(), String> {
        match step {
            InitStep::AwaitRelease => {
                let release = self.release.take().ok_or("wait for release: no pipe")?;
                let mut b = [0u8; 1];
                let n = loop {
                    match nix::unistd::read(&release, &mut b) {
                        Err(Errno::EINTR) => continue,
                        r => break r,
                    }
                };
                if n != Ok(1) {
                    return Err("wait for release: the launcher went away".into());
                }
                Ok(())
            }
            InitStep::NewSession => nix::unistd::setsid().map(drop).map_err(failed("setsid")),
            InitStep::BecomeRoot => {
                nix::unistd::setgroups(&[]).map_err(failed("setgroups"))?;
                let g = Gid::from_raw(0);
                nix::unistd::setresgid(g, g, g).map_err(failed("setresgid(0)"))?;
                let u = Uid::from_raw(0);
                nix::unistd::setresuid(u, u, u).map_err(failed("setresuid(0)"))
            }
            InitStep::NewCgroupNamespace => nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
                .map_err(failed("unshare(CLONE_NEWCGROUP)")),
            InitStep::Umask(mask) => {
                nix::sys::stat::umask(Mode::from_bits_truncate(*mask));
                Ok(())
            }
            InitStep::Mounts(steps) => {
                let mut mounts = RealMounts {
                    volume_fds: self.volume_fds,
                };
                mountplan::apply(steps, &mut mounts).map_err(|e| e.to_string())
            }
            InitStep::Hostname(name) => {
                nix::unistd::sethostname(name).map_err(failed("sethostname"))
            }
            InitStep::LoopbackUp => {
                bulkhead_host::netif::loopback_up().map_err(|e| format!("{e}: {}", e.source))
            }
            InitStep::Stdio => stdio(),
            InitStep::Chdir(dir) => {
                nix::unistd::chdir(*dir).map_err(failed(format_args!("chdir {dir}")))
            }
            InitStep::CloseInheritedOnExec => {
                // SAFETY: close_range has no pointer arguments, and CLOSE_RANGE_CLOEXEC only
                // marks descriptors (nix has no wrapper for it).
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_close_range,
                        3u32,
                        u32::MAX,
                        libc::CLOSE_RANGE_CLOEXEC,
                    )
                };
                Errno::result(r).map(drop).map_err(failed("close_range"))
            }
            InitStep::ResetSignals => reset_signals(),
            InitStep::NprocLimit(n) => {
                nix::sys::resource::setrlimit(Resource::RLIMIT_NPROC, *n, *n)
                    .map_err(failed("setrlimit(RLIMIT_NPROC)"))
            }
            InitStep::Landlock => confine::apply_landlock().map(drop),
            InitStep::Seccomp => {
                seccomp::install(self.programs).map_err(|e| format!("install seccomp filter: {e}"))
            }
            InitStep::LimitCapabilities => {
                confine::limit_capabilities(confine::DOCKER_DEFAULT_CAPS)
            }
            InitStep::Exec { argv, env } => exec(argv, env),
        }
    }
}

fn exec(argv: &[String], env: &[String]) -> Result<(), String> {
    let cstrings = |list: &[String], what: &str| {
        list.iter()
            .map(|a| CString::new(a.as_str()).map_err(|_| format!("{what} contains NUL: {a:?}")))
            .collect::<Result<Vec<_>, _>>()
    };
    let args = cstrings(argv, "argv")?;
    let envp = cstrings(env, "env")?;
    let Some(prog) = args.first() else {
        return Err("empty argv".into());
    };
    let e = match nix::unistd::execve(prog, &args, &envp) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    Err(failed(format_args!("execve {}", argv[0]))(e))
}

/// stdin from /dev/null, stdout and stderr appended to the agent log in the socket directory.
fn stdio() -> Result<(), String> {
    let null = fs::File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))?;
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(AGENT_LOG)
        .map_err(|e| format!("open {AGENT_LOG}: {e}"))?;
    nix::unistd::dup2_stdin(&null).map_err(failed("dup2 stdio"))?;
    nix::unistd::dup2_stdout(&log).map_err(failed("dup2 stdio"))?;
    nix::unistd::dup2_stderr(&log).map_err(failed("dup2 stdio"))
}

/// `struct sigaction` as the kernel's `rt_sigaction` takes it on x86_64.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The launcher is a Rust program (SIGPIPE ignored) started by a server that may ignore or
/// block signals: give the agent default dispositions and an empty mask. The raw syscall also
/// reaches the two real-time signals glibc reserves for itself, which `signal()` (and `nix`,
/// whose signals are libc's) refuses.
fn reset_signals() -> Result<(), String> {
    let dfl = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: a valid kernel sigaction (SIG_DFL) and the kernel's 8-byte sigset size.
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &dfl as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
        Errno::result(r).map_err(failed(format_args!("reset signal {sig}")))?;
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(failed("sigprocmask"))
}

/// `openat(dir, path, O_PATH | O_DIRECTORY | O_NOFOLLOW)`.
fn open_path_dir(dir: impl AsFd, path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(nix::fcntl::openat(dir, path, flags, Mode::empty())?)
}

/// The real [`MountSys`].
struct RealMounts<'a> {
    /// The launcher's idmapped volume copies, by index.
    volume_fds: &'a [BorrowedFd<'a>],
}

impl MountSys for RealMounts<'_> {
    fn attach_volume(&mut self, index: usize, target: &Path) -> io::Result<()> {
        let tree = *self.volume_fds.get(index).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no such prepared volume")
        })?;
        // Walk from the (new) root one component at a time: create what is missing, refuse
        // a symlink or a non-directory anywhere (O_NOFOLLOW), so the volume lands exactly at
        // the asked path inside the sandbox's root.
        let mut cur = open_path_dir(AT_FDCWD, Path::new("/"))?;
        for comp in target.components() {
            let std::path::Component::Normal(name) = comp else {
                continue;
            };
            match nix::sys::stat::mkdirat(&cur, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            cur = open_path_dir(&cur, Path::new(name)).map_err(|e| {
                if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) {
                    io::Error::new(
                        e.kind(),
                        format!("{} is a symlink or not a directory", name.to_string_lossy()),
                    )
                } else {
                    e
                }
            })?;
        }
        sys::move_mount_onto_fd(tree, cur.as_fd())
    }

    fn exists(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok()
    }

    fn is_dir(&self, path: &Path) -> bool {
        fs::metadata(path).is_ok_and(|m| m.is_dir())
    }

    fn mkdir_all(&mut self, path: &Path, mode: u32) -> io::Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)?;
        // DirBuilder applies the mode only to the last component; make sure it is exact.
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
    }

    fn touch(&mut self, path: &Path) -> io::Result<()> {
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(path)?;
        Ok(())
    }

    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn mount(
        &mut self,
        source: &str,
        target: &Path,
        fstype: Option<&str>,
        flags: u64,
        data: &str,
    ) -> io::Result<()> {
        let flags = MsFlags::from_bits_retain(flags as libc::c_ulong);
        let data = (!data.is_empty()).then_some(data);
        Ok(nix::mount::mount(
            Some(source),
            target,
            fstype,
            flags,
            data,
        )?)
    }

    fn set_readonly(&mut self, target: &Path, recursive: bool) -> io::Result<()> {
        // mount_setattr changes only the bits asked for, so locked flags inherited from the
        // host (nosuid, nodev) never make this fail the way an MS_REMOUNT would.
        let at = if recursive { libc::AT_RECURSIVE } else { 0 };
        sys::mount_setattr(libc::AT_FDCWD, target, at, sys::MOUNT_ATTR_RDONLY, None)
    }

    fn is_symlink(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
    }

    fn unlink(&mut self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn pivot_root(&mut self, new_root: &Path) -> io::Result<()> {
        // The classic pivot_root(".", "."), then the old root, stacked on "." now, detached.
        nix::unistd::chdir(new_root)?;
        nix::unistd::pivot_root(".", ".")?;
        nix::mount::umount2(".", MntFlags::MNT_DETACH)?;
        nix::unistd::chdir("/")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nproc_limit: Option<u64>) -> StartSpec {
        StartSpec {
            uid_base: 1_000_000,
            id_count: 65536,
            lower: "/j/l/0-abc".into(),
            upper: "/j/s/0/upper".into(),
            work: "/j/s/0/work".into(),
            merged: "/j/s/0/merged".into(),
            sock_dir: "/j/s/0/sock".into(),
            agent_binary: "/opt/agent".into(),
            argv: vec![mountplan::AGENT_PATH.into(), "--listen".into()],
            env: vec!["PATH=/bin".into()],
            hostname: "sandbox".into(),
            cgroup_procs: vec![],
            shm_size_mb: 32,
            volatile_upper: true,
            nproc_limit,
            ca_bundle: None,
            volumes: Vec::new(),
        }
    }

    fn name(step: &InitStep<'_>) -> String {
        match step {
            InitStep::Umask(m) => format!("umask {m:o}"),
            InitStep::Mounts(steps) => format!("mounts ({} steps)", steps.len()),
            InitStep::Hostname(h) => format!("hostname {h}"),
            InitStep::Chdir(d) => format!("chdir {d}"),
            InitStep::NprocLimit(n) => format!("nproc {n}"),
            InitStep::Exec { argv, env } => format!("exec {} {}", argv.join(" "), env.join(" ")),
            other => format!("{other:?}"),
        }
    }

    /// Records what it is asked to do; fails at the first step whose name starts with
    /// `fail_at`.
    #[derive(Default)]
    struct Recorder {
        done: Vec<String>,
        fail_at: Option<&'static str>,
    }

    impl InitSys for Recorder {
        fn apply(&mut self, step: &InitStep<'_>) -> Result<(), String> {
            let n = name(step);
            if self.fail_at.is_some_and(|f| n.starts_with(f)) {
                return Err(format!("{n}: refused"));
            }
            self.done.push(n);
            Ok(())
        }
    }

    #[test]
    fn the_init_runs_its_steps_in_order() {
        let s = spec(Some(512));
        let mut r = Recorder::default();
        execute(&plan(&s), &mut r).unwrap();
        let mounts = format!("mounts ({} steps)", mountplan::plan(&s).len());
        assert_eq!(
            r.done,
            [
                "AwaitRelease",
                "NewSession",
                "BecomeRoot",
                // After the release: the parent has moved us into the sandbox cgroup.
                "NewCgroupNamespace",
                "umask 0",
                &mounts,
                "hostname sandbox",
                "LoopbackUp",
                // After the pivot: the agent log and "/" are the sandbox's.
                "Stdio",
                "chdir /",
                "CloseInheritedOnExec",
                "ResetSignals",
                "nproc 512",
                "umask 22",
                // Confinement last, while the init still holds CAP_SYS_ADMIN in its namespace.
                "Landlock",
                "Seccomp",
                "LimitCapabilities",
                "exec /run/bulkhead/agent --listen PATH=/bin",
            ]
        );
    }

    #[test]
    fn without_a_process_limit_there_is_no_rlimit_step() {
        let s = spec(None);
        let steps = plan(&s);
        assert!(!steps.iter().any(|s| matches!(s, InitStep::NprocLimit(_))));
        assert!(matches!(steps.last(), Some(InitStep::Exec { .. })));
    }

    #[test]
    fn a_failed_step_stops_the_init_and_is_named() {
        let s = spec(None);
        let mut r = Recorder {
            fail_at: Some("hostname"),
            ..Recorder::default()
        };
        let e = execute(&plan(&s), &mut r).unwrap_err();
        assert_eq!(e, "hostname sandbox: refused");
        assert!(
            r.done.last().is_some_and(|d| d.starts_with("mounts")),
            "{:?}",
            r.done
        );
    }
}
