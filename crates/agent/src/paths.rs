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

use std::io;
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
/// them, so a user can write `/0/x.txt` as on E2B, and the new directories belong to that user.
/// Existing directories are left as they are; an existing non-directory is an error.
pub fn ensure_dirs_owned(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut prefix = PathBuf::new();
    for component in path.components() {
        prefix.push(component);
        match std::fs::metadata(&prefix) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        match std::fs::DirBuilder::new().mode(0o755).create(&prefix) {
            Ok(()) => std::os::unix::fs::chown(&prefix, Some(uid), Some(gid))?,
            // Another writer created it meanwhile: theirs, so it keeps its owner.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
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
