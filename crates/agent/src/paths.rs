//! Resolution of client-supplied paths.
//!
//! Paths are resolved the way envd does: `~` and `~/x` expand to the user's home, relative paths
//! are joined to the user's home, and the result is cleaned lexically (`.` and `..` removed, `..`
//! never climbing above `/`). The agent's root is the sandbox's root (it runs after
//! `pivot_root`), so the kernel, running the operation with the user's credentials, is what
//! enforces access; symlinks are left for the kernel to follow.
//!
//! Resolved paths are checked against the kernel's limits up front ([`NAME_MAX`] bytes per
//! component, [`PATH_MAX`] for the whole path), so an overlong path is the client's error
//! (`400`/`invalid_argument`) rather than an `ENAMETOOLONG` surfacing as a server failure.
//!
//! A leaf: it imports nothing from the crate.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Longest file name (one path component) Linux accepts, in bytes.
pub const NAME_MAX: usize = 255;
/// Size of the kernel's path buffer, in bytes, including the terminating NUL: a path may be at
/// most `PATH_MAX - 1` bytes long.
pub const PATH_MAX: usize = 4096;

/// Errors resolving a path.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    /// `~name/...` (another user's home) is not supported.
    #[error("Cannot expand {0:?}: only `~` and `~/...` (the requesting user's home) are supported")]
    OtherUsersHome(String),
    /// The path contains a NUL byte.
    #[error("Path {0:?} contains a NUL byte; remove it")]
    Nul(String),
    /// A component of the path is longer than [`NAME_MAX`] bytes.
    #[error(
        "File name too long: a path component is {len} bytes, at most {NAME_MAX} are allowed; use shorter names"
    )]
    NameTooLong {
        /// Length of the offending component, in bytes.
        len: usize,
    },
    /// The resolved path is [`PATH_MAX`] bytes or longer.
    #[error(
        "Path too long: it is {len} bytes once resolved, at most {} are allowed; use a shorter path",
        PATH_MAX - 1
    )]
    PathTooLong {
        /// Length of the resolved path, in bytes.
        len: usize,
    },
    /// The kernel refused the path with `ENAMETOOLONG` (e.g. once symlinks were followed).
    #[error(
        "File name or path too long for the kernel (once symlinks are followed); use shorter names"
    )]
    KernelTooLong,
}

/// Resolves `path` for a user whose home is `home`. An empty path means `base` when given
/// (the sandbox's default working directory), else the home directory.
pub fn resolve(path: &str, home: &Path, base: Option<&Path>) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_owned()));
    }
    if path.is_empty() {
        return Ok(clean(base.unwrap_or(home)));
    }
    let expanded = if let Some(rest) = path.strip_prefix('~') {
        if rest.is_empty() {
            home.to_path_buf()
        } else if let Some(rest) = rest.strip_prefix('/') {
            home.join(rest)
        } else {
            return Err(PathError::OtherUsersHome(path.to_owned()));
        }
    } else {
        PathBuf::from(path)
    };
    let resolved = if expanded.is_absolute() {
        clean(&expanded)
    } else {
        clean(&home.join(expanded))
    };
    check_length(&resolved)?;
    Ok(resolved)
}

/// Checks `path` against the kernel's [`NAME_MAX`] and [`PATH_MAX`] limits.
pub fn check_length(path: &Path) -> Result<(), PathError> {
    if let Some(len) = path
        .components()
        .map(|c| c.as_os_str().len())
        .find(|len| *len > NAME_MAX)
    {
        return Err(PathError::NameTooLong { len });
    }
    let len = path.as_os_str().as_bytes().len();
    if len >= PATH_MAX {
        return Err(PathError::PathTooLong { len });
    }
    Ok(())
}

/// Creates `path` and missing parents with mode 0755 (before umask), as the calling thread's
/// credentials allow.
pub fn create_dirs(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
}

