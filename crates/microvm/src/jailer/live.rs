//! [`LiveSys`]: the jail's real system calls, run between `fork` and `exec`.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

use super::{Forked, JailSys, Step, check};

/// The real system calls; only async-signal-safe ones, on memory prepared before `fork`.
pub struct LiveSys;

/// Which step failed, on QEMU's log (stderr), since the spawner only sees an errno.
fn explain(what: &[u8], path: &CStr) {
    for part in [
        b"bulkhead jailer: ".as_slice(),
        what,
        path.to_bytes(),
        b"\n",
    ] {
        // SAFETY: writing a valid buffer to fd 2; a failed write is ignored.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
}

const NO_PATH: &CStr = c"";

impl JailSys for LiveSys {
    fn setsid(&mut self) -> io::Result<()> {
        // SAFETY: no arguments.
        check(unsafe { libc::setsid() })
    }

    fn join_cgroup(&mut self, procs: &CStr) -> io::Result<()> {
        // SAFETY: a valid C string; "0" means the calling process.
        let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            explain(b"open ", procs);
            return Err(e);
        }
        // SAFETY: fd is ours, the buffer valid.
        let r = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        let e = io::Error::last_os_error();
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        if r < 0 {
            explain(b"join ", procs);
            return Err(e);
        }
        Ok(())
    }

    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()> {
        // SAFETY: plain system call.
        check(unsafe { libc::unshare(flags) }).inspect_err(|_| explain(b"unshare", NO_PATH))
    }

    fn fork(&mut self) -> io::Result<Forked> {
        // SAFETY: this process is already a single-threaded fork child.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => Ok(Forked::Child),
            child => Ok(Forked::Parent { child }),
        }
    }

    fn report_and_exit(&mut self, fd: RawFd, child: libc::pid_t) {
        let bytes = child.to_ne_bytes();
        // SAFETY: writing a valid buffer, then leaving without running any Rust cleanup.
        unsafe {
            libc::write(fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0);
        }
    }

    fn mount(&mut self, step: &Step) -> io::Result<()> {
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: valid C strings prepared before fork; the classic pivot_root(".", ".")
        // sequence.
        let r = unsafe {
            match step {
                Step::MakePrivate => libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ),
                Step::Tmpfs { target } => libc::mount(
                    c"tmpfs".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0755,size=64k,nr_inodes=4096".as_ptr().cast(),
                ),
                Step::Mkdir { path } => libc::mkdir(path.as_ptr(), 0o755),
                Step::Touch { path } => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o444,
                    );
                    if fd >= 0 { libc::close(fd) } else { fd }
                }
                Step::Bind {
                    source,
                    target,
                    writable,
                    exec,
                    dev,
                } => {
                    let r = libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    );
                    if r < 0 {
                        r
                    } else {
                        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID;
                        if !writable {
                            flags |= libc::MS_RDONLY;
                        }
                        if !exec {
                            flags |= libc::MS_NOEXEC;
                        }
                        if !dev {
                            flags |= libc::MS_NODEV;
                        }
                        libc::mount(null, target.as_ptr(), null, flags, std::ptr::null())
                    }
                }
                Step::Proc { target } => {
                    let flags =
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                    let proc = c"proc".as_ptr();
                    let r = libc::mount(
                        proc,
                        target.as_ptr(),
                        proc,
                        flags,
                        c"subset=pid".as_ptr().cast(),
                    );
                    // Kernels before 5.8 have no `subset=`: the whole procfs, still only
                    // showing QEMU's own pid namespace.
                    if r < 0 && *libc::__errno_location() == libc::EINVAL {
                        libc::mount(proc, target.as_ptr(), proc, flags, std::ptr::null())
                    } else {
                        r
                    }
                }
                Step::PivotRoot { new_root } => {
                    let dot = c".".as_ptr();
                    if libc::chdir(new_root.as_ptr()) < 0
                        || libc::syscall(libc::SYS_pivot_root, dot, dot) < 0
                        || libc::umount2(dot, libc::MNT_DETACH) < 0
                    {
                        -1
                    } else {
                        libc::chdir(c"/".as_ptr())
                    }
                }
                Step::RootReadOnly => libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    std::ptr::null(),
                ),
            }
        };
        check(r).inspect_err(|_| {
            let (what, path): (&[u8], &CStr) = match step {
                Step::MakePrivate => (b"make / private", NO_PATH),
                Step::Tmpfs { target } => (b"mount the root tmpfs on ", target),
                Step::Mkdir { path } => (b"mkdir ", path),
                Step::Touch { path } => (b"create ", path),
                Step::Bind { source, .. } => (b"bind ", source),
                Step::Proc { target } => (b"mount procfs on ", target),
                Step::PivotRoot { new_root } => (b"pivot_root into ", new_root),
                Step::RootReadOnly => (b"make the root read-only", NO_PATH),
            };
            explain(what, path);
        })
    }

    fn set_ids(&mut self, uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
        // SAFETY: plain system calls; the group list outlives the call.
        unsafe {
            check(libc::setgroups(groups.len(), groups.as_ptr()))?;
            check(libc::setresgid(gid, gid, gid))?;
            check(libc::setresuid(uid, uid, uid))
        }
    }

    fn no_new_privs(&mut self) -> io::Result<()> {
        // SAFETY: plain system call.
        check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
    }
}
