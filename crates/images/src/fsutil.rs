//! Filesystem helpers that are careful about mounts: bootstrap tools mount /proc, /sys and /dev
//! inside the tree they build and may leave them behind when killed, and a plain recursive
//! delete would then walk into the host's /dev or /sys.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{ImageError, Result};

/// Mount points at or below `path`, deepest first.
pub(crate) fn mounts_under(path: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(path))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(v) = b
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches every mount at or below `path` (left by an interrupted bootstrap).
pub(crate) fn unmount_under(path: &Path) -> Result<()> {
    let Ok(path) = path.canonicalize() else {
        return Ok(()); // does not exist: nothing can be mounted there
    };
    for m in mounts_under(&path) {
        tracing::warn!(mount = %m.display(), "unmounting leftover mount from an earlier build");
        // MNT_DETACH: a busy mount still disappears from the tree we are about to delete.
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount = %m.display(), error = %e, "umount failed");
        }
    }
    if mounts_under(&path).is_empty() {
        Ok(())
    } else {
        Err(ImageError::StillMounted { path })
    }
}

/// Deletes `path` recursively without ever descending into another filesystem, after
/// detaching leftover mounts. Missing paths are fine.
pub(crate) fn remove_tree(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("inspect", path)(e)),
    };
    if meta.is_dir() {
        unmount_under(path)?;
        remove_dir_same_dev(path, meta.dev())
    } else {
        fs::remove_file(path).map_err(ImageError::io("delete", path))
    }
}

fn remove_dir_same_dev(dir: &Path, dev: u64) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(ImageError::io("list", dir))?;
    for entry in entries {
        let entry = entry.map_err(ImageError::io("list", dir))?;
        let p = entry.path();
        let meta = fs::symlink_metadata(&p).map_err(ImageError::io("inspect", &p))?;
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(ImageError::StillMounted { path: p });
            }
            remove_dir_same_dev(&p, dev)?;
        } else {
            fs::remove_file(&p).map_err(ImageError::io("delete", &p))?;
        }
    }
    fs::remove_dir(dir).map_err(ImageError::io("delete", dir))
}

/// Disk usage (allocated blocks, hard links counted once) and file count of a tree, staying on
/// one filesystem. Entries vanishing during the walk are skipped.
pub(crate) fn disk_usage(path: &Path) -> (u64, u64) {
    fn walk(p: &Path, dev: u64, seen: &mut HashSet<(u64, u64)>, bytes: &mut u64, files: &mut u64) {
        let Ok(meta) = fs::symlink_metadata(p) else {
            return;
        };
        if meta.dev() != dev {
            return;
        }
        if seen.insert((meta.dev(), meta.ino())) {
            *bytes += meta.blocks() * 512;
            *files += 1;
        }
        if meta.is_dir()
            && let Ok(rd) = fs::read_dir(p)
        {
            for e in rd.flatten() {
                walk(&e.path(), dev, seen, bytes, files);
            }
        }
    }
    let Ok(meta) = fs::symlink_metadata(path) else {
        return (0, 0);
    };
    let (mut bytes, mut files) = (0, 0);
    walk(
        path,
        meta.dev(),
        &mut HashSet::new(),
        &mut bytes,
        &mut files,
    );
    (bytes, files)
}

/// Writes `contents` to `path` via a temp file and rename, then syncs the directory, so readers
/// see either nothing or the whole file even across a crash.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(ImageError::io("create", &tmp))?;
    f.write_all(contents)
        .map_err(ImageError::io("write", &tmp))?;
    f.sync_all().map_err(ImageError::io("sync", &tmp))?;
    fs::rename(&tmp, path).map_err(ImageError::io("rename into place", path))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(ImageError::io("sync", dir))
}

/// Flushes the whole filesystem holding `path` (the freshly written tree) to disk.
pub(crate) fn sync_filesystem(path: &Path) -> Result<()> {
    let f = fs::File::open(path).map_err(ImageError::io("open", path))?;
    nix::unistd::syncfs(&f).map_err(|e| ImageError::io("sync", path)(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mountinfo(r"/a\040b\011c"), "/a b\tc");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/trailing\"), "/trailing\\");
    }

    #[test]
    fn remove_tree_and_disk_usage() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        fs::create_dir_all(t.join("a/b")).unwrap();
        fs::write(t.join("a/b/f"), vec![1u8; 10_000]).unwrap();
        fs::hard_link(t.join("a/b/f"), t.join("a/g")).unwrap();
        std::os::unix::fs::symlink("/etc", t.join("link")).unwrap();
        let (bytes, files) = disk_usage(&t);
        assert!(bytes >= 10_000, "{bytes}");
        assert_eq!(files, 5, "t, a, b, f (g is the same inode), link");
        remove_tree(&t).unwrap();
        assert!(!t.exists());
        assert!(Path::new("/etc").is_dir(), "symlink target untouched");
        remove_tree(&t).unwrap();
    }

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn refuses_to_cross_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m");
        fs::create_dir(&m).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &m,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        fs::write(m.join("keep"), "x").unwrap();
        let dev = fs::symlink_metadata(dir.path()).unwrap().dev();
        let err = remove_dir_same_dev(dir.path(), dev).unwrap_err();
        assert!(matches!(err, ImageError::StillMounted { .. }), "{err:?}");
        assert!(m.join("keep").exists(), "nothing deleted through the mount");
        // remove_tree detaches the mount first, so the tmpfs file is never deleted through it.
        remove_tree(dir.path()).unwrap();
        assert!(!dir.path().exists());
        assert!(mounts_under(dir.path()).is_empty());
    }
}
