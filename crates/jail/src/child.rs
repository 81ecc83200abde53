//! The sandbox init before `execve`: runs in the launcher's clone child, inside the fresh
//! namespaces, single-threaded. Every failure is returned as "<step>: <error>" and travels to
//! the launcher parent over the error pipe.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use seccompiler::BpfProgram;

use crate::confine;
use crate::mountplan::{self, AGENT_LOG, MountSys};
use crate::seccomp;
use crate::spec::StartSpec;
use crate::sys::{self, cpath};

/// `openat(dir, path, O_PATH | O_DIRECTORY | O_NOFOLLOW)`.
fn open_path_dir(dir: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid C string; the kernel returns a new descriptor or -1.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn check(ret: libc::c_int, what: &str) -> Result<(), String> {
    if ret < 0 { Err(os_err(what)) } else { Ok(()) }
}

/// Run the child and never return: `execve` on success, `_exit` after reporting a failure.
pub fn run(
    spec: &StartSpec,
    programs: &[BpfProgram],
    volume_fds: &[RawFd],
    release_fd: RawFd,
    err_fd: RawFd,
) -> ! {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        setup_and_exec(spec, programs, volume_fds, release_fd)
    }));
    let msg = match outcome {
        Ok(Err(msg)) => msg,
        Ok(Ok(never)) => match never {},
        Err(_) => "panic in the sandbox init before exec".to_string(),
    };
    write_all(err_fd, msg.as_bytes());
    // SAFETY: _exit is always safe; it skips atexit handlers that belong to the launcher.
    unsafe { libc::_exit(126) }
}

pub fn write_all(fd: RawFd, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n <= 0 {
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        buf = &buf[n as usize..];
    }
}

enum Never {}

fn setup_and_exec(
    spec: &StartSpec,
    programs: &[BpfProgram],
    volume_fds: &[RawFd],
    release_fd: RawFd,
) -> Result<Never, String> {
    // Wait until the parent has written our uid/gid maps and cgroup membership.
    let mut b = [0u8; 1];
    let n = loop {
        // SAFETY: reading one byte into a local buffer.
        let n = unsafe { libc::read(release_fd, b.as_mut_ptr().cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    if n != 1 {
        return Err("wait for release: the launcher went away".into());
    }
    // SAFETY: closing our copy of the release pipe.
    unsafe { libc::close(release_fd) };

    // A session of its own (CRIU needs the init to be a session leader inside the namespace).
    // SAFETY: plain syscalls with no pointers.
    check(unsafe { libc::setsid() }, "setsid")?;
    // SAFETY: setgroups with an empty list.
    check(unsafe { libc::setgroups(0, std::ptr::null()) }, "setgroups")?;
    // SAFETY: plain syscalls.
    check(unsafe { libc::setresgid(0, 0, 0) }, "setresgid(0)")?;
    // SAFETY: plain syscalls.
    check(unsafe { libc::setresuid(0, 0, 0) }, "setresuid(0)")?;
    // The cgroup namespace is created now, after the parent moved us into the sandbox cgroup,
    // so its root is that cgroup (a namespace made by clone would be rooted at the launcher's).
    // SAFETY: plain syscall.
    let r = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    check(r, "unshare(CLONE_NEWCGROUP)")?;
    // Mount points and tmpfs roots get exactly the modes we ask for; the agent gets 022 below.
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0) };

    let mut mounts = RealMounts { volume_fds };
    mountplan::apply(&mountplan::plan(spec), &mut mounts).map_err(|e| e.to_string())?;

    let host = spec.hostname.as_bytes();
    // SAFETY: pointer and length describe `host`.
    let r = unsafe { libc::sethostname(host.as_ptr().cast(), host.len()) };
    check(r, "sethostname")?;
    loopback_up()?;
    stdio()?;
    // SAFETY: a static C string.
    let r = unsafe { libc::chdir(c"/".as_ptr()) };
    check(r, "chdir /")?;
    // Nothing of the launcher may leak into the sandbox: every inherited fd beyond stdio
    // (including the error pipe, which must stay open until exec) closes on exec.
    // SAFETY: plain syscall.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r < 0 {
        return Err(os_err("close_range"));
    }
    reset_signals()?;
    if let Some(n) = spec.nproc_limit {
        let lim = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: `lim` is a valid rlimit for the duration of the call.
        let r = unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) };
        check(r, "setrlimit(RLIMIT_NPROC)")?;
    }
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o022) };

    // Landlock and seccomp go on while the init still holds CAP_SYS_ADMIN in the sandbox's user
    // namespace, which the kernel accepts in place of `no_new_privs`. Without that bit, set-uid
    // programs work inside (`sudo`, as on E2B): they reach the sandbox's own root with the
    // capability set below, never anything outside the user namespace, and the filters stay.
    confine::apply_landlock()?;
    seccomp::install(programs).map_err(|e| format!("install seccomp filter: {e}"))?;
    confine::limit_capabilities(confine::DOCKER_DEFAULT_CAPS)?;

    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_str()).map_err(|_| format!("argv contains NUL: {a:?}")))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> = spec
        .env
        .iter()
        .map(|a| CString::new(a.as_str()).map_err(|_| format!("env contains NUL: {a:?}")))
        .collect::<Result<_, _>>()?;
    let Some(prog) = argv.first() else {
        return Err("empty argv".into());
    };
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: NULL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(prog.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
    Err(os_err(&format!("execve {}", spec.argv[0])))
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
    use std::os::fd::AsRawFd;
    for (src, dst) in [
        (null.as_raw_fd(), 0),
        (log.as_raw_fd(), 1),
        (log.as_raw_fd(), 2),
    ] {
        // SAFETY: both descriptors are valid; dup2 replaces the launcher's stdio.
        check(unsafe { libc::dup2(src, dst) }, "dup2 stdio")?;
    }
    Ok(())
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
/// reaches the two real-time signals glibc reserves for itself, which `signal()` refuses.
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
        if r < 0 {
            return Err(os_err(&format!("reset signal {sig}")));
        }
    }
    let empty: u64 = 0;
    // SAFETY: an empty 8-byte kernel sigset, null old set.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
    if r < 0 {
        return Err(os_err("sigprocmask"));
    }
    Ok(())
}

