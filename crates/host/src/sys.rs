//! Thin, safe wrappers over the raw syscalls the drivers need and `libc` does not wrap (the new
//! mount API, pidfds), plus small `/proc` parsers. Everything here is usable from the
//! multi-threaded server: nothing forks.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub const OPEN_TREE_CLONE: libc::c_uint = 1;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
pub const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` from `<linux/mount.h>` (libc does not define it).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A path as a C string; paths with an interior NUL cannot name a file.
pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path contains NUL: {}", p.display()),
        )
    })
}

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | flags)`: a detached copy of
/// the mount tree at `path`.
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `mount_setattr` on a path (relative to `dirfd`, or the fd itself with an empty path).
pub fn mount_setattr(
    dirfd: RawFd,
    path: &Path,
    at_flags: libc::c_int,
    attr_set: u64,
    userns_fd: Option<RawFd>,
) -> io::Result<()> {
    let c = cpath(path)?;
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns_fd.map_or(0, |fd| fd as u64),
    };
    // SAFETY: `c` and `attr` outlive the call and `attr`'s size is passed alongside it.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            c.as_ptr(),
            at_flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Attach the detached mount `fd` at `target`.
pub fn move_mount_to(fd: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let c = cpath(target)?;
    let empty = c"";
    // SAFETY: both strings are valid for the call; `fd` is a live descriptor.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// `MOVE_MOUNT_T_EMPTY_PATH`: the target is the descriptor itself.
pub const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// Attach the detached mount `fd` on the directory open as `target` (an `O_PATH` descriptor),
/// so no path is resolved at attach time.
pub fn move_mount_onto_fd(fd: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    let empty = c"";
    // SAFETY: the empty string is valid for the call; both descriptors are live.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Lazily detach the mount at `target`.
pub fn umount_detach(target: &Path) -> io::Result<()> {
    let c = cpath(target)?;
    // SAFETY: `c` is a valid C string for the call.
    cvt(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } as libc::c_long)?;
    Ok(())
}

/// Is `path` the root of a mount? (`statx` `STATX_ATTR_MOUNT_ROOT`; a same-filesystem bind
/// mount has the parent's `st_dev`, so comparing devices is not enough.)
pub fn is_mount_root(path: &Path) -> io::Result<bool> {
    let c = cpath(path)?;
    // SAFETY: an all-zero statx is a valid value for the kernel to fill in.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` and `stx` are valid for the duration of the call.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut stx,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_attributes_mask & bit == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "statx lacks STATX_ATTR_MOUNT_ROOT",
        ));
    }
    Ok(stx.stx_attributes & bit != 0)
}

pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: fresh descriptor from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: a null siginfo is allowed (the kernel fills in SI_USER).
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// How a sandbox init ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    Exited(i32),
    Signaled(i32),
    /// It ended but was not our child (adopted from a previous server run), so the status is
    /// not ours to read.
    Unknown,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitInfo::Exited(c) => write!(f, "exited with status {c}"),
            ExitInfo::Signaled(s) => write!(f, "killed by signal {s}"),
            ExitInfo::Unknown => f.write_str("exited (status unavailable)"),
        }
    }
}

/// `waitid(P_PIDFD, fd, WEXITED | WNOHANG)`. `Ok(None)`: still running. ECHILD (not our
/// child) is reported as `Some(Unknown)` only when `gone` says the process has ended.
pub fn waitid_pidfd(fd: BorrowedFd<'_>, gone: bool) -> io::Result<Option<ExitInfo>> {
    // SAFETY: zeroed siginfo is a valid out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid out-pointer for the call.
    let r = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            fd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(gone.then_some(ExitInfo::Unknown));
        }
        return Err(e);
    }
    // SAFETY: waitid filled `info` (si_pid is 0 when nothing was reaped under WNOHANG).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => ExitInfo::Exited(status),
        _ => ExitInfo::Signaled(status),
    }))
}

/// Process start time (clock ticks since boot): field 22 of `/proc/PID/stat`.
pub fn proc_start_time(pid: i32) -> io::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat_start_time(&s)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/PID/stat"))
}

/// Parse field 22 of a `/proc/PID/stat` line. The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the comm come fields 3.. ; start time is field 22, i.e. index 19 here.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// Kernel release as (major, minor).
pub fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: zeroed utsname is a valid out-parameter.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates the release field.
    let rel = unsafe { CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    parse_kernel_version(&rel)
}

pub fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Landlock ABI version offered by the kernel (0 when absent or disabled).
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes a null attr and size 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 { 0 } else { r as u32 }
}

/// Random bytes from the kernel, for cgroup nonces.
pub fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: `v` is a writable 8-byte buffer.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(v)
    } else {
        // getrandom cannot really fail here; fall back to the clock so names stay unique-ish.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_start_time_survives_odd_comm() {
        let line = "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 100 18446744073709551615";
        assert_eq!(parse_stat_start_time(line), Some(987654));
        assert_eq!(parse_stat_start_time("garbage"), None);
    }

    #[test]
    fn own_start_time_is_readable() {
        let me = std::process::id() as i32;
        assert!(proc_start_time(me).unwrap() > 0);
    }

    #[test]
    fn kernel_versions_parse() {
        assert_eq!(parse_kernel_version("6.18.0-rc1"), Some((6, 18)));
        assert_eq!(parse_kernel_version("5.10.0-28-cloud-amd64"), Some((5, 10)));
        assert_eq!(parse_kernel_version("x"), None);
    }
}
