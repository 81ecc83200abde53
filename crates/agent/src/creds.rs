//! Running filesystem work with a user's credentials.
//!
//! The agent runs as (namespaced) root, but file operations requested for a user must be
//! checked and performed as that user: `user` must not read root's 0600 files, and files it
//! creates must belong to it. Linux keeps credentials per *thread*, so each operation runs on a
//! fresh, short-lived thread that switches its filesystem uid/gid and supplementary groups with
//! raw syscalls and exits afterwards, leaving every other thread as root.
//!
//! The raw `setgroups` syscall matters: glibc's wrapper broadcasts the change to all threads of
//! the process (POSIX semantics), which would drop the privileges of the whole agent.
//! `setfsuid` to a non-zero uid also clears `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_CHOWN` and the
//! other file capabilities from the thread's effective set, so the kernel applies ordinary
//! permission checks.

use std::io;

use tokio::sync::oneshot;

use crate::users::Identity;

/// Errors switching credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    /// The kernel refused the switch (the agent lacks `CAP_SETUID`/`CAP_SETGID`).
    #[error(
        "The agent cannot act as uid {uid}: {step} failed (is it running without CAP_SETUID/CAP_SETGID?)"
    )]
    Switch {
        /// Target uid.
        uid: u32,
        /// Which call failed.
        step: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The worker thread could not be started.
    #[error("Could not start a worker thread")]
    Spawn(#[source] io::Error),
    /// The worker thread panicked.
    #[error("A filesystem worker thread panicked")]
    Panicked,
}

/// Runs `work` with the filesystem credentials of `identity` and returns its result.
pub async fn run_as<T, F>(identity: &Identity, work: F) -> Result<T, CredsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if identity.uid == euid {
        // Already that user (root acting as root, or an unprivileged agent in development).
        return tokio::task::spawn_blocking(work)
            .await
            .map_err(|_| CredsError::Panicked);
    }
    let identity = identity.clone();
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("fs-uid-{}", identity.uid))
        .spawn(move || {
            let result = switch_thread_credentials(&identity).map(|()| work());
            let _ = tx.send(result);
        })
        .map_err(CredsError::Spawn)?;
    rx.await.map_err(|_| CredsError::Panicked)?
}

/// Switches the calling thread's groups and filesystem ids; the thread must exit afterwards.
fn switch_thread_credentials(identity: &Identity) -> Result<(), CredsError> {
    let uid = identity.uid;
    let fail = |step| CredsError::Switch {
        uid,
        step,
        source: io::Error::last_os_error(),
    };
    let groups: Vec<libc::gid_t> = identity.groups.clone();
    // SAFETY: `groups` is a valid array of `groups.len()` gids for the duration of the call; the
    // raw syscall changes only this thread's credentials.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(fail("setgroups"));
    }
    // setfsgid/setfsuid return the previous value and never fail visibly; verify by calling
    // again with an invalid id (-1), which changes nothing and returns the current value.
    // SAFETY: plain syscalls on integer arguments affecting only this thread.
    unsafe { libc::syscall(libc::SYS_setfsgid, identity.gid) };
    // SAFETY: as above.
    let current_gid = unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) };
    if current_gid != i64::from(identity.gid) {
        return Err(CredsError::Switch {
            uid,
            step: "setfsgid",
            source: io::Error::from_raw_os_error(libc::EPERM),
        });
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_setfsuid, identity.uid) };
    // SAFETY: as above.
    let current_uid = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) };
    if current_uid != i64::from(identity.uid) {
        return Err(CredsError::Switch {
            uid,
            step: "setfsuid",
            source: io::Error::from_raw_os_error(libc::EPERM),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[tokio::test]
    async fn own_identity_runs_directly() {
        // SAFETY: geteuid and getegid have no preconditions.
        let me = unsafe {
            Identity {
                uid: libc::geteuid(),
                gid: libc::getegid(),
                groups: vec![],
            }
        };
        assert_eq!(run_as(&me, || 41 + 1).await.unwrap(), 42);
    }

    #[bulkhead_testkit::requires(Root)]
    #[tokio::test]
    async fn switched_thread_creates_files_as_the_user_and_others_stay_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root only").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let created = dir.path().join("made-by-nobody");
        let (read, write) = {
            let secret = secret.clone();
            let created = created.clone();
            run_as(&nobody, move || {
                (std::fs::read(&secret), std::fs::write(&created, "x"))
            })
            .await
            .unwrap()
        };
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        write.unwrap();
        let meta = std::fs::metadata(&created).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        // This thread (and the process) kept root's access.
        assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
    }
}