fn loopback_up() -> Result<(), String> {
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_err("socket for lo"));
    }
    // SAFETY: an all-zero ifreq is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq for these ioctls.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) };
    let res = if r < 0 {
        Err(os_err("SIOCGIFFLAGS lo"))
    } else {
        // SAFETY: the kernel filled the flags member of the union.
        unsafe {
            ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        // SAFETY: as above.
        if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) } < 0 {
            Err(os_err("SIOCSIFFLAGS lo up"))
        } else {
            Ok(())
        }
    };
    // SAFETY: closing our own socket.
    unsafe { libc::close(fd) };
    res
}

/// The real [`MountSys`].
struct RealMounts<'a> {
    /// The launcher's idmapped volume copies, by index.
    volume_fds: &'a [RawFd],
}

impl MountSys for RealMounts<'_> {
    fn attach_volume(&mut self, index: usize, target: &Path) -> io::Result<()> {
        let fd = *self.volume_fds.get(index).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no such prepared volume")
        })?;
        // Walk from the (new) root one component at a time: create what is missing, refuse
        // a symlink or a non-directory anywhere (O_NOFOLLOW), so the volume lands exactly at
        // the asked path inside the sandbox's root.
        let mut cur = open_path_dir(libc::AT_FDCWD, Path::new("/"))?;
        for comp in target.components() {
            let std::path::Component::Normal(name) = comp else {
                continue;
            };
            let c = cpath(Path::new(name))?;
            // SAFETY: `cur` is a live descriptor and `c` a valid C string.
            let r = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o755) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
            cur = open_path_dir(cur.as_raw_fd(), Path::new(name)).map_err(|e| {
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
        // SAFETY: the launcher keeps this descriptor open for the child's whole setup.
        let tree = unsafe { BorrowedFd::borrow_raw(fd) };
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
        let src = CString::new(source)?;
        let tgt = cpath(target)?;
        let fst = fstype.map(CString::new).transpose()?;
        let dat = CString::new(data)?;
        // SAFETY: all pointers are valid C strings (or null) for the duration of the call.
        let r = unsafe {
            libc::mount(
                src.as_ptr(),
                tgt.as_ptr(),
                fst.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
                flags as libc::c_ulong,
                if data.is_empty() {
                    std::ptr::null()
                } else {
                    dat.as_ptr().cast()
                },
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
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
        let root = cpath(new_root)?;
        let dot = c".";
        // SAFETY: valid C strings; the classic pivot_root(".", ".") + detach sequence.
        unsafe {
            if libc::chdir(root.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::umount2(dot.as_ptr(), libc::MNT_DETACH) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::chdir(c"/".as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
