//! What the volume verbs share with the rest of the engine (a leaf module): the volume error,
//! the answer and request types, and the pure checks of names and mount paths.

use bulkhead_store::VolumeRow;

use crate::volume::storage::StorageError;

/// Most volumes one sandbox may mount.
pub const MAX_MOUNTS: usize = 16;
/// Sandbox paths a volume may not be mounted at or under.
const RESERVED: [&str; 4] = ["/proc", "/sys", "/dev", "/run/bulkhead"];

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(
        "Invalid volume name '{0}': use 1-63 letters, digits, '-' or '_', starting with a letter or digit"
    )]
    InvalidName(String),
    #[error("Volume '{0}' not found: list volumes with GET /volumes")]
    NotFound(String),
    #[error("A volume named '{0}' already exists: pick another name or connect to it")]
    NameTaken(String),
    #[error(
        "Volume '{name}' is mounted by sandbox(es) {sandboxes}: kill them first, then delete it"
    )]
    InUse { name: String, sandboxes: String },
    #[error("Invalid volume mount at '{path}': {reason}")]
    BadMount { path: String, reason: String },
    #[error("This server has no volume storage: ask the operator to enable volumes")]
    NoStorage,
    #[error("Invalid volume token: use the token from Volume.create or Volume.connect")]
    BadToken,
    #[error(
        "The volume's storage failed: try again, and if it keeps failing ask the operator to check the server log"
    )]
    Storage(#[source] StorageError),
}

/// A volume as the API shows it (E2B `VolumeAndToken`).
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeInfo {
    pub id: String,
    pub name: String,
    pub token: String,
}

/// A volume a content request was authorised for (by its token or its team's key): what the
/// content verbs take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeAccess {
    pub(crate) id: String,
}

impl VolumeAccess {
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl From<&VolumeRow> for VolumeInfo {
    fn from(v: &VolumeRow) -> Self {
        Self {
            id: v.id.clone(),
            name: v.name.clone(),
            token: v.token.clone(),
        }
    }
}

/// One entry of a create request's `volumeMounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRequest {
    pub name: String,
    pub path: String,
}

/// Check a volume name (E2B-style: a short identifier, it is how mounts name volumes).
pub fn validate_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidName(name.chars().take(80).collect()))
    }
}

/// Normalise and check the mount paths of a create request: absolute, not `/`, not at or
/// under a reserved path, no `.`/`..`, no duplicates, no mount inside another.
pub fn validate_mounts(mounts: &[MountRequest]) -> Result<Vec<MountRequest>, VolumeError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(VolumeError::BadMount {
            path: String::new(),
            reason: format!("at most {MAX_MOUNTS} volumes per sandbox"),
        });
    }
    let mut out: Vec<MountRequest> = Vec::new();
    for m in mounts {
        let bad = |reason: &str| VolumeError::BadMount {
            path: m.path.chars().take(200).collect(),
            reason: reason.to_string(),
        };
        validate_name(&m.name)?;
        if !m.path.starts_with('/') {
            return Err(bad("the path must be absolute"));
        }
        if m.path.len() > 1024 || m.path.contains('\0') {
            return Err(bad("the path is too long (max 1024 bytes) or contains NUL"));
        }
        let mut parts = Vec::new();
        for c in m.path.split('/') {
            match c {
                "" => {}
                "." | ".." => return Err(bad("'.' and '..' are not allowed")),
                c if c.len() > 255 => return Err(bad("a name is too long (max 255 bytes)")),
                c => parts.push(c),
            }
        }
        if parts.is_empty() {
            return Err(bad("a volume cannot be mounted at '/'"));
        }
        let path = format!("/{}", parts.join("/"));
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if let Some(r) = RESERVED.iter().find(|r| under(&path, r)) {
            return Err(bad(&format!("'{r}' is reserved for the system")));
        }
        for o in &out {
            if under(&path, &o.path) || under(&o.path, &path) {
                return Err(bad(&format!(
                    "it overlaps the mount at '{}' (one path per volume, none inside another)",
                    o.path
                )));
            }
        }
        out.push(MountRequest {
            name: m.name.clone(),
            path,
        });
    }
    Ok(out)
}

