//! Making an unpacked image a sandbox template: the directories the jail mounts over, neutral
//! host files (as for the Debian templates), and E2B's `user` account (uid 1000) when the
//! image has Unix account files and that uid is free. Covered by `OCI_VERSION`: change what
//! this writes, bump it.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::Result;
use crate::finalize::{USER_NAME, USER_UID, create_user, write_file};

/// The sandbox user's name when the image has it (created here or already there).
pub(crate) fn prepare(root: &Path) -> Result<Option<String>> {
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("etc", 0o755),
        ("run", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
    ] {
        let p = root.join(dir);
        // An image may ship any of these as a symlink (e.g. /run -> /var/run): keep it.
        if fs::symlink_metadata(&p).is_err() {
            fs::create_dir(&p).map_err(crate::error::ImageError::io("create", &p))?;
            fs::set_permissions(&p, fs::Permissions::from_mode(mode))
                .map_err(crate::error::ImageError::io("set permissions on", &p))?;
        }
    }
    // The jail sets the hostname per sandbox and provides DNS when egress is granted.
    write_file(root, "etc/hostname", "sandbox\n")?;
    write_file(root, "etc/hosts", crate::finalize::HOSTS)?;
    write_file(
        root,
        "etc/resolv.conf",
        "# Provided by Bulkhead when the sandbox is allowed network access.\n",
    )?;

    let etc = root.join("etc");
    let Ok(passwd) = fs::read_to_string(etc.join("passwd")) else {
        return Ok(None); // scratch or distroless: no accounts to add to
    };
    if passwd
        .lines()
        .any(|l| l.starts_with(&format!("{USER_NAME}:")))
    {
        return Ok(Some(USER_NAME.to_owned()));
    }
    let uid_taken = passwd
        .lines()
        .any(|l| l.split(':').nth(2) == Some(&USER_UID.to_string()));
    let has_files = ["group", "shadow"].iter().all(|f| etc.join(f).is_file());
    if uid_taken || !has_files || !passwd.lines().any(|l| l.starts_with("root:x:0:0:")) {
        return Ok(None);
    }
    create_user(root)?;
    Ok(Some(USER_NAME.to_owned()))
}

/// The dynamic loader the agent binary (built for glibc) is started with, per architecture.
#[cfg(target_arch = "x86_64")]
const AGENT_LOADER: &str = "lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
const AGENT_LOADER: &str = "lib/ld-linux-aarch64.so.1";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AGENT_LOADER: &str = "lib/ld-linux.so.2";

/// What a tree lacks to be a sandbox: the in-sandbox agent is a glibc program started from
/// inside the tree (so the tree's loader and C library run it), and commands run with
/// `/bin/bash -l -c` as on E2B. Empty when the tree has both. Paths are resolved as a process
/// inside the tree sees them (symlinks clamped to the tree, e.g. merged `/usr`).
pub fn sandbox_blockers(root: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    if !exists_in_tree(root, AGENT_LOADER) {
        missing.push(format!(
            "the glibc loader /{AGENT_LOADER} (the image has no GNU C library: musl-based \
             images such as Alpine, busybox and static distroless images cannot run \
             Bulkhead's in-sandbox agent)"
        ));
    }
    if !exists_in_tree(root, "bin/bash") {
        missing
            .push("/bin/bash (E2B sandboxes run every command with `/bin/bash -l -c`)".to_owned());
    }
    missing
}

/// Is `rel` a regular file in the tree (following symlinks inside it)?
fn exists_in_tree(root: &Path, rel: &str) -> bool {
    let mut rel = std::path::PathBuf::from(rel);
    for _ in 0..40 {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let Some(name) = rel.file_name().map(ToOwned::to_owned) else {
            return false;
        };
        let Ok(dir) = super::confine::resolve_dir(root, parent, "check", false) else {
            return false;
        };
        let here = dir.join(&name);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.is_file() => return true,
            Ok(m) if m.file_type().is_symlink() => {
                let Ok(target) = fs::read_link(&here) else {
                    return false;
                };
                // The directory the link sits in, relative to the root, for a relative target.
                let base = dir.strip_prefix(root).unwrap_or(Path::new("")).to_owned();
                rel = if target.is_absolute() {
                    target.strip_prefix("/").unwrap_or(&target).to_owned()
                } else {
                    base.join(target)
                };
            }
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn blockers_follow_links_inside_the_tree_only() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        assert_eq!(sandbox_blockers(root).len(), 2);
        // Merged /usr: /bin -> usr/bin, /lib64 -> usr/lib64, loader a relative link.
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::create_dir_all(root.join("usr/lib64")).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        symlink("usr/lib64", root.join("lib64")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        fs::write(root.join("usr/bin/bash"), "").unwrap();
        fs::write(root.join("usr/lib/x86_64-linux-gnu/ld.so"), "").unwrap();
        fs::write(root.join("usr/lib/ld-linux-aarch64.so.1"), "").unwrap();
        fs::write(root.join("usr/lib/ld-linux.so.2"), "").unwrap();
        symlink(
            "../lib/x86_64-linux-gnu/ld.so",
            root.join("usr/lib64/ld-linux-x86-64.so.2"),
        )
        .unwrap();
        assert_eq!(sandbox_blockers(root), Vec::<String>::new());
        // A link that points at a host path names the tree's own path, which is missing.
        fs::remove_file(root.join("usr/bin/bash")).unwrap();
        symlink("/../../../../bin/bash-host", root.join("usr/bin/bash")).unwrap();
        let b = sandbox_blockers(root);
        assert_eq!(b.len(), 1);
        assert!(b[0].contains("/bin/bash"), "{b:?}");
    }
}
