//! A sandbox's file changes, read from its overlay upper directory: everything the sandbox
//! wrote is there and nothing else, so listing changes costs nothing while it runs.
//!
//! What the upper directory holds (overlayfs, mounted with `userxattr`):
//! - a regular file, symlink or directory the sandbox created, or a lower one it changed
//!   (copied up whole: metacopy is off);
//! - a *whiteout* (a character device 0/0) where a lower entry was deleted;
//! - an *opaque* directory (xattr `user.overlay.opaque` = `y`, or `trusted.overlay.opaque`
//!   for overlays mounted without `userxattr`) where a lower directory was deleted and made
//!   again: nothing of the lower directory shows through.
//!
//! A path also present in the lower layer (the template) is *modified*, otherwise *created*;
//! a whiteout is *deleted*. Directories that only carry changes further down (copied up as
//! parents) are not listed themselves. The jail's own bookkeeping files (see [`BOOKKEEPING`])
//! are left out. With a baseline (another upper directory, e.g. a snapshot's) only what differs
//! from it is listed, and kinds are relative to it.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use bulkhead_common::confined;
use bulkhead_driver::{ChangeKind, FileChange};

/// Files the jail itself writes into a sandbox's upper directory: not the sandbox's changes.
pub const BOOKKEEPING: [&str; 2] = ["/etc/resolv.conf", crate::mountplan::CA_BUNDLE];

/// Most entries one listing walks (a sandbox could make millions of files).
pub const MAX_ENTRIES: usize = 200_000;

#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("Cannot read the sandbox's filesystem changes at {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("The sandbox changed more than {MAX_ENTRIES} files: the list would be too long")]
    TooMany,
}

type Result<T, E = ChangesError> = std::result::Result<T, E>;

/// One entry of an upper directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// `file`, `dir`, `symlink`, `other`, or `whiteout`.
    kind: &'static str,
    size: u64,
    mtime: i64,
    opaque: bool,
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> ChangesError + '_ {
    move |source| ChangesError::Read {
        path: path.to_owned(),
        source,
    }
}

/// The kind of an entry from its `st_mode` (`lstat`: a symlink is a symlink).
fn type_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        _ => "other",
    }
}

/// Is `name` in the open directory `dir` marked opaque? Looked up through the descriptor's
/// `/proc/self/fd` entry (that very directory, not a path the sandbox could swap), without
/// following `name` itself.
fn is_opaque(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.as_bytes());
    let Ok(p) = CString::new(path) else {
        return false;
    };
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|attr| {
            let n = CString::new(*attr).expect("no NUL");
            let mut buf = [0u8; 4];
            // SAFETY: valid C strings and a buffer whose length is passed alongside it.
            let r = unsafe {
                libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            };
            r == 1 && buf[0] == b'y'
        })
}

/// Every entry under `upper`, by sandbox path (`/a/b`). The sandbox may be running and
/// rearranging its tree meanwhile: the walk goes through [`confined::Walker`], so a directory
/// swapped for a symlink to a host path is never entered (no host entry is ever listed).
fn walk(upper: &Path) -> Result<BTreeMap<String, Entry>> {
    let mut out = BTreeMap::new();
    let walker = match confined::Walker::new(upper) {
        Ok(w) => w,
        // No upper directory (yet): nothing changed.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(read_err(upper)(e)),
    };
    for found in walker {
        let f = found.map_err(read_err(upper))?;
        let mode = f.stat.st_mode;
        let fmt = mode & libc::S_IFMT;
        let whiteout = fmt == libc::S_IFCHR && f.stat.st_rdev == 0;
        let dir = fmt == libc::S_IFDIR;
        let entry = Entry {
            kind: if whiteout {
                "whiteout"
            } else {
                type_name(mode)
            },
            size: if dir || whiteout {
                0
            } else {
                f.stat.st_size as u64
            },
            mtime: f.stat.st_mtime,
            opaque: dir && is_opaque(f.dir.as_fd(), &f.name),
        };
        out.insert(format!("/{}", f.rel.to_string_lossy()), entry);
        if out.len() > MAX_ENTRIES {
            return Err(ChangesError::TooMany);
        }
    }
    Ok(out)
}

