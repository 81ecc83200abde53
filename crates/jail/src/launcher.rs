//! The launcher: a single-threaded helper process that does every privileged step that needs
//! `clone` (the server itself is multi-threaded and never clones). The driver keeps one
//! long-lived launcher, the zygote (`--zygote`, see [`crate::zygote`]), which forks a copy of
//! itself per request: the copy behaves exactly like a launcher run for one request, without
//! the cost of an `execve` of the server binary per sandbox. Run without `--zygote`, it
//! answers one request and exits (the driver's fallback when no zygote can run).
//!
//! Contract (see [`crate::spec`]): the program given as `JailConfig::launcher` must call
//! [`main`] first thing, before any thread exists (the `bulkhead` binary does this for
//! `bulkhead __jail-launch`). It reads one JSON [`LaunchRequest`] from stdin, writes one JSON
//! [`LaunchReply`] line to stdout and exits: 0 on success, 1 on a reported failure, 2 when the
//! request is unreadable.
//!
//! `start`: `clone` into new user, mount, pid, net, ipc and uts namespaces; the parent writes
//! the uid/gid maps and the cgroup membership, then releases the child through a pipe and waits
//! on a close-on-exec error pipe: EOF without data means `execve` succeeded. The launcher then
//! exits and the sandbox init is re-parented to the server (a child subreaper). There is no
//! parent-death signal: sandboxes outlive server restarts.
//!
//! `idmap`: create the idmapped read-only view of a template for one slot (a throwaway user
//! namespace provides the mapping).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use seccompiler::BpfProgram;

use crate::child;
use crate::seccomp;
use crate::spec::{IdmapSpec, LaunchReply, LaunchRequest, StartSpec};
use crate::sys;

/// Entry point of the launcher process. Never returns.
pub fn main() -> ! {
    if std::env::args_os().any(|a| a == crate::zygote::ZYGOTE_FLAG) {
        crate::zygote::serve(answer);
    }
    let mut input = Vec::new();
    match std::io::stdin().read_to_end(&mut input) {
        Ok(_) => answer(&input, None),
        Err(e) => reply_and_exit(
            LaunchReply::Failed {
                error: format!("cannot read the launch request: {e}"),
            },
            2,
        ),
    }
}

/// Handle one request and write its reply to stdout; never returns. `programs`: the seccomp
/// policy compiled in advance (the zygote compiles it once).
fn answer(input: &[u8], programs: Option<&[BpfProgram]>) -> ! {
    let req = serde_json::from_slice::<LaunchRequest>(input)
        .map_err(|e| format!("unreadable launch request: {e}"));
    let (reply, code) = match req {
        Err(e) => (LaunchReply::Failed { error: e }, 2),
        Ok(LaunchRequest::Start(spec)) => finish(start(&spec, programs)),
        Ok(LaunchRequest::Idmap(spec)) => {
            finish(idmap(&spec).map(|()| LaunchReply::Done { ok: true }))
        }
    };
    reply_and_exit(reply, code)
}