/// Creates the missing directories of `path` one by one with mode 0755, each handed to
/// `uid:gid`, as envd's `EnsureDirs` does: the agent's own (sandbox root) credentials create
/// them, so a user can write `/0/x.txt` or make `/newtop/a/b` as on E2B, and the new
/// directories belong to that user. Existing directories are left as they are (a symlink to
/// one is followed, as envd's `os.Stat` does); an existing non-directory is `ENOTDIR`.
///
/// The walk holds a descriptor of each directory and names only the next component, and the
/// ownership goes to the directory it just made, opened without following a symlink: a user
/// who swaps a parent or the new directory for a symlink meanwhile cannot make the agent chown
/// anything else (a path-based `chown` would follow the swapped link, to `/etc/passwd` say).
pub fn ensure_dirs_owned(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut dir = open_dir(libc::AT_FDCWD, Path::new("/"), true)?;
    for component in path.components() {
        let Component::Normal(name) = component else {
            continue; // `path` is absolute and clean: only the root before the names
        };
        let name = Path::new(name);
        dir = match open_dir(dir.as_raw_fd(), name, true) {
            Ok(next) => next,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                match mkdir_at(dir.as_raw_fd(), name) {
                    Ok(()) => {
                        let made = open_dir(dir.as_raw_fd(), name, false)?;
                        chown_fd(made.as_raw_fd(), uid, gid)?;
                        made
                    }
                    // Another writer created it meanwhile: theirs, so it keeps its owner.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        open_dir(dir.as_raw_fd(), name, true)?
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
    }
    Ok(())
}

/// `openat(dir, name, O_PATH | O_DIRECTORY)`, following a final symlink only when asked.
fn open_dir(dir: RawFd, name: &Path, follow: bool) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: `c` is a valid C string; the kernel returns a new descriptor or -1.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mkdir_at(dir: RawFd, name: &Path) -> io::Result<()> {
    let c = CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid C string.
    if unsafe { libc::mkdirat(dir, c.as_ptr(), 0o755) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: the `O_PATH` descriptor's own inode.
fn chown_fd(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: a static empty C string; AT_EMPTY_PATH makes the call act on `fd` itself.
    if unsafe { libc::fchownat(fd, c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lexically normalises an absolute path: drops `.`, applies `..` (stopping at `/`), and
/// removes repeated and trailing separators. A relative input is treated as relative to `/`.
pub fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
    out
}

/// `path` relative to `root`, as envd reports watch event names (`.` for the root itself).
pub fn relative_name(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => path.to_string_lossy().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(p: &str) -> Result<PathBuf, PathError> {
        resolve(p, Path::new("/home/user"), None)
    }

    #[test]
    fn resolves_like_envd() {
        assert_eq!(r("a.txt").unwrap(), PathBuf::from("/home/user/a.txt"));
        assert_eq!(r("./dir//b/").unwrap(), PathBuf::from("/home/user/dir/b"));
        assert_eq!(r("~").unwrap(), PathBuf::from("/home/user"));
        assert_eq!(r("~/x/../y").unwrap(), PathBuf::from("/home/user/y"));
        assert_eq!(r("/etc/./passwd").unwrap(), PathBuf::from("/etc/passwd"));
        assert_eq!(r("../../../../etc").unwrap(), PathBuf::from("/etc"));
        assert_eq!(r("/../..").unwrap(), PathBuf::from("/"));
        assert_eq!(r("").unwrap(), PathBuf::from("/home/user"));
        assert_eq!(
            resolve("", Path::new("/home/user"), Some(Path::new("/work"))).unwrap(),
            PathBuf::from("/work")
        );
        assert_eq!(
            resolve("rel", Path::new("/home/user"), Some(Path::new("/work"))).unwrap(),
            PathBuf::from("/home/user/rel")
        );
        assert!(matches!(r("~root/x"), Err(PathError::OtherUsersHome(_))));
        assert!(matches!(r("a\0b"), Err(PathError::Nul(_))));
    }

    #[test]
    fn overlong_paths_are_refused() {
        let long_name = "a".repeat(NAME_MAX + 1);
        assert_eq!(
            r(&long_name),
            Err(PathError::NameTooLong { len: NAME_MAX + 1 })
        );
        assert!(r(&"a".repeat(NAME_MAX)).is_ok());
        let deep = format!("/{}", ["b"; 2048].join("/"));
        assert_eq!(r(&deep), Err(PathError::PathTooLong { len: 4096 }));
        assert!(r(&deep[..4095]).is_ok());
        // Only the resolved path counts: `..` may make a long input short.
        let back = format!("/{}/x", ["a/.."; 2000].join("/"));
        assert_eq!(r(&back).unwrap(), PathBuf::from("/x"));
    }

    #[test]
    fn relative_names() {
        let root = Path::new("/w");
        assert_eq!(relative_name(root, Path::new("/w/a/b")), "a/b");
        assert_eq!(relative_name(root, Path::new("/w")), ".");
        assert_eq!(relative_name(root, Path::new("/elsewhere")), "/elsewhere");
    }

    /// The owner the tests hand new directories to: another one when running as root (so
    /// that a chown of an existing directory would show), else our own (all we may chown to).
    fn new_owner() -> (u32, u32) {
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if uid == 0 { (4242, 4343) } else { (uid, gid) }
    }

    fn owner(p: &Path) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    }

    #[test]
    fn ensure_dirs_owned_creates_missing_dirs_for_the_user() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let before = owner(base);
        let (uid, gid) = new_owner();
        let deep = base.join("a/b/c");
        ensure_dirs_owned(&deep, uid, gid).unwrap();
        for d in ["a", "a/b", "a/b/c"] {
            let p = base.join(d);
            assert!(p.is_dir(), "{d}");
            assert_eq!(owner(&p), (uid, gid), "{d}");
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            // 0755 less the process umask, as envd's os.Mkdir.
            assert_eq!(mode & !0o755, 0, "{d}: {mode:o}");
        }
        // Existing directories keep their owner; doing it again changes nothing.
        assert_eq!(owner(base), before);
        ensure_dirs_owned(&deep, uid, gid).unwrap();
        ensure_dirs_owned(base, uid, gid).unwrap();
        assert_eq!(owner(base), before);
    }

    #[test]
    fn ensure_dirs_owned_refuses_a_file_in_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let (uid, gid) = new_owner();
        let e = ensure_dirs_owned(&file.join("sub"), uid, gid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        assert!(!file.join("sub").exists());
    }

    #[test]
    fn ensure_dirs_owned_follows_a_symlink_to_a_directory_but_never_chowns_one() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let target = base.join("target");
        std::fs::create_dir(&target).unwrap();
        let target_owner = owner(&target);
        std::os::unix::fs::symlink(&target, base.join("link")).unwrap();
        let (uid, gid) = new_owner();
        // An existing link to a directory is followed, as envd's os.Stat does; the link and
        // its target keep their owners, the new directory inside is the user's.
        ensure_dirs_owned(&base.join("link/new"), uid, gid).unwrap();
        assert_eq!(owner(&target.join("new")), (uid, gid));
        assert_eq!(owner(&target), target_owner);
        // A dangling link is neither replaced nor followed into a new directory.
        std::os::unix::fs::symlink(base.join("nowhere/deeper"), base.join("dangling")).unwrap();
        let e = ensure_dirs_owned(&base.join("dangling/x"), uid, gid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(!base.join("nowhere").exists());
        assert!(
            std::fs::symlink_metadata(base.join("dangling"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn the_new_directory_is_opened_without_following_a_link() {
        // What keeps a swapped-in symlink from being chowned: the directory just made is
        // opened with O_NOFOLLOW, which refuses a link where a directory was expected (with
        // O_PATH the link itself is found, and it is not a directory).
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("swapped")).unwrap();
        let dir = open_dir(libc::AT_FDCWD, tmp.path(), true).unwrap();
        let e = open_dir(dir.as_raw_fd(), Path::new("swapped"), false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        assert!(open_dir(dir.as_raw_fd(), Path::new("swapped"), true).is_ok());
    }

    mod properties {
        use std::ffi::OsStr;

        use proptest::prelude::*;

        use super::super::*;

        /// Paths made of the pieces that matter to `clean`: names, `.`, `..`, and runs of `/`.
        fn messy_path() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just(".".to_owned()),
                Just("..".to_owned()),
                Just(String::new()),
                "[a-z~. ]{1,4}",
            ];
            (
                any::<bool>(),
                prop::collection::vec(piece, 0..12),
                any::<bool>(),
            )
                .prop_map(|(absolute, pieces, trailing)| {
                    let mut path = pieces.join("/");
                    if absolute {
                        path.insert(0, '/');
                    }
                    if trailing {
                        path.push('/');
                    }
                    path
                })
        }

        /// `clean` as a stack over `/`-separated pieces.
        fn model(path: &str) -> PathBuf {
            let mut stack: Vec<&str> = Vec::new();
            for piece in path.split('/') {
                match piece {
                    "" | "." => {}
                    ".." => {
                        stack.pop();
                    }
                    name => stack.push(name),
                }
            }
            PathBuf::from(format!("/{}", stack.join("/")))
        }

        proptest! {
            #[test]
            fn clean_is_absolute_normal_and_idempotent(path in messy_path()) {
                let cleaned = clean(Path::new(&path));
                let text = cleaned.to_str().unwrap();
                prop_assert!(text.starts_with('/'));
                prop_assert!(text == "/" || !text.ends_with('/'));
                prop_assert!(!text.contains("//"));
                prop_assert!(cleaned.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
                prop_assert!(cleaned.components().all(|c| c.as_os_str() != OsStr::new("..")));
                prop_assert_eq!(clean(&cleaned), cleaned.clone());
                prop_assert_eq!(&cleaned, &model(&path));
                // A relative path is taken as relative to `/`.
                prop_assert_eq!(clean(Path::new(&format!("/{path}"))), cleaned);
            }

            #[test]
            fn resolving_below_home_stays_below_home(names in prop::collection::vec("[a-z0-9._-]{1,8}", 0..8)) {
                // Without `..` pieces a relative path never leaves the home directory.
                let names: Vec<String> = names.into_iter().filter(|n| n != "..").collect();
                let home = Path::new("/home/user");
                let resolved = resolve(&names.join("/"), home, None).unwrap();
                prop_assert!(resolved.starts_with(home), "{}", resolved.display());
                let tilde = resolve(&format!("~/{}", names.join("/")), home, None).unwrap();
                prop_assert_eq!(tilde, resolved);
            }

            #[test]
            fn resolve_never_panics_and_checks_its_result(path in any::<String>()) {
                match resolve(&path, Path::new("/home/user"), Some(Path::new("/work"))) {
                    Ok(resolved) => {
                        prop_assert!(!path.contains('\0'));
                        prop_assert!(resolved.is_absolute());
                        prop_assert_eq!(clean(&resolved), resolved.clone());
                        prop_assert!(check_length(&resolved).is_ok());
                    }
                    Err(PathError::Nul(_)) => prop_assert!(path.contains('\0')),
                    Err(PathError::OtherUsersHome(_)) => prop_assert!(path.starts_with('~')),
                    Err(PathError::NameTooLong { len }) => prop_assert!(len > NAME_MAX),
                    Err(PathError::PathTooLong { len }) => prop_assert!(len >= PATH_MAX),
                    Err(PathError::KernelTooLong) => prop_assert!(false, "only the kernel says this"),
                }
            }

            #[test]
            fn length_limits_are_the_kernels(lens in prop::collection::vec(1_usize..300, 1..40)) {
                let path = PathBuf::from(format!(
                    "/{}",
                    lens.iter().map(|n| "x".repeat(*n)).collect::<Vec<_>>().join("/")
                ));
                let total = path.as_os_str().len();
                let longest = lens.iter().copied().max().unwrap_or(0);
                let expected = if longest > NAME_MAX {
                    Err(PathError::NameTooLong { len: lens.iter().copied().find(|n| *n > NAME_MAX).unwrap() })
                } else if total >= PATH_MAX {
                    Err(PathError::PathTooLong { len: total })
                } else {
                    Ok(())
                };
                prop_assert_eq!(check_length(&path), expected);
            }
        }
    }
}