/// The template's tree, read the same confined way: a template is a tenant's build too, and
/// its symlinks must not lead the host out of it.
struct Lower(Option<OwnedFd>);

impl Lower {
    fn open(path: &Path) -> Lower {
        Lower(confined::open_root(path).ok())
    }

    /// The directory at sandbox path `path` (`/a/b`), if it is one in the template.
    fn dir(&self, path: &str) -> Option<OwnedFd> {
        let root = self.0.as_ref()?;
        confined::open_dir_beneath(root.as_fd(), Path::new(path.trim_start_matches('/'))).ok()
    }

    /// The type of `path` in the template, if it exists there (through no symlink).
    fn type_of(&self, path: &str) -> Option<&'static str> {
        let rel = Path::new(path.trim_start_matches('/'));
        let (parent, name) = (rel.parent()?, rel.file_name()?);
        let dir = self.dir(&parent.to_string_lossy())?;
        confined::stat_at(dir.as_fd(), name)
            .ok()
            .map(|st| type_name(st.st_mode))
    }

    /// The names and types in the template's directory `path`.
    fn entries(&self, path: &str) -> Vec<(String, &'static str)> {
        let Some(dir) = self.dir(path) else {
            return Vec::new();
        };
        let names = confined::dir_names(dir.as_fd()).unwrap_or_default();
        names
            .into_iter()
            .map(|n| {
                let t = confined::stat_at(dir.as_fd(), &n)
                    .map(|st| type_name(st.st_mode))
                    .unwrap_or("other");
                (n.to_string_lossy().into_owned(), t)
            })
            .collect()
    }
}

/// Is `path` hidden from the lower layer by an opaque directory above it in `upper`?
fn under_opaque(upper: &BTreeMap<String, Entry>, path: &str) -> bool {
    let mut p = path;
    while let Some((parent, _)) = p.rsplit_once('/') {
        if parent.is_empty() {
            return false;
        }
        if upper.get(parent).is_some_and(|e| e.opaque) {
            return true;
        }
        p = parent;
    }
    false
}

/// Does `path` exist in the view made of `upper` over `lower`?
fn visible(upper: &BTreeMap<String, Entry>, lower: &Lower, path: &str) -> bool {
    match upper.get(path) {
        Some(e) => e.kind != "whiteout",
        None => !under_opaque(upper, path) && lower.type_of(path).is_some(),
    }
}

fn change(path: &str, kind: ChangeKind, file_type: &str, e: Option<&Entry>) -> FileChange {
    FileChange {
        path: path.to_string(),
        kind,
        file_type: file_type.to_string(),
        size: e.map_or(0, |e| e.size),
        mtime: e.map(|e| e.mtime),
    }
}

