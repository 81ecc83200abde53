//! Garbage collection of the cache: entries (pulled images, build layers, built trees) that
//! nothing references any more and nobody used for a grace period are removed, so deleted
//! templates and refused pulls do not keep their trees forever.
//!
//! The caller (the engine) says what is referenced: every tree a registered template, a
//! sandbox or a checkpoint names. On top of that an entry is kept while
//! - any mount in this mount namespace comes from it (a jail's idmapped view of a template is
//!   a bind mount of its tree, kept while a sandbox runs on it),
//! - its lock is held (a producer is writing it, or waiting to),
//! - it was written within the grace period (a build that has just pulled it and has not
//!   registered its template yet),
//!
//! and the caller can stop the collection between two removals (the engine does while a
//! template build runs: a build may have just taken a cached tree nothing references yet).
//!
//! Removal holds the entry's lock and deletes `READY` first, so a reader that looks at the
//! entry meanwhile sees "not built" (and rebuilds it), never a half-deleted tree.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::cache::ImageCache;
use crate::entry::READY;
use crate::error::{ImageError, Result};
use crate::fsutil::remove_tree;

/// What one collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Hashes of the entries removed.
    pub removed: Vec<String>,
    /// Entries kept because something references or mounts them.
    pub referenced: usize,
    /// Entries kept because they were used within the grace period or are being written.
    pub recent: usize,
    /// Allocated bytes freed (as `READY` recorded them, else measured).
    pub freed_bytes: u64,
}