/// Refuse a mount path that the template already has as a symlink or a non-directory on the
/// way (`/etc/passwd`, `/bin/x` where `/bin` is a link): the jail would refuse it at start,
/// and this answers with a 400 that names the path instead. Missing components are fine.
pub fn check_against_template(rootfs: &std::path::Path, path: &str) -> Result<(), VolumeError> {
    let mut at = rootfs.to_path_buf();
    let mut shown = String::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        at.push(c);
        shown.push('/');
        shown.push_str(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(m) => {
                let what = if m.file_type().is_symlink() {
                    "a symlink"
                } else {
                    "not a directory"
                };
                return Err(VolumeError::BadMount {
                    path: path.chars().take(200).collect(),
                    reason: format!("'{shown}' is {what} in the template: pick another path"),
                });
            }
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, path: &str) -> MountRequest {
        MountRequest {
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn template_paths() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("usr/bin")).unwrap();
        std::fs::create_dir_all(t.path().join("home/user")).unwrap();
        std::fs::write(t.path().join("etc"), "").unwrap();
        std::os::unix::fs::symlink("usr/bin", t.path().join("bin")).unwrap();
        for ok in ["/home/user/data", "/mnt/new/deep", "/usr/bin/x"] {
            assert!(check_against_template(t.path(), ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("/bin/x", "symlink"),
            ("/etc/x", "not a directory"),
            ("/etc", "not a directory"),
        ] {
            let err = check_against_template(t.path(), bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn names() {
        for ok in ["data", "my-volume", "a", "A_1", &"x".repeat(63)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "a b",
            "a/b",
            "a.b",
            "..",
            &"x".repeat(64),
            "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_paths() {
        let ok = validate_mounts(&[m("a", "/mnt/data/"), m("b", "//home/user/x")]).unwrap();
        assert_eq!(ok[0].path, "/mnt/data");
        assert_eq!(ok[1].path, "/home/user/x");
        for (path, why) in [
            ("mnt", "absolute"),
            ("/", "'/'"),
            ("//", "'/'"),
            ("/proc", "reserved"),
            ("/proc/x", "reserved"),
            ("/sys/fs", "reserved"),
            ("/dev/shm", "reserved"),
            ("/run/bulkhead", "reserved"),
            ("/run/bulkhead/sock", "reserved"),
            ("/mnt/../etc", "'..'"),
            ("/mnt/./x", "'..'"),
        ] {
            let err = validate_mounts(&[m("a", path)]).unwrap_err().to_string();
            assert!(err.contains(why), "{path}: {err}");
        }
        // /run itself and /procfoo are fine.
        assert!(validate_mounts(&[m("a", "/run/data"), m("b", "/procfoo")]).is_ok());
        for (a, b) in [
            ("/mnt/a", "/mnt/a"),
            ("/mnt/a", "/mnt/a/b"),
            ("/mnt/a/b", "/mnt/a"),
        ] {
            let err = validate_mounts(&[m("x", a), m("y", b)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("overlaps"), "{a} {b}: {err}");
        }
        assert!(validate_mounts(&[m("bad name", "/mnt")]).is_err());
        let many: Vec<_> = (0..17).map(|i| m("v", &format!("/m{i}"))).collect();
        assert!(validate_mounts(&many).is_err());
    }

    mod props {
        use proptest::prelude::*;

        use super::super::*;

        proptest! {
            #[test]
            fn accepted_mount_paths_are_normal_and_outside_the_reserved_tree(
                path in "(/|[a-z.]{1,3}|/\\.\\.|/proc|/run/bulkhead){1,6}"
            ) {
                let m = MountRequest { name: "v".into(), path: path.clone() };
                if let Ok(out) = validate_mounts(&[m]) {
                    let p = &out[0].path;
                    prop_assert!(p.starts_with('/') && p != "/" && !p.contains("//"));
                    prop_assert!(p.split('/').skip(1).all(|c| !c.is_empty() && c != "." && c != ".."));
                    for r in RESERVED {
                        prop_assert!(p != r && !p.starts_with(&format!("{r}/")), "{p}");
                    }
                }
            }
        }
    }
}
