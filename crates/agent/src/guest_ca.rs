//! Guest mode: the deployment's CA (the egress proxy's, plus operator roots) in the guest's
//! system trust store, as the jail driver bind-mounts it over each sandbox's bundle.
//!
//! The host puts the PEM on the boot disk ([`CA_FILE`], visible at
//! [`crate::guest::BOOT_DIR`] after the pivot). [`install`] writes the template's own bundle
//! plus that PEM to a file on `/run` and bind-mounts it read-only over [`CA_BUNDLE`], so that
//! curl, OpenSSL, Python and Node (pointed there by `SSL_CERT_FILE` and friends, which the
//! engine sets for every sandbox) trust the proxy that injects credentials.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::mount::{MsFlags, mount};

/// Name of the PEM on the boot disk.
pub const CA_FILE: &str = "sandbox-ca.pem";
/// The system bundle the sandbox's TLS clients read (Debian's path, as in the jail).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where the combined bundle is kept (a tmpfs).
const COMBINED: &str = "/run/bulkhead/ca-certificates.crt";

/// `template` (the template's bundle, possibly empty) followed by `extra`.
pub fn combine(template: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut out = template.to_vec();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(extra);
    out
}

/// Puts the boot disk's PEM (if any) into the system bundle of the root we run in. Runs in
/// pid 1 after the pivot, before any sandbox process exists.
pub fn install(boot_dir: &Path) -> io::Result<()> {
    let extra = match fs::read(boot_dir.join(CA_FILE)) {
        Ok(pem) => pem,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // The bundle may be a symlink (into /etc/ssl/certs or elsewhere in the template): read and
    // cover what it points to; a template without one gets the file.
    let target = fs::canonicalize(CA_BUNDLE).unwrap_or_else(|_| CA_BUNDLE.into());
    let template = fs::read(&target).unwrap_or_default();
    if let Some(dir) = Path::new(COMBINED).parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(COMBINED, combine(&template, &extra))?;
    fs::set_permissions(COMBINED, fs::Permissions::from_mode(0o644))?;
    if !target.exists() {
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir)?;
        }
        // A dangling symlink is replaced by the file the bundle is mounted on.
        let _ = fs::remove_file(&target);
        fs::write(&target, b"")?;
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644))?;
    }
    mount(
        Some(COMBINED),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(io::Error::from)?;
    mount(
        None::<&str>,
        &target,
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extra_pem_follows_the_templates_bundle_on_its_own_line() {
        assert_eq!(combine(b"A", b"B\n"), b"A\nB\n");
        assert_eq!(combine(b"A\n", b"B\n"), b"A\nB\n");
        assert_eq!(combine(b"", b"B\n"), b"B\n");
    }
}
