//! Landlock after a restore. CRIU restores everything of a sandbox except its Landlock domain,
//! so the restored agent and the processes that were running come back without one. When the
//! driver tells the agent it was restored (`POST /bulkhead/restored`, host-only), every process
//! the agent spawns from then on applies the sandbox's ruleset in the child before `execve`
//! (`process::spawn` builds it with [`child_ruleset`] and applies it with [`restrict_child`]).
//! Processes restored as they were stay without Landlock; every other layer (namespaces,
//! seccomp, capabilities, read-only mounts) survived the restore (see `docs/threat-model.md`).
//! The agent lacks CAP_SYS_ADMIN, so these children set `no_new_privs` first, which the kernel
//! requires: `sudo` works in fresh sandboxes but not in processes spawned after a restore.
//!
//! The ruleset is built per spawn and closed right after it, never kept open: CRIU cannot dump
//! a Landlock ruleset descriptor, so a held one would make the next pause fail.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

static RESTORED: AtomicBool = AtomicBool::new(false);

/// This sandbox was restored: confine what is spawned from now on. Checks once that the
/// ruleset can be built, so a failure is reported to the driver rather than at the next spawn.
pub fn activate() -> Result<(), String> {
    drop(bulkhead_landlock::ruleset_fd()?);
    RESTORED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The ruleset for one child, if this sandbox was restored (None before, or on a kernel
/// without Landlock). Keep it open until the child has been spawned.
pub fn child_ruleset() -> std::io::Result<Option<OwnedFd>> {
    if !RESTORED.load(Ordering::SeqCst) {
        return Ok(None);
    }
    bulkhead_landlock::ruleset_fd().map_err(std::io::Error::other)
}

/// In a forked child before `execve`: apply the ruleset. Async-signal-safe (one syscall).
///
/// # Safety
/// `fd` must be a Landlock ruleset descriptor open in this process.
pub unsafe fn restrict_child(fd: RawFd) -> std::io::Result<()> {
    // The agent holds no CAP_SYS_ADMIN, so the kernel wants `no_new_privs` first: processes
    // spawned after a restore cannot use set-uid programs (sudo), unlike in a fresh sandbox.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: landlock_restrict_self takes a ruleset fd and flags; no memory is passed.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
