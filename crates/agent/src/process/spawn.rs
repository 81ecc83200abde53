//! Spawning a process the way envd does: its own session (and so process group), the
//! credentials of the requesting user, a clean environment, and pipes or a PTY for stdio.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use super::io::{ProcessInput, PtyMaster};
use crate::users::Identity;

/// What to spawn.
pub struct SpawnSpec {
    /// Program (looked up in the child's `PATH` when it has no `/`).
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Complete environment.
    pub env: Vec<(String, String)>,
    /// Working directory (entered after switching to the user).
    pub cwd: PathBuf,
    /// Credentials.
    pub identity: Identity,
    /// Whether stdin is a pipe (otherwise `/dev/null`); ignored with a PTY.
    pub stdin_pipe: bool,
    /// Terminal size (cols, rows) when the process runs in a PTY.
    pub pty: Option<(u16, u16)>,
}

/// Output sources of a spawned process.
pub enum Output {
    /// Separate stdout and stderr pipes.
    Pipes(ChildStdout, ChildStderr),
    /// The PTY master (stdout and stderr are merged by the terminal).
    Pty(Arc<PtyMaster>),
}

/// A spawned process.
pub struct Spawned {
    /// The child (for waiting).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Where its input goes.
    pub input: ProcessInput,
    /// Where its output comes from.
    pub output: Output,
}

/// Errors spawning.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An argument, variable or path contains a NUL byte.
    #[error(
        "The command, its arguments, environment or working directory contain a NUL byte (or a variable name contains `=`)"
    )]
    Nul,
    /// Opening the PTY failed.
    #[error("Could not open a pseudo-terminal")]
    Pty(#[source] io::Error),
    /// The program does not exist.
    #[error(
        "Could not start {program:?}: no such file or directory (check the command and the working directory {cwd:?})"
    )]
    NotFound {
        /// Program.
        program: String,
        /// Working directory.
        cwd: PathBuf,
    },
    /// The user may not run the program or enter the directory.
    #[error(
        "Could not start {program:?} as uid {uid}: permission denied (the user needs execute permission on the program and access to {cwd:?})"
    )]
    PermissionDenied {
        /// Program.
        program: String,
        /// Working directory.
        cwd: PathBuf,
        /// User id.
        uid: u32,
    },
    /// The kernel refused the command line: a name or path over its limits
    /// (`ENAMETOOLONG`), or arguments and environment too large (`E2BIG`).
    #[error(
        "Could not start the command: the program path, an argument or the environment is too long"
    )]
    TooLong {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Another failure.
    #[error("Could not start {program:?}")]
    Other {
        /// Program.
        program: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Spawns the process described by `spec`.
pub fn spawn(spec: SpawnSpec) -> Result<Spawned, SpawnError> {
    let cwd_c = CString::new(spec.cwd.as_os_str().as_bytes()).map_err(|_| SpawnError::Nul)?;
    if spec.program.contains('\0')
        || spec.args.iter().any(|a| a.contains('\0'))
        || spec
            .env
            .iter()
            .any(|(k, v)| k.contains('\0') || v.contains('\0') || k.contains('='))
    {
        return Err(SpawnError::Nul);
    }

    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(false);

    let mut pty_master = None;
    if let Some((cols, rows)) = spec.pty {
        let (master, slave) = PtyMaster::open(cols, rows).map_err(SpawnError::Pty)?;
        let stdio = |fd: &std::os::fd::OwnedFd| -> Result<Stdio, SpawnError> {
            Ok(Stdio::from(fd.try_clone().map_err(SpawnError::Pty)?))
        };
        cmd.stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?);
        pty_master = Some(Arc::new(master));
    } else {
        cmd.stdin(if spec.stdin_pipe {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    }

    let is_pty = pty_master.is_some();
    let switch_user = {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        euid == 0 || spec.identity.uid != euid
    };
    let groups: Vec<libc::gid_t> = spec.identity.groups.clone();
    let (uid, gid) = (spec.identity.uid, spec.identity.gid);
    let cgroup_procs = crate::guest_limits::procs_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // raw system calls on data prepared before the fork (no allocation, no locks). Credentials
    // are switched with raw syscalls; in the single-threaded child this is equivalent to the
    // libc wrappers without their cross-thread broadcast machinery.
    unsafe {
        cmd.pre_exec(move || {
            // In a microVM: into the sandbox's pids cgroup, while still root (the agent stays
            // outside it, so a fork bomb cannot starve it). Not joined: not started.
            if cgroup_procs >= 0 && libc::write(cgroup_procs, b"0".as_ptr().cast(), 1) < 0 {
                return Err(io::Error::last_os_error());
            }
            // New session: the process leads its own group, so signals reach its children too.
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if is_pty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            if switch_user {
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::chdir(cwd_c.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            // Make user processes, not the agent, the OOM killer's first choice (as envd does).
            // Raising the score needs no privilege; failure is harmless (the jail's `/proc` is
            // a read-only mount, so only the microvm guest takes it).
            let fd = libc::open(
                c"/proc/self/oom_score_adj".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                let _ = libc::write(fd, b"100".as_ptr().cast(), 3);
                libc::close(fd);
            }
            Ok(())
        });
    }

    let mut child = cmd.spawn().map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound {
            program: spec.program.clone(),
            cwd: spec.cwd.clone(),
        },
        io::ErrorKind::PermissionDenied => SpawnError::PermissionDenied {
            program: spec.program.clone(),
            cwd: spec.cwd.clone(),
            uid,
        },
        _ if matches!(
            source.raw_os_error(),
            Some(libc::ENAMETOOLONG | libc::E2BIG)
        ) =>
        {
            SpawnError::TooLong { source }
        }
        _ => SpawnError::Other {
            program: spec.program.clone(),
            source,
        },
    })?;
    // Drop our copies of the PTY slave now: the master reports end-of-file only once every
    // slave descriptor is closed.
    drop(cmd);
    let pid = child.id().ok_or_else(|| SpawnError::Other {
        program: spec.program.clone(),
        source: io::Error::other("the process exited before its pid was known"),
    })?;

    let (input, output) = match pty_master {
        Some(master) => (ProcessInput::Pty(Arc::clone(&master)), Output::Pty(master)),
        None => {
            let input = match child.stdin.take() {
                Some(stdin) => ProcessInput::Pipe(tokio::sync::Mutex::new(Some(stdin))),
                None => ProcessInput::None,
            };
            let stdout = child.stdout.take().ok_or_else(|| SpawnError::Other {
                program: spec.program.clone(),
                source: io::Error::other("stdout pipe missing"),
            })?;
            let stderr = child.stderr.take().ok_or_else(|| SpawnError::Other {
                program: spec.program.clone(),
                source: io::Error::other("stderr pipe missing"),
            })?;
            (input, Output::Pipes(stdout, stderr))
        }
    };
    Ok(Spawned {
        child,
        pid,
        input,
        output,
    })
}
