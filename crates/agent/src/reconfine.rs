//! Landlock after a restore. CRIU restores everything of a sandbox except its Landlock domain,
//! so the restored agent and the processes that were running come back without one. When the
//! driver tells the agent it was restored (`POST /bulkhead/restored`, host-only), every
//! process it spawns from then on applies the sandbox's ruleset in the child before `execve`
//! ([`ruleset_fd`], used by `process::spawn`). Processes restored as they were stay without
//! Landlock; every other layer (namespaces, seccomp, capabilities, read-only mounts,
//! no_new_privs) survived the restore (see `docs/threat-model.md`).
//!
//! The ruleset is built per spawn and closed right after it, never held: CRIU cannot dump a
//! Landlock ruleset descriptor, so an agent holding one could never be checkpointed again (a
//! second pause, or a snapshot or fork of a resumed sandbox).

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// From now on, children are spawned under the sandbox's ruleset. Checks once that the
/// ruleset can be built. Idempotent.
pub fn activate() -> Result<(), String> {
    drop(bulkhead_landlock::ruleset_fd()?);
    ACTIVE.store(true, Ordering::SeqCst);
    Ok(())
}

/// A fresh ruleset to apply in the child about to be spawned, once [`activate`]d (None before,
/// or on a kernel without Landlock). Keep it open until the child is spawned, then drop it.
pub fn ruleset_fd() -> Result<Option<OwnedFd>, String> {
    if !ACTIVE.load(Ordering::SeqCst) {
        return Ok(None);
    }
    bulkhead_landlock::ruleset_fd()
}

/// In a forked child before `execve`: apply the ruleset. Async-signal-safe (one syscall).
///
/// # Safety
/// `fd` must be the descriptor [`ruleset_fd`] returned.
pub unsafe fn restrict_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: landlock_restrict_self takes a ruleset fd and flags; no memory is passed.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
