//! Landlock after a restore. CRIU restores everything of a sandbox except its Landlock domain,
//! so the restored agent and the processes that were running come back without one. When the
//! driver tells the agent it was restored (`POST /bulkhead/restored`, host-only), the agent
//! builds the sandbox's ruleset once and every process it spawns from then on applies it in
//! the child before `execve` ([`ruleset_fd`], used by `process::spawn`). Processes restored
//! as they were stay without Landlock; every other layer (namespaces, seccomp, capabilities,
//! read-only mounts, no_new_privs) survived the restore (see `docs/threat-model.md`).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

static RULESET: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// Build the ruleset for the children spawned from now on. Idempotent.
pub fn activate() -> Result<(), String> {
    if RULESET.get().is_some() {
        return Ok(());
    }
    let fd = bulkhead_landlock::ruleset_fd()?;
    let _ = RULESET.set(fd);
    Ok(())
}

/// The ruleset to apply in a spawned child, once [`activate`]d (None before, or on a kernel
/// without Landlock).
pub fn ruleset_fd() -> Option<RawFd> {
    RULESET
        .get()
        .and_then(|f| f.as_ref())
        .map(AsRawFd::as_raw_fd)
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
