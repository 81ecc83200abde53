//! One content-addressed cache entry, `<root>/<hash>/`, and the protocol every producer of a
//! tree follows (Debian builds, OCI pulls, build layers): take the entry's lock, build into
//! `rootfs.tmp`, make the tree durable, rename it to `rootfs`, write `READY` last. A reader
//! trusts a tree only once `READY` is there, so a crash at any point leaves either a usable
//! entry or leftovers that the next producer (holding the lock) removes.

use std::fs;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::error::{ImageError, Result};
use crate::exec::blocking;
use crate::fsutil::{disk_usage, remove_tree, sync_dir, sync_filesystem, write_atomic};
use crate::progress::Progress;

pub(crate) const READY: &str = "READY";
const LOCK: &str = "lock";
pub(crate) const ROOTFS: &str = "rootfs";
const ROOTFS_TMP: &str = "rootfs.tmp";

/// An entry's directory, whether or not it exists yet.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    dir: PathBuf,
}

/// What every `READY` records, whoever wrote it: listings read this much of any entry.
#[derive(Deserialize)]
struct ReadySize {
    size_bytes: u64,
}

impl Entry {
    pub(crate) fn new(root: &Path, hash: &str) -> Self {
        Entry {
            dir: root.join(hash),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn rootfs(&self) -> PathBuf {
        self.dir.join(ROOTFS)
    }

    /// True once a producer has finished (`READY` is written last).
    pub(crate) fn is_ready(&self) -> bool {
        self.dir.join(READY).is_file() && self.rootfs().is_dir()
    }

    /// The producer's `READY` record, if it is one of type `T`.
    pub(crate) fn ready_info<T: DeserializeOwned>(&self) -> Option<T> {
        let bytes = fs::read(self.dir.join(READY)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The tree's size as its `READY` records it (any producer), else measured now.
    pub(crate) fn size_bytes(&self) -> u64 {
        match self.ready_info::<ReadySize>() {
            Some(r) => r.size_bytes,
            None => disk_usage(&self.dir).0,
        }
    }

    /// Takes the entry's build lock (creating the entry), telling the user when it has to wait
    /// for another build of the same entry.
    pub(crate) async fn lock(&self, progress: &dyn Progress) -> Result<Building> {
        let file = self.open_lock()?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((file, Errno::EWOULDBLOCK)) => {
                progress.stage("waiting for another build of this template to finish");
                let path = self.dir.join(LOCK);
                blocking(move || {
                    Flock::lock(file, FlockArg::LockExclusive)
                        .map_err(|(_, e)| ImageError::io("lock", path)(e.into()))
                })
                .await?
            }
            Err((_, e)) => return Err(ImageError::io("lock", self.dir.join(LOCK))(e.into())),
        };
        Ok(self.building(lock))
    }

    /// [`lock`](Self::lock) for callers already on a blocking thread.
    pub(crate) fn lock_blocking(&self) -> Result<Building> {
        let file = self.open_lock()?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| ImageError::io("lock", self.dir.join(LOCK))(e.into()))?;
        Ok(self.building(lock))
    }

    fn open_lock(&self) -> Result<fs::File> {
        if let Some(root) = self.dir.parent() {
            if let Some(above) = root.parent() {
                fs::create_dir_all(above).map_err(ImageError::io("create", above))?;
            }
            make_private(root)?;
        }
        make_private(&self.dir)?;
        let path = self.dir.join(LOCK);
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(ImageError::io("open the lock file", &path))
    }

    fn building(&self, lock: Flock<fs::File>) -> Building {
        Building {
            entry: self.clone(),
            _lock: lock,
        }
    }
}

/// Mode of the cache root and of every entry directory: owner (root) only. An entry holds
/// trees that tenants wrote (build steps, registry layers), set-uid root files included (a
/// sandbox's `sudo` needs them); only the sandboxes' own mounts may reach them, never another
/// host user through the path (`nobody` executing a planted set-uid copy of a shell).
pub(crate) const PRIVATE_MODE: u32 = 0o700;

/// Creates `dir` (its parent must exist) or tightens it to [`PRIVATE_MODE`].
pub(crate) fn make_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match fs::DirBuilder::new().mode(PRIVATE_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(ImageError::io("create", dir)(e)),
    }
    // Also for a directory made by an older version (0755), and whatever the umask.
    fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_MODE))
        .map_err(ImageError::io("set permissions on", dir))
}