fn reply_and_exit(reply: LaunchReply, code: i32) -> ! {
    let mut out = std::io::stdout().lock();
    let line = serde_json::to_string(&reply).unwrap_or_else(|_| r#"{"error":"reply"}"#.into());
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    std::process::exit(code)
}

fn finish(r: Result<LaunchReply, String>) -> (LaunchReply, i32) {
    match r {
        Ok(reply) => (reply, 0),
        Err(error) => (LaunchReply::Failed { error }, 1),
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `clone` used like `fork` (no new stack): safe here because the launcher is single-threaded.
fn clone_process(flags: libc::c_int) -> Result<libc::pid_t, String> {
    let flags = flags as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: a fork-like clone (null stack, no tid pointers) in a single-threaded process.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(format!("clone: {}", std::io::Error::last_os_error()));
    }
    Ok(pid as libc::pid_t)
}

fn write_maps(pid: libc::pid_t, base: u32, count: u32) -> Result<(), String> {
    let line = format!("0 {base} {count}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &line).map_err(|e| format!("write {path}: {e}"))?;
    }
    Ok(())
}

fn kill_and_reap(pid: libc::pid_t) {
    // SAFETY: signalling and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

fn start(spec: &StartSpec, compiled: Option<&[BpfProgram]>) -> Result<LaunchReply, String> {
    // Compile the policy before any namespace exists: a broken policy fails cheaply.
    let owned;
    let programs = match compiled {
        Some(p) => p,
        None => {
            owned = seccomp::builtin_programs().map_err(|e| e.to_string())?;
            &owned
        }
    };
    // Idmapped copies of the volumes, made here with host privileges and inherited by the
    // child through the clone (each is close-on-exec, so the agent never holds one).
    let volumes = volume_mounts(spec)?;
    let volume_fds: Vec<BorrowedFd<'_>> = volumes.iter().map(|f| f.as_fd()).collect();
    let (release_r, release_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    let pid = clone_process(flags)?;
    if pid == 0 {
        drop(release_w);
        drop(err_r);
        child::run(spec, programs, &volume_fds, release_r, err_w);
    }
    drop(volumes);
    drop(release_r);
    drop(err_w);

    let prepared = (|| {
        write_maps(pid, spec.uid_base, spec.id_count)?;
        for procs in &spec.cgroup_procs {
            std::fs::write(procs, pid.to_string())
                .map_err(|e| format!("add the sandbox to {}: {e}", procs.display()))?;
        }
        sys::proc_start_time(pid).map_err(|e| format!("read start time of {pid}: {e}"))
    })();
    let start_time = match prepared {
        Ok(t) => t,
        Err(e) => {
            kill_and_reap(pid);
            return Err(e);
        }
    };

    let mut rel = std::fs::File::from(release_w);
    if let Err(e) = rel.write_all(b"1") {
        kill_and_reap(pid);
        return Err(format!("release the sandbox init: {e}"));
    }
    drop(rel);

    let mut msg = Vec::new();
    let _ = std::fs::File::from(err_r).read_to_end(&mut msg);
    if !msg.is_empty() {
        kill_and_reap(pid);
        return Err(String::from_utf8_lossy(&msg).into_owned());
    }
    // EOF without a message: execve succeeded. The agent may already have exited again; it is
    // deliberately not reaped here, so its status reaches the server (its new parent) with
    // the agent's own output.
    Ok(LaunchReply::Started { pid, start_time })
}

/// Detached, idmapped, read-write `nosuid,nodev` copies of the spec's volumes, in order.
fn volume_mounts(spec: &StartSpec) -> Result<Vec<OwnedFd>, String> {
    if spec.volumes.is_empty() {
        return Ok(Vec::new());
    }
    with_userns(spec.uid_base, spec.id_count, |ns| {
        spec.volumes
            .iter()
            .map(|v| {
                // Not recursive: only the volume's own filesystem, nothing mounted below it.
                let tree = sys::open_tree_clone(&v.source, false)
                    .map_err(|e| format!("open_tree volume {}: {e}", v.source.display()))?;
                sys::mount_setattr(
                    tree.as_raw_fd(),
                    Path::new(""),
                    libc::AT_EMPTY_PATH,
                    sys::MOUNT_ATTR_IDMAP | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                    Some(ns),
                )
                .map_err(|e| format!("idmap volume {}: {e}", v.source.display()))?;
                Ok(tree)
            })
            .collect()
    })
}

/// Run `f` with a throwaway user namespace mapping `0..count` to `base..` (for idmapping).
fn with_userns<T>(
    base: u32,
    count: u32,
    f: impl FnOnce(RawFd) -> Result<T, String>,
) -> Result<T, String> {
    let (hold_r, hold_w) = pipe()?;
    let pid = clone_process(libc::CLONE_NEWUSER)?;
    if pid == 0 {
        // The throwaway namespace only has to exist until the parent has opened it.
        drop(hold_w);
        let mut b = [0u8; 1];
        // SAFETY: blocking read into a local buffer; returns 0 when the parent closes.
        unsafe { libc::read(hold_r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        // SAFETY: leaving the throwaway child.
        unsafe { libc::_exit(0) };
    }
    drop(hold_r);
    let result = (|| {
        write_maps(pid, base, count)?;
        let ns_path = format!("/proc/{pid}/ns/user");
        let ns = std::fs::File::open(&ns_path).map_err(|e| format!("open {ns_path}: {e}"))?;
        f(ns.as_raw_fd())
    })();
    drop(hold_w);
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    result
}

fn idmap(spec: &IdmapSpec) -> Result<(), String> {
    std::fs::create_dir_all(&spec.target)
        .map_err(|e| format!("mkdir {}: {e}", spec.target.display()))?;
    with_userns(spec.uid_base, spec.id_count, |ns| {
        make_idmapped(&spec.source, &spec.target, ns, spec.volume)
    })
}

fn make_idmapped(source: &Path, target: &Path, userns: RawFd, volume: bool) -> Result<(), String> {
    let tree = sys::open_tree_clone(source, !volume)
        .map_err(|e| format!("open_tree {}: {e}", source.display()))?;
    // nosuid/nodev: the view is reachable on the host too, and its set-uid files appear owned
    // by the slot's uid; nobody on the host should be able to become that uid through it.
    let mut attrs = sys::MOUNT_ATTR_IDMAP | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    if !volume {
        attrs |= sys::MOUNT_ATTR_RDONLY;
    }
    let recursive = if volume { 0 } else { libc::AT_RECURSIVE };
    sys::mount_setattr(
        tree.as_raw_fd(),
        Path::new(""),
        libc::AT_EMPTY_PATH | recursive,
        attrs,
        Some(userns),
    )
    .map_err(|e| {
        format!(
            "mount_setattr(MOUNT_ATTR_IDMAP) on {}: {e}",
            source.display()
        )
    })?;
    sys::move_mount_to(tree.as_fd(), target)
        .map_err(|e| format!("move_mount to {}: {e}", target.display()))
}
