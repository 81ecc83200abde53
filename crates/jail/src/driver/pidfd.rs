//! pidfds of sandbox inits: verified opening (never a recycled pid) and registration with the
//! reactor. Leaf module.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

use crate::sys;

/// Register a pidfd with the reactor; it becomes readable when the process exits.
pub(super) fn watch_pidfd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the OwnedFd owns the descriptor for the AsyncFd's whole lifetime and always
    // reports the same raw fd.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Open a pidfd for `pid` only if it still is the process that started at `start_time`.
pub(super) fn verified_pidfd(pid: i32, start_time: u64) -> Option<OwnedFd> {
    let fd = sys::pidfd_open(pid).ok()?;
    // Checked after opening: the pidfd pins the process, so a match now cannot go stale.
    (sys::proc_start_time(pid).ok()? == start_time).then_some(fd)
}
