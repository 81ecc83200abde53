//! Where a volume's files live on the host, behind [`VolumeStorage`].
//!
//! [`LoopExt4`] (the server's choice, needs root): every volume is its own ext4 filesystem in
//! a sparse image file `<dir>/<id>/image.ext4` of the volume's size limit, loop-mounted
//! `nosuid,nodev,noatime` at `<dir>/<id>/mnt`. The kernel enforces the limit for every writer
//! (sandboxes and the content API alike: `ENOSPC`), a volume shares no inode with the host
//! filesystem (no hard link can reach a host file), and deleting a volume is an unmount and an
//! unlink. Measured on the development host: `mkfs.ext4` + mount of a 64 MiB image take
//! ~50 ms; the root filesystem is mounted without `prjquota`, so project quotas (the other
//! way to limit a directory) are not available there, and loop devices are.
//!
//! [`PlainDir`] (tests and hosts without loop devices): a plain directory `<dir>/<id>/data`;
//! nothing limits its size.
//!
//! Mounts survive server restarts (they belong to the host, not to the server process);
//! [`VolumeStorage::root`] mounts an image again only when its mount point is not a mount.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The uid/gid inside a sandbox that owns a new volume's root and what the content API
/// creates (the sandbox's default user, `user`).
pub const VOLUME_OWNER: (u32, u32) = (1000, 1000);