/// True for a cache entry's directory name (a sha256 hex digest): nothing else in the cache
/// root is ever touched.
fn is_entry_name(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Every cache entry directory (`<root>/<64 hex>`) that `text` names: for scanning the JSON a
/// driver or checkpoint wrote (handles, manifests), which name trees by path.
pub fn entries_named_in(root: &Path, text: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for root in [Some(root.to_owned()), root.canonicalize().ok()]
        .into_iter()
        .flatten()
    {
        let prefix = format!("{}/", root.display());
        let mut rest = text;
        while let Some(i) = rest.find(&prefix) {
            let after = &rest[i + prefix.len()..];
            if let Some(name) = after.get(..64)
                && is_entry_name(name)
            {
                out.push(root.join(name));
            }
            rest = &rest[i + prefix.len()..];
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Hashes of the entries that mounts in this namespace come from or sit in: the mount point,
/// the mounted root (relative to its filesystem, so matched by the entry's name) and the
/// options (an overlay's `lowerdir=`).
fn mounted_entries() -> Vec<String> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in info.lines() {
        for segment in line.split(['/', ' ', ',', ':', '=']) {
            if is_entry_name(segment) {
                out.push(segment.to_owned());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// When the entry was last written (its directory, or `READY`).
fn last_written(dir: &Path) -> Option<SystemTime> {
    [dir.to_owned(), dir.join(READY)]
        .iter()
        .filter_map(|p| fs::symlink_metadata(p).ok()?.modified().ok())
        .max()
}

impl ImageCache {
    /// Removes every entry that no path in `referenced` lies in (a template's rootfs, a tree
    /// named by a sandbox's handle or a checkpoint), that no mount comes from, whose lock is
    /// free and that was not written within `grace`; asks `proceed` before each removal and
    /// stops when it says no. Needs write access to the cache.
    pub fn collect_garbage(
        &self,
        referenced: &[PathBuf],
        grace: Duration,
        proceed: &dyn Fn() -> bool,
    ) -> Result<GcReport> {
        let root = self.root();
        let canonical_root = root.canonicalize().ok();
        let mut keep: Vec<String> = mounted_entries();
        for r in referenced {
            for base in [Some(root), canonical_root.as_deref()]
                .into_iter()
                .flatten()
            {
                let candidates = [Some(r.clone()), r.canonicalize().ok()];
                for c in candidates.into_iter().flatten() {
                    if let Ok(rel) = c.strip_prefix(base)
                        && let Some(first) = rel.components().next()
                    {
                        keep.push(first.as_os_str().to_string_lossy().into_owned());
                    }
                }
            }
        }
        keep.sort();
        keep.dedup();

        let mut report = GcReport::default();
        let entries = match fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
            Err(e) => return Err(ImageError::io("list", root)(e)),
        };
        let now = SystemTime::now();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_entry_name(&name) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if keep.binary_search(&name).is_ok() {
                report.referenced += 1;
                continue;
            }
            let dir = e.path();
            let recent = |dir: &Path| {
                last_written(dir).is_none_or(|t| now.duration_since(t).unwrap_or_default() < grace)
            };
            if !proceed() {
                break;
            }
            if recent(&dir) {
                report.recent += 1;
                continue;
            }
            // The lock, without waiting: a producer holding it is writing the entry.
            let lock = match fs::OpenOptions::new().write(true).open(dir.join("lock")) {
                Ok(f) => match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                    Ok(l) => Some(l),
                    Err((_, Errno::EWOULDBLOCK)) => {
                        report.recent += 1;
                        continue;
                    }
                    Err((_, e)) => {
                        return Err(ImageError::io("lock", dir.join("lock"))(e.into()));
                    }
                },
                Err(_) => None, // never locked: nobody produces it
            };
            // Checked again under the lock: a producer may have just finished it.
            if recent(&dir) {
                report.recent += 1;
                continue;
            }
            let size = crate::entry::Entry::new(root, &name).size_bytes();
            // READY first: from here on the entry reads as "not built", never as half-gone.
            match fs::remove_file(dir.join(READY)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::io("remove", dir.join(READY))(e)),
            }
            let subdirs = fs::read_dir(&dir).map_err(ImageError::io("list", &dir))?;
            for s in subdirs.flatten() {
                if s.file_name() != "lock" {
                    remove_tree(&s.path())?;
                }
            }
            drop(lock);
            let _ = fs::remove_file(dir.join("lock"));
            // A producer that opened the lock meanwhile recreates the directory itself.
            let _ = fs::remove_dir(&dir);
            tracing::info!(entry = %name, bytes = size, "removed an unused image cache entry");
            report.freed_bytes += size;
            report.removed.push(name);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";

    fn entry(root: &Path, hash: &str, ready: bool) -> PathBuf {
        let dir = root.join(hash);
        fs::create_dir_all(dir.join("rootfs/etc")).unwrap();
        fs::write(dir.join("rootfs/etc/hostname"), hash).unwrap();
        fs::write(dir.join("lock"), b"").unwrap();
        if ready {
            fs::write(dir.join(READY), br#"{"size_bytes": 4096}"#).unwrap();
        }
        dir
    }

    /// Ages every file of an entry (as if written `secs` ago).
    fn age(dir: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        for p in [dir.to_owned(), dir.join(READY)] {
            if let Ok(f) = fs::File::options()
                .write(true)
                .open(&p)
                .or_else(|_| fs::File::open(&p))
            {
                let _ = f.set_modified(t);
            }
        }
    }

    #[test]
    fn removes_unreferenced_old_entries_and_keeps_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(t.path());
        let referenced = entry(t.path(), A, true);
        let unreferenced = entry(t.path(), B, true);
        let failed_pull = entry(t.path(), C, false);
        let fresh = entry(t.path(), D, true);
        for d in [&referenced, &unreferenced, &failed_pull] {
            age(d, 7200);
        }
        // Not entries: never touched, whatever their age.
        fs::create_dir(t.path().join("not-an-entry")).unwrap();
        fs::write(t.path().join(format!("{A}.json")), b"{}").unwrap();

        let grace = Duration::from_secs(3600);
        let report = cache
            .collect_garbage(&[referenced.join("rootfs")], grace, &|| true)
            .unwrap();
        let mut removed = report.removed.clone();
        removed.sort();
        assert_eq!(removed, [B.to_owned(), C.to_owned()], "{report:?}");
        assert_eq!((report.referenced, report.recent), (1, 1), "{report:?}");
        assert!(report.freed_bytes >= 4096);
        assert!(referenced.join("rootfs/etc/hostname").is_file());
        assert!(fresh.join("rootfs/etc/hostname").is_file());
        assert!(!unreferenced.exists() && !failed_pull.exists());
        assert!(t.path().join("not-an-entry").is_dir());
        assert!(t.path().join(format!("{A}.json")).is_file());

        // The caller says stop (a build started): nothing more is removed.
        age(&fresh, 7200);
        let r = cache.collect_garbage(&[], grace, &|| false).unwrap();
        assert!(r.removed.is_empty() && fresh.exists(), "{r:?}");
        // Once the grace has passed and nothing references them, the rest goes.
        let r = cache.collect_garbage(&[], grace, &|| true).unwrap();
        assert_eq!(r.removed.len(), 2, "{r:?}");
        assert!(!referenced.exists() && !fresh.exists());
    }

    #[test]
    fn a_locked_entry_is_being_written_and_stays() {
        let t = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(t.path());
        let dir = entry(t.path(), A, false);
        age(&dir, 7200);
        let held = Flock::lock(
            fs::OpenOptions::new()
                .write(true)
                .open(dir.join("lock"))
                .unwrap(),
            FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        let r = cache
            .collect_garbage(&[], Duration::from_secs(60), &|| true)
            .unwrap();
        assert!(r.removed.is_empty() && dir.join("rootfs").is_dir(), "{r:?}");
        drop(held);
        let r = cache
            .collect_garbage(&[], Duration::from_secs(60), &|| true)
            .unwrap();
        assert_eq!(r.removed, [A.to_owned()]);
    }

    #[test]
    fn references_are_found_in_handles_and_manifests_by_path() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("images");
        let text = format!(
            r#"{{"rootfs":"{r}/{A}/rootfs","lowers":["{r}/{B}/rootfs"],"x":"{r}/short/rootfs","y":"/elsewhere/{C}/rootfs"}}"#,
            r = root.display()
        );
        assert_eq!(
            entries_named_in(&root, &text),
            vec![root.join(A), root.join(B)]
        );
    }
}
