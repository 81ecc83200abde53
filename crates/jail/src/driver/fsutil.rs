//! Filesystem helpers of the driver: directories with exact modes, ownership, the agent's
//! private copy, template keys and disk usage. Leaf module (no driver state).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::JailError;

/// Every ancestor of `path` must be searchable by "others": the sandbox's root is an
/// unprivileged uid on the host and resolves these paths itself when it mounts.
pub(super) fn check_searchable(path: &Path, what: &str) -> Result<(), JailError> {
    let mut p = Some(path);
    while let Some(dir) = p {
        if dir.as_os_str().is_empty() {
            break;
        }
        let m =
            fs::metadata(dir).map_err(|e| JailError::io(format!("stat {}", dir.display()), e))?;
        if m.is_dir() && m.mode() & 0o001 == 0 {
            return Err(JailError::Config(format!(
                "{what} {} is not reachable by sandbox uids: {} has mode {:o} (needs o+x; try \
                 chmod o+x {})",
                path.display(),
                dir.display(),
                m.mode() & 0o7777,
                dir.display()
            )));
        }
        p = dir.parent();
    }
    Ok(())
}

pub(super) fn mkdir_mode(path: &Path, mode: u32) -> Result<(), JailError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| JailError::io(format!("mkdir {}", path.display()), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| JailError::io(format!("chmod {}", path.display()), e))
}

/// Copy a file the sandbox can replace (its agent log, in the socket directory it may write):
/// never following a symlink it planted, never blocking on a FIFO, into a new file (`dst` must
/// not exist), owned by `owner` when given (set on the open descriptor, not by path).
/// `Ok(false)` when `src` is absent or not a regular file.
pub(super) fn copy_sandbox_file(src: &Path, dst: &Path, owner: Option<u32>) -> io::Result<bool> {
    let mut from = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    if !from.metadata()?.is_file() {
        return Ok(false);
    }
    let mut to = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)?;
    io::copy(&mut from, &mut to)?;
    if let Some(uid) = owner {
        std::os::unix::fs::fchown(&to, Some(uid), Some(uid))?;
    }
    Ok(true)
}

pub(super) fn chown(path: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
}

/// Copy the agent into the state directory, content-addressed (`agents/<hash>`). The bind
/// mount's source path shows in the sandbox's mountinfo, so it should be a neutral state path
/// rather than wherever the binary was built or installed. Each build keeps its own file: a
/// paused sandbox is restored with exactly the agent binary it ran (CRIU re-maps the running
/// executable), even after the server was upgraded.
pub(super) fn install_agent(src: &Path, state_dir: &Path) -> Result<PathBuf, JailError> {
    let data = fs::read(src)
        .map_err(|e| JailError::io(format!("read the agent binary {}", src.display()), e))?;
    let key = data
        .chunks(1 << 20)
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, chunk| {
            chunk.iter().fold(h, |h, x| {
                (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        });
    let dir = state_dir.join("agents");
    mkdir_mode(&dir, 0o711)?;
    let dst = dir.join(format!("{key:016x}-{}", data.len()));
    if fs::metadata(&dst).is_ok_and(|m| m.len() == data.len() as u64) {
        return Ok(dst);
    }
    let tmp = dir.join(format!(".agent.{}", std::process::id()));
    fs::write(&tmp, &data)
        .map_err(|e| JailError::io(format!("copy the agent binary {}", src.display()), e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .map_err(|e| JailError::io(format!("chmod {}", tmp.display()), e))?;
    fs::rename(&tmp, &dst).map_err(|e| JailError::io(format!("install {}", dst.display()), e))?;
    Ok(dst)
}

/// Short stable id of a template root: its path plus device and inode, so a template rebuilt
/// into a fresh directory at the same path gets a fresh idmapped view. FNV-1a, 48 bits.
pub(super) fn template_key(rootfs: &Path) -> io::Result<String> {
    let m = fs::metadata(rootfs)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |b: &[u8]| {
        for x in b {
            h ^= u64::from(*x);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(rootfs.as_os_str().as_encoded_bytes());
    feed(&m.dev().to_le_bytes());
    feed(&m.ino().to_le_bytes());
    Ok(format!("{:012x}", h & 0xffff_ffff_ffff))
}

pub(super) fn fnv32(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5_u32, |h, x| {
        (h ^ u32::from(*x)).wrapping_mul(0x0100_0193)
    })
}

/// Bytes allocated under `dir` (not following symlinks, not crossing mounts). `dir` may be a
/// running sandbox's upper dir: the walk is confined to it (`bulkhead_common::confined`), so a
/// directory swapped for a symlink never makes the server walk a host tree.
pub(super) fn disk_usage(dir: &Path) -> u64 {
    let Ok(root) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let dev = root.dev();
    let mut total = root.blocks() * 512;
    let Ok(walk) = bulkhead_common::confined::Walker::new(dir) else {
        return total;
    };
    // Unreadable entries count nothing; directories on another mount are never entered.
    for found in walk.flatten() {
        if found.stat.st_dev == dev {
            total += found.stat.st_blocks as u64 * 512;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_keys_are_stable_and_short() {
        let t = tempfile::tempdir().unwrap();
        let a = template_key(t.path()).unwrap();
        assert_eq!(a, template_key(t.path()).unwrap());
        assert_eq!(a.len(), 12);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(a, template_key(other.path()).unwrap());
    }

    #[test]
    fn unsearchable_ancestors_are_reported() {
        let t = tempfile::tempdir().unwrap();
        let inner = t.path().join("a/b");
        fs::create_dir_all(&inner).unwrap();
        fs::set_permissions(t.path().join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        let e = check_searchable(&inner, "state_dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs o+x"), "{e}");
        fs::set_permissions(t.path().join("a"), fs::Permissions::from_mode(0o711)).unwrap();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
        check_searchable(&inner, "state_dir").unwrap();
    }

    #[test]
    fn disk_usage_counts_allocated_blocks() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("d")).unwrap();
        fs::write(t.path().join("d/f"), vec![1u8; 64 * 1024]).unwrap();
        let u = disk_usage(t.path());
        assert!(u >= 64 * 1024, "{u}");
    }

    #[test]
    fn disk_usage_never_counts_what_a_symlink_points_at() {
        let t = tempfile::tempdir().unwrap();
        let (upper, host) = (t.path().join("upper"), t.path().join("host"));
        fs::create_dir_all(upper.join("d")).unwrap();
        fs::create_dir(&host).unwrap();
        fs::write(host.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(&host, upper.join("d/link")).unwrap();
        let u = disk_usage(&upper);
        assert!(u < 1 << 20, "{u}");
    }
}
