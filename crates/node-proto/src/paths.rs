//! Host paths on the wire. Every host path a message carries (a rootfs, a volume's directory, a
//! checkpoint directory, an export destination) is relative to the node's data directory and made
//! of plain components only, so a caller can name nothing outside it and learns nothing of the
//! node's layout. [`check`] is the shape check the conversions apply in both directions;
//! [`DataDir`] is what a node (and, for its own paths, `bulkhead serve`) uses to go between host
//! paths and wire paths.

use std::path::{Component, Path, PathBuf};

/// Why a path cannot cross the wire, or cannot be resolved on the node.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("the path is empty: name a file or directory under the node's data directory")]
    Empty,
    #[error("{0:?} is absolute: send it relative to the node's data directory")]
    Absolute(String),
    #[error(
        "{0:?} has a component that is not a plain name (`..`, a leading `.`, a NUL byte): send \
         plain names only"
    )]
    NotPlain(String),
    #[error("{0:?} is not UTF-8: paths on the wire must be")]
    NotUtf8(String),
    #[error("{path:?} is not under the node's data directory {root:?}")]
    Outside { path: PathBuf, root: PathBuf },
    #[error("{0:?} passes through a symbolic link: the node follows none under its data directory")]
    Symlink(PathBuf),
    #[error("{0:?} could not be inspected")]
    Io(PathBuf, #[source] std::io::Error),
}

/// The wire form of `path`, which must already be relative to the data directory.
pub fn check(path: &Path) -> Result<&str, PathError> {
    let Some(text) = path.to_str() else {
        return Err(PathError::NotUtf8(path.to_string_lossy().into_owned()));
    };
    if text.is_empty() {
        return Err(PathError::Empty);
    }
    if text.contains('\0') {
        return Err(PathError::NotPlain(text.to_string()));
    }
    for component in path.components() {
        match component {
            Component::Normal(_) => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(PathError::Absolute(text.to_string()));
            }
            Component::CurDir | Component::ParentDir => {
                return Err(PathError::NotPlain(text.to_string()));
            }
        }
    }
    Ok(text)
}

/// The node's data directory: the root every wire path is relative to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The wire path of `host`, a path under the data directory (lexically: `host` is not read).
    pub fn relative(&self, host: &Path) -> Result<PathBuf, PathError> {
        let rel = host
            .strip_prefix(&self.root)
            .map_err(|_| PathError::Outside {
                path: host.to_path_buf(),
                root: self.root.clone(),
            })?;
        check(rel)?;
        Ok(rel.to_path_buf())
    }

    /// The host path `wire` names, confined to the data directory: its shape is checked, and no
    /// existing component below the root may be a symbolic link (checkpoints hold what sandboxes
    /// wrote, links included). Components that do not exist yet (an export's destination) are
    /// allowed. A link created after this check is the caller's to prevent: paths under the data
    /// directory are the node's own.
    pub fn resolve(&self, wire: &Path) -> Result<PathBuf, PathError> {
        check(wire)?;
        let mut host = self.root.clone();
        for component in wire.components() {
            host.push(component);
            match std::fs::symlink_metadata(&host) {
                Ok(meta) if meta.file_type().is_symlink() => return Err(PathError::Symlink(host)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(self.root.join(wire));
                }
                Err(e) => return Err(PathError::Io(host, e)),
            }
        }
        Ok(host)
    }
}
