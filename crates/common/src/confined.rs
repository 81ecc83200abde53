//! Reading a directory tree that an untrusted party can change while the host reads it (a
//! running sandbox's overlay upper directory, a volume): the one primitive every host-side walk
//! of sandbox-written files goes through.
//!
//! A path-based walk (`read_dir(dir)`, then `read_dir(dir/child)`) is raceable: between the
//! listing and the next open, the sandbox can swap `child` for a symlink to any host directory
//! (`renameat2(RENAME_EXCHANGE)`), and the host would list, stat or change the host's files.
//! Here every directory is opened with `openat2` beneath a descriptor of the tree's root with
//! [`RESOLVE_CONFINED`] (no symlink anywhere on the way, no magic link, no other mount, never
//! above the root), and every entry is examined relative to its directory's descriptor without
//! following it. A swap makes the open fail (`ELOOP`/`ENOTDIR`); it never leads outside.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// `openat2` resolution for sandbox-written trees: beneath the root, through no symlink or
/// magic link, onto no other mount.
pub const RESOLVE_CONFINED: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

/// Open the root of a tree (a host path the server chose; its last component is not followed
/// either, so it must be the directory itself).
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// `openat2(root, rel, flags)` with `resolve`, retried on `EAGAIN`/`EINTR` (the kernel answers
/// `EAGAIN` when a concurrent rename could have raced the lookup). `rel` empty is the root.
pub fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    resolve: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(resolve);
    loop {
        match openat2(root, rel, how) {
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// The directory at `rel` beneath `root`, opened for listing with [`RESOLVE_CONFINED`].
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> nix::Result<OwnedFd> {
    open_beneath(
        root,
        rel,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        RESOLVE_CONFINED,
    )
}

/// The directory `name` in `dir`, never following a symlink (`O_NOFOLLOW | O_DIRECTORY`).
pub fn open_subdir(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// `lstat` of `name` in `dir`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// Is this a directory (from its `st_mode`)?
pub fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) == SFlag::S_IFDIR
}

/// The names in an open directory (without `.` and `..`). Read through the descriptor's
/// `/proc/self/fd` entry, which opens that very directory, not a path that could be swapped.
pub fn dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let rd = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
    let mut names = Vec::new();
    for entry in rd {
        names.push(entry?.file_name());
    }
    Ok(names)
}

/// One entry found by a [`Walker`].
#[derive(Debug)]
pub struct Found {
    /// Path relative to the walk's root (`a/b`).
    pub rel: PathBuf,
    /// The entry's name in [`dir`](Self::dir).
    pub name: OsString,
    /// The directory holding the entry: operate on the entry with `*at(dir, name, NOFOLLOW)`.
    pub dir: Rc<OwnedFd>,
    /// The entry itself (`lstat`), taken when it was found.
    pub stat: FileStat,
}

/// Every entry beneath a root directory, depth first, each directory opened with
/// [`open_dir_beneath`] from the root's descriptor (so at most two descriptors are open).
///
/// Entries that disappear or change type while the walk runs (the sandbox is running) are
/// skipped: a directory that became a symlink is listed as found but never entered. Paths over
/// `PATH_MAX` cannot be opened beneath the root and end the walk with `ENAMETOOLONG`.
pub struct Walker {
    root: OwnedFd,
    /// Directories still to list (relative to the root).
    pending: Vec<PathBuf>,
    /// The directory being listed and its remaining names.
    current: Option<(Rc<OwnedFd>, PathBuf, std::vec::IntoIter<OsString>)>,
}

impl Walker {
    /// Walk beneath `root` (see [`open_root`]).
    pub fn new(root: &Path) -> io::Result<Walker> {
        Ok(Walker::from_fd(open_root(root)?))
    }

    /// Walk beneath an open directory.
    pub fn from_fd(root: OwnedFd) -> Walker {
        Walker {
            root,
            pending: vec![PathBuf::new()],
            current: None,
        }
    }

    /// The walk's root.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens and lists the next pending directory; `Ok(false)` when none is left.
    fn next_dir(&mut self) -> io::Result<bool> {
        while let Some(rel) = self.pending.pop() {
            let dir = match open_dir_beneath(self.root.as_fd(), &rel) {
                Ok(d) => d,
                // Gone, or swapped for a symlink or a file since it was listed: not ours to
                // follow, and nothing of the tree is left there.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => continue,
                Err(e) => return Err(io::Error::from(e)),
            };
            let names = match dir_names(dir.as_fd()) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            self.current = Some((Rc::new(dir), rel, names.into_iter()));
            return Ok(true);
        }
        Ok(false)
    }
}

impl Iterator for Walker {
    type Item = io::Result<Found>;

    fn next(&mut self) -> Option<io::Result<Found>> {
        loop {
            if let Some((dir, rel, names)) = &mut self.current {
                for name in names.by_ref() {
                    let stat = match stat_at(dir.as_fd(), &name) {
                        Ok(st) => st,
                        Err(Errno::ENOENT) => continue,
                        Err(e) => return Some(Err(io::Error::from(e))),
                    };
                    let child = rel.join(&name);
                    if is_dir(&stat) {
                        self.pending.push(child.clone());
                    }
                    return Some(Ok(Found {
                        rel: child,
                        name,
                        dir: Rc::clone(dir),
                        stat,
                    }));
                }
                self.current = None;
            }
            match self.next_dir() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::ffi::OsStrExt;

    fn rels(root: &Path) -> BTreeSet<String> {
        Walker::new(root)
            .unwrap()
            .map(|f| f.unwrap().rel.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn walks_everything_beneath_and_follows_no_symlink() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let host = t.path().join("host");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("host-secret"), "x").unwrap();
        std::fs::write(root.join("a/b/f"), "f").unwrap();
        std::os::unix::fs::symlink(&host, root.join("a/abs")).unwrap();
        std::os::unix::fs::symlink("../../host", root.join("a/rel")).unwrap();
        std::os::unix::fs::symlink("b", root.join("a/inside")).unwrap();
        assert_eq!(
            rels(&root),
            ["a", "a/abs", "a/b", "a/b/f", "a/inside", "a/rel"]
                .map(String::from)
                .into()
        );
    }

    /// A directory replaced by a symlink after it was listed (what a racing sandbox does):
    /// the walker refuses to enter it.
    #[test]
    fn a_directory_swapped_for_a_symlink_is_not_entered() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let host = t.path().join("host");
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("host-secret"), "x").unwrap();
        let mut w = Walker::new(&root).unwrap();
        let first = w.next().unwrap().unwrap();
        assert_eq!(first.rel, Path::new("d"));
        std::fs::remove_dir_all(root.join("d")).unwrap();
        std::os::unix::fs::symlink(&host, root.join("d")).unwrap();
        let rest: Vec<_> = w.map(|f| f.unwrap().rel).collect();
        assert!(rest.is_empty(), "{rest:?}");
        // The same with the root's own descriptor: `rel` through the symlink is refused.
        let fd = open_root(&root).unwrap();
        assert_eq!(
            open_dir_beneath(fd.as_fd(), Path::new("d")).unwrap_err(),
            Errno::ELOOP
        );
        assert!(matches!(
            open_subdir(fd.as_fd(), OsStr::from_bytes(b"d")),
            Err(Errno::ENOTDIR | Errno::ELOOP)
        ));
    }
}
