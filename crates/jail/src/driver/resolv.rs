//! The sandbox's `/etc/resolv.conf`, naming the egress gateway as its only nameserver. Leaf
//! module.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::fsutil::{chown, mkdir_mode};
use crate::JailError;

/// `/etc/resolv.conf` in the fresh overlay upper dir: a regular file owned by the sandbox's
/// root, so it shadows whatever the template has (even a symlink) and stays editable inside.
pub(super) fn write_resolv_conf(
    upper: &Path,
    uid: u32,
    ns: std::net::Ipv4Addr,
) -> Result<(), JailError> {
    let etc = upper.join("etc");
    mkdir_mode(&etc, 0o755)?;
    chown(&etc, uid).map_err(|e| JailError::io(format!("chown {}", etc.display()), e))?;
    let file = etc.join("resolv.conf");
    fs::write(
        &file,
        format!("nameserver {ns}\noptions timeout:2 attempts:1\n"),
    )
    .and_then(|()| fs::set_permissions(&file, fs::Permissions::from_mode(0o644)))
    .and_then(|()| chown(&file, uid))
    .map_err(|e| JailError::io(format!("write {}", file.display()), e))
}