/// Smallest size limit an ext4 image can have and still hold files.
pub const MIN_VOLUME_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("Volume id '{0}' is not a valid volume id")]
    BadId(String),
    #[error("Cannot create the volume directory {}: check the data dir's permissions", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "Cannot run `{program}`: install it (Debian: e2fsprogs for mkfs.ext4, util-linux for mount)"
    )]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{program}` failed for {}: {stderr}", path.display())]
    Command {
        program: &'static str,
        path: PathBuf,
        stderr: String,
    },
    #[error("Cannot unmount {}", path.display())]
    Unmount {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("The volume's storage is missing on the host ({}): it was removed outside Bulkhead", path.display())]
    Missing { path: PathBuf },
}

type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Host storage of volumes.
pub trait VolumeStorage: Send + Sync + std::fmt::Debug {
    /// Make the storage of a new volume limited to `max_bytes`.
    fn create(&self, id: &str, max_bytes: u64) -> Result<()>;
    /// The volume's root directory on the host, ready to use (mounted if needed).
    fn root(&self, id: &str) -> Result<PathBuf>;
    /// Remove the volume's storage and everything in it.
    fn destroy(&self, id: &str) -> Result<()>;
    /// Owner of entries the content API creates without an explicit uid/gid.
    fn default_owner(&self) -> Option<(u32, u32)>;
}

fn check_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(StorageError::BadId(id.chars().take(64).collect()));
    }
    Ok(())
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| StorageError::Dir {
        path: path.to_owned(),
        source,
    })
}

/// Is `path` the root of a mount (its device differs from its parent's)?
fn is_mount_point(path: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    me.is_dir() && me.dev() != parent.dev()
}

fn run(program: &'static str, args: &[&std::ffi::OsStr], path: &Path) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| StorageError::Spawn { program, source })?;
    if !out.status.success() {
        return Err(StorageError::Command {
            program,
            path: path.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// One ext4 image per volume, loop-mounted (see the module docs).
#[derive(Debug)]
pub struct LoopExt4 {
    dir: PathBuf,
    /// Volumes being mounted right now, so two requests never mount one image twice.
    mounting: Mutex<HashSet<String>>,
}

impl LoopExt4 {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            mounting: Mutex::new(HashSet::new()),
        }
    }

    fn image(&self, id: &str) -> PathBuf {
        self.dir.join(id).join("image.ext4")
    }

    fn mnt(&self, id: &str) -> PathBuf {
        self.dir.join(id).join("mnt")
    }

    fn mount(&self, id: &str) -> Result<()> {
        let (image, mnt) = (self.image(id), self.mnt(id));
        if !image.is_file() {
            return Err(StorageError::Missing { path: image });
        }
        mkdir(&mnt)?;
        run(
            "mount",
            &[
                "-t".as_ref(),
                "ext4".as_ref(),
                "-o".as_ref(),
                "loop,nosuid,nodev,noatime".as_ref(),
                image.as_os_str(),
                mnt.as_os_str(),
            ],
            &image,
        )
    }
}

impl VolumeStorage for LoopExt4 {
    fn create(&self, id: &str, max_bytes: u64) -> Result<()> {
        check_id(id)?;
        let dir = self.dir.join(id);
        mkdir(&dir)?;
        let image = self.image(id);
        let file = std::fs::File::create(&image).map_err(|source| StorageError::Dir {
            path: image.clone(),
            source,
        })?;
        // Sparse: the host pays only for what is written.
        file.set_len(max_bytes.max(MIN_VOLUME_BYTES))
            .map_err(|source| StorageError::Dir {
                path: image.clone(),
                source,
            })?;
        drop(file);
        let owner = format!(
            "root_owner={}:{},lazy_itable_init=1,nodiscard",
            VOLUME_OWNER.0, VOLUME_OWNER.1
        );
        // -m 0: no blocks reserved for root (the limit is the volume's, whoever writes).
        run(
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                "-m".as_ref(),
                "0".as_ref(),
                "-E".as_ref(),
                owner.as_ref(),
                image.as_os_str(),
            ],
            &image,
        )?;
        self.root(id)?;
        // An empty volume holds nothing; fsck recreates lost+found when it needs it.
        let _ = std::fs::remove_dir(self.mnt(id).join("lost+found"));
        Ok(())
    }

    fn root(&self, id: &str) -> Result<PathBuf> {
        check_id(id)?;
        let mnt = self.mnt(id);
        loop {
            if is_mount_point(&mnt) {
                return Ok(mnt);
            }
            let mut m = self.mounting.lock().expect("mounting lock");
            if m.insert(id.to_string()) {
                break;
            }
            drop(m);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let r = if is_mount_point(&mnt) {
            Ok(())
        } else {
            self.mount(id)
        };
        self.mounting.lock().expect("mounting lock").remove(id);
        r.map(|()| mnt)
    }

    fn destroy(&self, id: &str) -> Result<()> {
        check_id(id)?;
        let mnt = self.mnt(id);
        // Detach: sandboxes that still hold the filesystem (there should be none, the engine
        // refuses to delete a mounted volume) keep it until they go; the loop device is
        // released (autoclear) with the last reference.
        while is_mount_point(&mnt) {
            nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH).map_err(|source| {
                StorageError::Unmount {
                    path: mnt.clone(),
                    source,
                }
            })?;
        }
        match std::fs::remove_dir_all(self.dir.join(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StorageError::Dir {
                path: self.dir.join(id),
                source,
            }),
        }
    }

    fn default_owner(&self) -> Option<(u32, u32)> {
        Some(VOLUME_OWNER)
    }
}

/// A plain directory per volume, without a size limit (see the module docs).
#[derive(Debug)]
pub struct PlainDir {
    dir: PathBuf,
}

impl PlainDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }
}

impl VolumeStorage for PlainDir {
    fn create(&self, id: &str, _max_bytes: u64) -> Result<()> {
        check_id(id)?;
        mkdir(&self.dir.join(id).join("data"))
    }

    fn root(&self, id: &str) -> Result<PathBuf> {
        check_id(id)?;
        let data = self.dir.join(id).join("data");
        if !data.is_dir() {
            return Err(StorageError::Missing { path: data });
        }
        Ok(data)
    }

    fn destroy(&self, id: &str) -> Result<()> {
        check_id(id)?;
        // remove_dir_all never follows symlinks (it works through directory descriptors).
        match std::fs::remove_dir_all(self.dir.join(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StorageError::Dir {
                path: self.dir.join(id),
                source,
            }),
        }
    }

    fn default_owner(&self) -> Option<(u32, u32)> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_dir_lifecycle_and_ids() {
        let t = tempfile::tempdir().unwrap();
        let s = PlainDir::new(t.path());
        s.create("abc123", 1 << 20).unwrap();
        let root = s.root("abc123").unwrap();
        std::fs::write(root.join("f"), "x").unwrap();
        s.destroy("abc123").unwrap();
        assert!(s.root("abc123").is_err());
        for bad in ["", "../x", "a/b", "a.b"] {
            assert!(
                matches!(s.create(bad, 1), Err(StorageError::BadId(_))),
                "{bad:?}"
            );
        }
    }

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn loop_ext4_enforces_the_limit_and_survives_remount() {
        let t = tempfile::tempdir().unwrap();
        let s = LoopExt4::new(t.path());
        s.create("vol1", MIN_VOLUME_BYTES).unwrap();
        let root = s.root("vol1").unwrap();
        assert!(is_mount_point(&root));
        let meta = std::fs::metadata(&root).unwrap();
        assert_eq!((meta.uid(), meta.gid()), VOLUME_OWNER);
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        let big = vec![0u8; 20 << 20];
        let err = std::fs::write(root.join("big"), &big).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        std::fs::write(root.join("keep"), "kept").unwrap();
        // Unmounted behind our back (a host reboot): the next use mounts it again.
        nix::mount::umount2(&root, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(!is_mount_point(&root));
        let root = s.root("vol1").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("keep")).unwrap(), "kept");
        s.destroy("vol1").unwrap();
        assert!(!t.path().join("vol1").exists());
    }
}