/// The changes of `upper` against `lower`, sorted by path.
fn against_lower(upper: &BTreeMap<String, Entry>, lower: &Lower) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, e) in upper {
        if BOOKKEEPING.contains(&path.as_str()) {
            continue;
        }
        let in_lower = if under_opaque(upper, path) {
            None
        } else {
            lower.type_of(path)
        };
        if e.kind == "whiteout" {
            if let Some(t) = in_lower {
                out.push(change(path, ChangeKind::Deleted, t, None));
            }
            continue;
        }
        match (e.kind, in_lower) {
            // A directory that was there already: a parent of changes, not a change itself,
            // unless it was deleted and made again (opaque).
            ("dir", Some("dir")) if !e.opaque => {}
            (_, Some(_)) => out.push(change(path, ChangeKind::Modified, e.kind, Some(e))),
            (_, None) => out.push(change(path, ChangeKind::Created, e.kind, Some(e))),
        }
        // An opaque directory over a lower one hides all of the lower directory's entries
        // that the upper does not have again: they were deleted.
        if e.opaque && in_lower == Some("dir") {
            for (name, t) in lower.entries(path) {
                let child = format!("{path}/{name}");
                if !upper.contains_key(&child) {
                    out.push(change(&child, ChangeKind::Deleted, t, None));
                }
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The file changes of the overlay `upper` over `lower`, or only those since the upper
/// directory `since` (a snapshot of the same sandbox over the same lower), sorted by path.
pub fn changes(upper: &Path, lower: &Path, since: Option<&Path>) -> Result<Vec<FileChange>> {
    let lower = &Lower::open(lower);
    let now = walk(upper)?;
    let mut list = against_lower(&now, lower);
    let Some(base_dir) = since else {
        return Ok(list);
    };
    let base = walk(base_dir)?;
    // Unchanged since the baseline: the same upper entry (type, size, mtime) in both.
    list.retain(|c| match (now.get(&c.path), base.get(&c.path)) {
        (Some(n), Some(b)) => n.kind != b.kind || n.size != b.size || n.mtime != b.mtime,
        (Some(_), None) => true,
        // A deletion listed from an opaque directory: compare visibility.
        (None, _) => visible(&base, lower, &c.path),
    });
    for c in &mut list {
        let existed = visible(&base, lower, &c.path);
        match c.kind {
            ChangeKind::Deleted => {}
            _ if existed => c.kind = ChangeKind::Modified,
            _ => c.kind = ChangeKind::Created,
        }
    }
    list.retain(|c| c.kind != ChangeKind::Deleted || visible(&base, lower, &c.path));
    // What the baseline had and the sandbox removed since, leaving no trace in the upper
    // directory (a file created after the template and deleted after the snapshot).
    for (path, b) in &base {
        if b.kind == "whiteout" || BOOKKEEPING.contains(&path.as_str()) {
            continue;
        }
        if !visible(&now, lower, path) && !list.iter().any(|c| &c.path == path) {
            // Report the top of a removed tree only.
            let parent_gone = path
                .rsplit_once('/')
                .is_some_and(|(p, _)| !p.is_empty() && !visible(&now, lower, p));
            if !parent_gone {
                list.push(change(path, ChangeKind::Deleted, b.kind, None));
            }
        }
    }
    list.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;

    fn whiteout(path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string; mknod of a 0/0 character device (needs CAP_MKNOD).
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
        assert_eq!(r, 0, "mknod whiteout: {}", io::Error::last_os_error());
    }

    fn opaque(path: &Path) {
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings and value buffer.
        let r = unsafe {
            libc::lsetxattr(
                p.as_ptr(),
                c"user.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        assert_eq!(r, 0, "setxattr: {}", io::Error::last_os_error());
    }

    struct Layers {
        _t: tempfile::TempDir,
        lower: PathBuf,
        upper: PathBuf,
    }

    /// A template with /etc/{passwd,hosts}, /usr/lib/{a,b}, /home/user/.bashrc and the upper
    /// directory of a sandbox over it.
    fn layers() -> Layers {
        let t = tempfile::tempdir().unwrap();
        let lower = t.path().join("lower");
        let upper = t.path().join("upper");
        for d in ["etc", "usr/lib", "home/user"] {
            fs::create_dir_all(lower.join(d)).unwrap();
        }
        for f in [
            "etc/passwd",
            "etc/hosts",
            "usr/lib/a",
            "usr/lib/b",
            "home/user/.bashrc",
        ] {
            fs::write(lower.join(f), "template").unwrap();
        }
        fs::create_dir(&upper).unwrap();
        Layers {
            _t: t,
            lower,
            upper,
        }
    }

    fn summary(list: &[FileChange]) -> Vec<String> {
        list.iter()
            .map(|c| format!("{:?} {} {} {}", c.kind, c.file_type, c.path, c.size))
            .collect()
    }

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn created_modified_deleted_and_opaque() {
        let l = layers();
        let u = &l.upper;
        fs::create_dir_all(u.join("etc")).unwrap();
        fs::write(u.join("etc/passwd"), "changed!").unwrap(); // modified (copied up)
        whiteout(&u.join("etc/hosts")); // deleted
        fs::write(u.join("etc/resolv.conf"), "nameserver 10.200.0.1").unwrap(); // bookkeeping
        fs::create_dir_all(u.join("home/user/proj")).unwrap(); // created dir, parents not
        fs::write(u.join("home/user/proj/main.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink("main.py", u.join("home/user/proj/link")).unwrap();
        // /usr/lib deleted and made again with one new file: opaque.
        fs::create_dir_all(u.join("usr/lib")).unwrap();
        opaque(&u.join("usr/lib"));
        fs::write(u.join("usr/lib/c"), "new").unwrap();

        let list = changes(u, &l.lower, None).unwrap();
        assert_eq!(
            summary(&list),
            [
                "Deleted file /etc/hosts 0",
                "Modified file /etc/passwd 8",
                "Created dir /home/user/proj 0",
                "Created symlink /home/user/proj/link 7",
                "Created file /home/user/proj/main.py 8",
                "Modified dir /usr/lib 0",
                "Deleted file /usr/lib/a 0",
                "Deleted file /usr/lib/b 0",
                "Created file /usr/lib/c 3",
            ]
        );
        assert!(
            list.iter()
                .all(|c| (c.kind == ChangeKind::Deleted) == c.mtime.is_none())
        );
    }

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn since_a_baseline() {
        let l = layers();
        let u = &l.upper;
        // Baseline (a snapshot's upper): /a created, /etc/passwd modified, /etc/hosts deleted,
        // /gone created.
        let base = l._t.path().join("base");
        fs::create_dir_all(base.join("etc")).unwrap();
        fs::write(base.join("a"), "a").unwrap();
        fs::write(base.join("gone"), "g").unwrap();
        fs::write(base.join("etc/passwd"), "changed!").unwrap();
        whiteout(&base.join("etc/hosts"));
        // Now: the same, plus /a rewritten, /b created, /gone removed, .bashrc deleted.
        fs::create_dir_all(u.join("etc")).unwrap();
        fs::create_dir_all(u.join("home/user")).unwrap();
        fs::write(u.join("etc/passwd"), "changed!").unwrap();
        whiteout(&u.join("etc/hosts"));
        fs::write(u.join("a"), "a, longer").unwrap();
        fs::write(u.join("b"), "b").unwrap();
        whiteout(&u.join("home/user/.bashrc"));
        // Same mtime for the unchanged copy.
        let t = fs::metadata(base.join("etc/passwd"))
            .unwrap()
            .modified()
            .unwrap();
        fs::File::options()
            .write(true)
            .open(u.join("etc/passwd"))
            .unwrap()
            .set_modified(t)
            .unwrap();

        let list = changes(u, &l.lower, Some(&base)).unwrap();
        assert_eq!(
            summary(&list),
            [
                "Modified file /a 9",
                "Created file /b 1",
                "Deleted file /gone 0",
                "Deleted file /home/user/.bashrc 0",
            ]
        );
    }

    /// A host directory with recognisable names, next to the layers.
    fn host_dir(l: &Layers) -> PathBuf {
        let host = l._t.path().join("host");
        fs::create_dir_all(host.join("HOST-DIR/y")).unwrap();
        fs::write(host.join("HOST-SECRET"), "host").unwrap();
        fs::write(host.join("HOST-DIR/y/HOST-NESTED"), "host").unwrap();
        host
    }

    fn assert_no_host_entry(list: &[FileChange]) {
        let leaked: Vec<_> = list.iter().filter(|c| c.path.contains("HOST-")).collect();
        assert!(leaked.is_empty(), "host entries listed: {leaked:?}");
    }

    /// What a sandbox leaves after swapping a directory for a symlink to a host path: the
    /// link is listed as a link, nothing beneath its target.
    #[test]
    fn a_symlink_where_a_directory_was_is_not_followed() {
        let l = layers();
        let host = host_dir(&l);
        fs::create_dir_all(l.upper.join("home/user/w")).unwrap();
        std::os::unix::fs::symlink(&host, l.upper.join("home/user/w/flip")).unwrap();
        std::os::unix::fs::symlink(&host, l.upper.join("escape")).unwrap();
        let list = changes(&l.upper, &l.lower, None).unwrap();
        assert_no_host_entry(&list);
        assert_eq!(
            summary(&list)
                .into_iter()
                .filter(|s| s.contains("symlink"))
                .collect::<Vec<_>>(),
            [
                format!("Created symlink /escape {}", host.as_os_str().len()),
                format!(
                    "Created symlink /home/user/w/flip {}",
                    host.as_os_str().len()
                ),
            ]
        );
        // The same tree as a baseline (`since`): walked the same way.
        let again = changes(&l.upper, &l.lower, Some(&l.upper)).unwrap();
        assert!(again.is_empty(), "{again:?}");
    }

    /// A template built from a tenant's steps can hold symlinks to host paths: looking a
    /// sandbox path up in the lower tree never resolves through them (here an upper `/x/y`
    /// under a lower `x -> host dir` would have listed the host's `y/HOST-NESTED` as deleted).
    #[test]
    fn lower_symlinks_are_not_followed() {
        let l = layers();
        let host = host_dir(&l);
        std::os::unix::fs::symlink(host.join("HOST-DIR"), l.lower.join("x")).unwrap();
        fs::create_dir_all(l.upper.join("x/y")).unwrap();
        opaque(&l.upper.join("x/y"));
        let list = changes(&l.upper, &l.lower, None).unwrap();
        assert_no_host_entry(&list);
        assert!(
            summary(&list).contains(&"Created dir /x/y 0".to_string()),
            "{list:?}"
        );
    }

    /// The attack itself: a thread swaps a directory and a symlink to a host directory
    /// (`renameat2(RENAME_EXCHANGE)`, as a sandbox can in its upper dir) as fast as it can,
    /// among many siblings that widen the window, while listings run for a few seconds. No
    /// entry of the host directory may ever appear.
    #[test]
    fn a_racing_directory_symlink_swap_never_lists_the_host() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::time::{Duration, Instant};

        let l = layers();
        let host = host_dir(&l);
        let w = l.upper.join("w");
        fs::create_dir_all(w.join("flip/sub")).unwrap();
        fs::write(w.join("flip/inside"), "mine").unwrap();
        std::os::unix::fs::symlink(&host, w.join("flipl")).unwrap();
        for i in 0..3000 {
            fs::write(w.join(format!("f{i:04}")), "").unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let swapper = {
            let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
            let a = CString::new(w.join("flip").as_os_str().as_bytes()).unwrap();
            let b = CString::new(w.join("flipl").as_os_str().as_bytes()).unwrap();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: valid C strings; renameat2 with integer flags.
                    let r = unsafe {
                        libc::syscall(
                            libc::SYS_renameat2,
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(r, 0, "renameat2: {}", io::Error::last_os_error());
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(4);
        let (mut listings, mut saw_inside) = (0u64, 0u64);
        while Instant::now() < deadline {
            let list = changes(&l.upper, &l.lower, None);
            let list = match list {
                Ok(list) => list,
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    panic!("listing failed: {e}");
                }
            };
            if list.iter().any(|c| c.path.contains("HOST-")) {
                stop.store(true, Ordering::Relaxed);
            }
            assert_no_host_entry(&list);
            saw_inside += u64::from(list.iter().any(|c| c.path.ends_with("/inside")));
            listings += 1;
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let swaps = swaps.load(Ordering::Relaxed);
        assert!(
            listings > 10 && swaps > 1000,
            "{listings} listings, {swaps} swaps"
        );
        // The walk did see the directory's own entries (under either name) while it raced.
        assert!(
            saw_inside > 0,
            "{listings} listings never saw w/flip/inside"
        );
    }

    #[test]
    fn an_empty_upper_has_no_changes_and_parents_are_not_listed() {
        let l = layers();
        assert!(changes(&l.upper, &l.lower, None).unwrap().is_empty());
        fs::create_dir_all(l.upper.join("home/user")).unwrap();
        fs::write(l.upper.join("home/user/new"), "x").unwrap();
        let list = changes(&l.upper, &l.lower, None).unwrap();
        assert_eq!(summary(&list), ["Created file /home/user/new 1"]);
    }
}
