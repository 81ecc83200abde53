//! Resolution of client-supplied paths.
//!
//! Paths are resolved the way envd does: `~` and `~/x` expand to the user's home, relative paths
//! are joined to the user's home, and the result is cleaned lexically (`.` and `..` removed, `..`
//! never climbing above `/`). The agent's root is the sandbox's root (it runs after
//! `pivot_root`), so the kernel, running the operation with the user's credentials, is what
//! enforces access; symlinks are left for the kernel to follow.

use std::path::{Component, Path, PathBuf};

/// Errors resolving a path.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    /// `~name/...` (another user's home) is not supported.
    #[error("Cannot expand {0:?}: only `~` and `~/...` (the requesting user's home) are supported")]
    OtherUsersHome(String),
    /// The path contains a NUL byte.
    #[error("Path {0:?} contains a NUL byte")]
    Nul(String),
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
    if expanded.is_absolute() {
        Ok(clean(&expanded))
    } else {
        Ok(clean(&home.join(expanded)))
    }
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
    fn relative_names() {
        let root = Path::new("/w");
        assert_eq!(relative_name(root, Path::new("/w/a/b")), "a/b");
        assert_eq!(relative_name(root, Path::new("/w")), ".");
        assert_eq!(relative_name(root, Path::new("/elsewhere")), "/elsewhere");
    }
}
