//! Which account a context's kernel runs as.
//!
//! Kernels run as the sandbox user (uid 1000) so that code in them cannot reach the agent or
//! other kernels' connection files. E2B runs every kernel as root, so its users create contexts
//! in directories only root may enter (`cwd="/root"` is common); such a context's kernel runs as
//! the sandbox's root, which every sandbox client can already become (`sudo`, `user="root"`
//! commands). See `docs/threat-model.md`.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::users::{User, UserDb};

/// Who kernels run as.
#[derive(Debug, Clone)]
pub enum KernelUser {
    /// A sandbox account (the contract: `user`, uid/gid 1000, HOME=/home/user); uid/gid 1000 and
    /// `/home/user` are assumed when the account is missing from `/etc/passwd`.
    Sandbox(String),
    /// The agent's own credentials with this HOME (tests on a host, where no `user` exists).
    Current {
        /// HOME of the kernels.
        home: PathBuf,
    },
}

/// The account for a kernel whose working directory is `cwd`.
pub(crate) fn for_cwd(configured: &KernelUser, cwd: &Path) -> User {
    match configured {
        KernelUser::Sandbox(name) => {
            let db = UserDb::load().ok();
            let user = db
                .as_ref()
                .and_then(|db| db.user(name).ok())
                .unwrap_or_else(|| default_sandbox_user(name));
            if may_enter(cwd, &user) {
                user
            } else {
                tracing::info!(
                    cwd = %cwd.display(),
                    user = user.name,
                    "the sandbox user cannot enter the context's directory; its kernel runs as root, as on E2B"
                );
                db.and_then(|db| db.user("root").ok()).unwrap_or_else(root)
            }
        }
        KernelUser::Current { home } => {
            let uid = nix::unistd::geteuid().as_raw();
            let gid = nix::unistd::getegid().as_raw();
            User {
                name: std::env::var("USER").unwrap_or_else(|_| uid.to_string()),
                uid,
                gid,
                home: home.clone(),
                shell: "/bin/bash".to_owned(),
                groups: vec![gid],
            }
        }
    }
}

fn default_sandbox_user(name: &str) -> User {
    User {
        name: name.to_owned(),
        uid: 1000,
        gid: 1000,
        home: PathBuf::from("/home/user"),
        shell: "/bin/bash".to_owned(),
        groups: vec![1000],
    }
}

fn root() -> User {
    User {
        name: "root".to_owned(),
        uid: 0,
        gid: 0,
        home: PathBuf::from("/root"),
        shell: "/bin/bash".to_owned(),
        groups: vec![0],
    }
}

/// Whether `user` may `chdir` into `dir`: search permission on it and on every ancestor, from
/// the mode bits (the sandbox tree has no ACLs). Root may always; an unreadable path may not.
pub(crate) fn may_enter(dir: &Path, user: &User) -> bool {
    if user.uid == 0 {
        return true;
    }
    dir.ancestors().all(|p| {
        std::fs::metadata(p).is_ok_and(|m| {
            let mode = m.mode();
            let bit = if m.uid() == user.uid {
                0o100
            } else if user.groups.contains(&m.gid()) {
                0o010
            } else {
                0o001
            };
            mode & bit != 0
        })
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn someone(uid: u32, groups: Vec<u32>) -> User {
        User {
            name: "someone".to_owned(),
            uid,
            gid: groups[0],
            home: PathBuf::from("/nonexistent"),
            shell: "/bin/sh".to_owned(),
            groups,
        }
    }

    #[test]
    fn search_permission_is_read_from_owner_group_and_other_bits() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let meta = std::fs::metadata(&inner).unwrap();
        let (owner, group) = (meta.uid(), meta.gid());
        let stranger = someone(owner.wrapping_add(4242), vec![group.wrapping_add(4242)]);
        let member = someone(owner.wrapping_add(4242), vec![group]);
        let set = |p: &Path, mode| std::fs::set_permissions(p, PermissionsExt::from_mode(mode));

        set(&inner, 0o755).unwrap();
        // (tempdir is 0700 and owned by the test's user: strangers cannot pass it.)
        set(dir.path(), 0o711).unwrap();
        assert!(may_enter(&inner, &stranger));
        set(&inner, 0o750).unwrap();
        assert!(!may_enter(&inner, &stranger));
        assert!(may_enter(&inner, &member));
        set(inner.parent().unwrap(), 0o700).unwrap();
        assert!(!may_enter(&inner, &member), "an ancestor blocks");
        assert!(may_enter(&inner, &someone(owner, vec![group])));
        assert!(may_enter(&inner, &someone(0, vec![0])));
        assert!(!may_enter(&dir.path().join("missing"), &member));
    }

    #[test]
    fn a_directory_closed_to_the_sandbox_user_gets_a_root_kernel() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o700)).unwrap();
        let owner = std::fs::metadata(dir.path()).unwrap().uid();
        // Only meaningful where the sandbox user (uid 1000, or `user` from /etc/passwd) is
        // not the directory's owner.
        let user = for_cwd(&KernelUser::Sandbox("user".to_owned()), Path::new("/"));
        if user.uid == owner {
            return;
        }
        assert_ne!(user.uid, 0, "the sandbox user for an open directory");
        let kernel = for_cwd(&KernelUser::Sandbox("user".to_owned()), dir.path());
        assert_eq!((kernel.uid, kernel.gid), (0, 0));
        assert_eq!(kernel.home, Path::new("/root"));
    }
}
