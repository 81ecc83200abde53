//! The CA bundle bind-mounted read-only over each sandbox's system bundle: the template's own
//! bundle plus the deployment's extra PEM (the egress proxy's CA, operator roots). Built once
//! per template and PEM under `<state>/ca` and shared by every sandbox of the template. Leaf
//! module.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bulkhead_driver::DriverError;

use super::fsutil::{fnv32, template_key};
use crate::{JailConfig, sys};

/// The bundle for sandboxes of `rootfs`, or None when the configuration adds no PEM (the
/// template's own bundle is then left in place).
pub(super) fn sandbox_ca_bundle(
    cfg: &JailConfig,
    rootfs: &Path,
) -> Result<Option<PathBuf>, DriverError> {
    let Some(extra) = &cfg.sandbox_ca_pem else {
        return Ok(None);
    };
    let key = template_key(rootfs)
        .map_err(|e| DriverError::io(format!("template root {}", rootfs.display()), e))?;
    let path = cfg
        .state_dir
        .join("ca")
        .join(format!("{key}-{:08x}.pem", fnv32(extra.as_bytes())));
    if path.is_file() {
        return Ok(Some(path));
    }
    let mut bundle = template_ca_bundle(rootfs);
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(extra.as_bytes());
    let tmp = path.with_extension(format!("tmp{}", sys::random_u64()));
    fs::write(&tmp, &bundle)
        .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| {
            DriverError::io(format!("write the sandbox CA bundle {}", path.display()), e)
        })?;
    Ok(Some(path))
}

/// The template's own CA bundle (empty if it has none). An absolute symlink is resolved inside
/// the template, never against the host's root.
fn template_ca_bundle(rootfs: &Path) -> Vec<u8> {
    let rel = crate::mountplan::CA_BUNDLE.trim_start_matches('/');
    let mut path = rootfs.join(rel);
    for _ in 0..8 {
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let Ok(target) = fs::read_link(&path) else {
                    return Vec::new();
                };
                path = if target.is_absolute() {
                    rootfs.join(target.strip_prefix("/").unwrap_or(&target))
                } else {
                    path.parent().unwrap_or(rootfs).join(target)
                };
            }
            Ok(m) if m.is_file() => return fs::read(&path).unwrap_or_default(),
            _ => return Vec::new(),
        }
    }
    Vec::new()
}
