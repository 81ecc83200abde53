//! [`PathMap`]: the engine hands the `Node` trait absolute paths under its own directories (the
//! checkpoint directory, template trees, volumes); the wire carries paths relative to the node's
//! data directory. A map lists which local root stands for which wire prefix, e.g.
//! `/var/lib/bulkhead/checkpoints` → `checkpoints`, and turns a path under a root into its wire
//! form and back. A path under no root is refused: the engine must not name a file the node was
//! not given.

use std::path::{Component, Path, PathBuf};

use bulkhead_node_proto::paths::{PathError, check};

/// Why a path cannot cross to the node (or come back).
#[derive(Debug, thiserror::Error)]
pub enum PathMapError {
    #[error(
        "{path:?} is under none of the directories shared with the node ({roots}): only paths \
         under them can be sent; add its directory to the node's path map"
    )]
    NotMapped { path: PathBuf, roots: String },
    #[error("{path:?} cannot be sent to the node")]
    Wire {
        path: PathBuf,
        #[source]
        source: PathError,
    },
    #[error("the node answered {wire:?}, which is under none of the wire prefixes of the path map")]
    NotLocal { wire: PathBuf },
    #[error("{root:?} cannot be a root of the path map: give an absolute, normal path")]
    BadRoot { root: PathBuf },
    #[error("{prefix:?} cannot be a wire prefix of the path map")]
    BadPrefix {
        prefix: PathBuf,
        #[source]
        source: PathError,
    },
}

/// Local roots and the wire prefixes they stand for (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathMap {
    /// (local root, wire prefix); the prefix may be empty (the root is the data directory).
    roots: Vec<(PathBuf, PathBuf)>,
}

impl PathMap {
    pub fn new() -> PathMap {
        PathMap::default()
    }

    /// Adds `local_root` (absolute, no `.` or `..`) standing for `wire_prefix` (relative plain
    /// components, or empty for the data directory itself).
    pub fn with(
        mut self,
        local_root: impl Into<PathBuf>,
        wire_prefix: impl Into<PathBuf>,
    ) -> Result<PathMap, PathMapError> {
        let root = local_root.into();
        let normal = root.is_absolute()
            && root
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !normal {
            return Err(PathMapError::BadRoot { root });
        }
        let prefix = wire_prefix.into();
        if !prefix.as_os_str().is_empty() {
            check(&prefix).map_err(|source| PathMapError::BadPrefix {
                prefix: prefix.clone(),
                source,
            })?;
        }
        self.roots.push((root, prefix));
        Ok(self)
    }

    /// The wire form of `local`: the longest root it is under, swapped for its prefix.
    pub fn to_wire(&self, local: &Path) -> Result<PathBuf, PathMapError> {
        let (rest, prefix) = self
            .roots
            .iter()
            .filter_map(|(root, prefix)| Some((local.strip_prefix(root).ok()?, prefix, root)))
            .max_by_key(|(_, _, root)| root.components().count())
            .map(|(rest, prefix, _)| (rest, prefix))
            .ok_or_else(|| PathMapError::NotMapped {
                path: local.to_path_buf(),
                roots: self.describe(),
            })?;
        let wire = prefix.join(rest);
        check(&wire).map_err(|source| PathMapError::Wire {
            path: local.to_path_buf(),
            source,
        })?;
        Ok(wire)
    }

    /// The local path of a wire path the node answered: the longest prefix it is under,
    /// swapped for its root.
    pub fn to_local(&self, wire: &Path) -> Result<PathBuf, PathMapError> {
        check(wire).map_err(|source| PathMapError::Wire {
            path: wire.to_path_buf(),
            source,
        })?;
        self.roots
            .iter()
            .filter_map(|(root, prefix)| Some((wire.strip_prefix(prefix).ok()?, prefix, root)))
            .max_by_key(|(_, prefix, _)| prefix.components().count())
            .map(|(rest, _, root)| root.join(rest))
            .ok_or_else(|| PathMapError::NotLocal {
                wire: wire.to_path_buf(),
            })
    }

    fn describe(&self) -> String {
        if self.roots.is_empty() {
            return "none".to_string();
        }
        self.roots
            .iter()
            .map(|(root, _)| root.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
