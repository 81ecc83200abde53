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