/// An entry whose lock this process holds: the one producer allowed to write it.
pub(crate) struct Building {
    entry: Entry,
    _lock: Flock<fs::File>,
}

impl Building {
    /// Where the producer builds the tree.
    pub(crate) fn tmp(&self) -> PathBuf {
        self.entry.dir.join(ROOTFS_TMP)
    }

    /// Removes what a producer that died left behind (the partial tree, a stale `rootfs`, and
    /// the producer's own scratch dirs in `extra`): the lock says nobody else is using them.
    pub(crate) fn clear_leftovers(&self, extra: &[PathBuf]) -> Result<()> {
        for stale in [self.tmp(), self.entry.rootfs()].iter().chain(extra) {
            if fs::symlink_metadata(stale).is_ok() {
                remove_tree(stale)?;
            }
        }
        Ok(())
    }

    /// Makes the tree in [`tmp`](Self::tmp) the entry's: measures it (allocated bytes, files),
    /// syncs it, renames it into place, then writes `READY` with what `record` makes of the
    /// measurements (a producer may write its own files there first). Returns the tree's path.
    pub(crate) fn publish(
        self,
        record: impl FnOnce(u64, u64) -> Result<Vec<u8>>,
    ) -> Result<PathBuf> {
        let (tmp, rootfs) = (self.tmp(), self.entry.rootfs());
        let (size_bytes, files) = disk_usage(&tmp);
        // Durable before it becomes visible: a crash must not leave READY over a tree whose
        // blocks never reached the disk.
        sync_filesystem(&tmp)?;
        fs::rename(&tmp, &rootfs).map_err(ImageError::io("rename into place", &rootfs))?;
        sync_dir(&self.entry.dir)?;
        let json = record(size_bytes, files)?;
        write_atomic(&self.entry.dir.join(READY), &json)?;
        Ok(rootfs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    use crate::progress::Quiet;

    #[tokio::test]
    async fn concurrent_lockers_wait() {
        let dir = tempfile::tempdir().unwrap();
        let entry = Entry::new(dir.path(), "e");
        let first = entry.lock(&Quiet).await.unwrap();
        let waiter = tokio::spawn(async move {
            let _second = entry.lock(&Quiet).await.unwrap();
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "second lock must wait");
        let released = Instant::now();
        drop(first);
        assert!(waiter.await.unwrap() >= released);
    }

    #[tokio::test]
    async fn publish_renames_then_writes_ready_and_leftovers_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let entry = Entry::new(dir.path(), "e");
        let building = entry.lock(&Quiet).await.unwrap();
        // A producer that died: a partial tree, a stale rootfs and a scratch dir.
        let scratch = entry.dir().join("scratch");
        for d in [building.tmp(), entry.rootfs(), scratch.clone()] {
            fs::create_dir_all(d.join("junk")).unwrap();
        }
        building
            .clear_leftovers(std::slice::from_ref(&scratch))
            .unwrap();
        assert!(!building.tmp().exists() && !entry.rootfs().exists() && !scratch.exists());

        fs::create_dir_all(building.tmp().join("etc")).unwrap();
        fs::write(building.tmp().join("etc/hostname"), vec![b'x'; 10_000]).unwrap();
        assert!(!entry.is_ready());
        let rootfs = building
            .publish(|size, files| {
                assert!(size >= 10_000 && files >= 2, "{size} {files}");
                Ok(format!(r#"{{"size_bytes": {size}, "extra": 1}}"#).into_bytes())
            })
            .unwrap();
        assert_eq!(rootfs, entry.rootfs());
        assert!(entry.is_ready());
        assert!(entry.size_bytes() >= 10_000);
    }

    #[test]
    fn a_failed_record_leaves_the_entry_unready() {
        let dir = tempfile::tempdir().unwrap();
        let entry = Entry::new(dir.path(), "e");
        let building = entry.lock_blocking().unwrap();
        fs::create_dir_all(building.tmp()).unwrap();
        let err = building
            .publish(|_, _| Err(ImageError::InvalidRecipe("no".into())))
            .unwrap_err();
        assert!(matches!(err, ImageError::InvalidRecipe(_)), "{err:?}");
        assert!(!entry.is_ready());
    }
}
