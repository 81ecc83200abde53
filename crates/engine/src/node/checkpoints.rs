//! Where checkpoints live under the data directory and when one counts as complete. A leaf.
//!
//! ```text
//! <checkpoint_dir>/sandboxes/<sandbox id>/<generation>   a pause (a fresh directory per pause)
//! <checkpoint_dir>/snapshots/<snapshot id>               a snapshot (a template)
//! <checkpoint_dir>/forks/<random>                        a fork's snapshot, deleted afterwards
//! <checkpoint_dir>/pools/<template id>/<key>             a heavy template's warm checkpoint
//!                                                        (see `pool_source`)
//! ```
//!
//! The driver writes its image into the directory; the engine writes [`MARKER`] last, holding
//! the driver's [`CheckpointInfo`]. A directory without the marker is an interrupted
//! checkpoint (the server died while writing it) and is treated as absent.

use std::path::{Path, PathBuf};

use crate::node::driver::CheckpointInfo;

/// Written into a checkpoint directory once the checkpoint is complete.
pub(crate) const MARKER: &str = "bulkhead-checkpoint.json";

/// Why a checkpoint directory could not be prepared, completed or copied.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "Cannot prepare the checkpoint directory {}: check that the data directory is writable and has free space",
        .path.display()
    )]
    Prepare {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "Cannot mark the checkpoint in {} complete: {source}",
        .path.display()
    )]
    Mark {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "Cannot copy the checkpoint {} to {}: {source}",
        .from.display(),
        .to.display()
    )]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "The checkpoint in {} is incomplete (the server stopped while writing it); it cannot be restored",
        .0.display()
    )]
    Incomplete(PathBuf),
}

pub(crate) fn pause_dir(root: &Path, sandbox_id: &str, generation: i64) -> PathBuf {
    sandbox_root(root, sandbox_id).join(generation.to_string())
}

/// Every pause checkpoint of a sandbox (deleted when the sandbox ends).
pub(crate) fn sandbox_root(root: &Path, sandbox_id: &str) -> PathBuf {
    root.join("sandboxes").join(sandbox_id)
}

pub(crate) fn snapshot_dir(root: &Path, snapshot_id: &str) -> PathBuf {
    root.join("snapshots").join(snapshot_id)
}

pub(crate) fn fork_dir(root: &Path, token: &str) -> PathBuf {
    root.join("forks").join(token)
}

/// Make sure `dir` can be written fresh: its parent exists and it does not (a leftover of an
/// interrupted attempt is removed; a checkpoint directory is never reused).
pub(crate) fn prepare(dir: &Path) -> Result<(), CheckpointError> {
    let failed = |source| CheckpointError::Prepare {
        path: dir.to_path_buf(),
        source,
    };
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(failed)?;
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    Ok(())
}

/// Write the completion marker (last, after the driver's image).
pub(crate) fn mark_complete(info: &CheckpointInfo) -> Result<(), CheckpointError> {
    let json = serde_json::to_vec_pretty(info).expect("checkpoint info serializes");
    let path = info.dir.join(MARKER);
    let tmp = info.dir.join(format!("{MARKER}.tmp"));
    let failed = |source| CheckpointError::Mark {
        path: info.dir.clone(),
        source,
    };
    std::fs::write(&tmp, json).map_err(failed)?;
    std::fs::rename(&tmp, &path).map_err(failed)
}

/// The completed checkpoint in `dir`, if it is complete.
pub(crate) fn completed(dir: &Path) -> Option<CheckpointInfo> {
    let bytes = std::fs::read(dir.join(MARKER)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Delete a checkpoint directory (idempotent; failures are logged, not fatal: a leftover
/// directory wastes space but breaks nothing).
pub(crate) fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = &e as &dyn std::error::Error, "could not delete a checkpoint");
    }
}

/// A checkpoint directory's failure as a node reports it.
pub(crate) fn into_driver_error(e: CheckpointError) -> crate::node::driver::DriverError {
    let context = e.to_string();
    let source = match e {
        CheckpointError::Prepare { source, .. }
        | CheckpointError::Mark { source, .. }
        | CheckpointError::Copy { source, .. } => source,
        CheckpointError::Incomplete(_) => std::io::Error::other("incomplete checkpoint"),
    };
    crate::node::driver::DriverError::io(context, source)
}

/// Copy a complete checkpoint to a fresh directory (a snapshot of a paused sandbox); the copy
/// gets its own marker naming its own directory. The project's one tree copy: owners, modes,
/// times, xattrs and whiteouts kept, disk images left sparse.
pub(crate) fn copy(from: &Path, to: &Path) -> Result<CheckpointInfo, CheckpointError> {
    let mut info = completed(from).ok_or_else(|| CheckpointError::Incomplete(from.into()))?;
    prepare(to)?;
    bulkhead_common::copy::copy_tree(from, to).map_err(|source| CheckpointError::Copy {
        from: from.into(),
        to: to.into(),
        source,
    })?;
    info.dir = to.to_path_buf();
    mark_complete(&info)?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_complete_only_with_its_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = pause_dir(tmp.path(), "sb", 1);
        prepare(&dir).unwrap();
        std::fs::create_dir_all(dir.join("img")).unwrap();
        std::fs::write(dir.join("img/pages"), b"x").unwrap();
        assert!(completed(&dir).is_none());
        let info = CheckpointInfo {
            driver: "fake".into(),
            format: 1,
            dir: dir.clone(),
            size_bytes: 1,
            memory: true,
        };
        mark_complete(&info).unwrap();
        assert_eq!(completed(&dir), Some(info));

        let to = snapshot_dir(tmp.path(), "snap");
        let copied = copy(&dir, &to).unwrap();
        assert_eq!(copied.dir, to);
        assert_eq!(std::fs::read(to.join("img/pages")).unwrap(), b"x");
        remove(&dir);
        remove(&dir);
        assert!(!dir.exists());
        assert!(copy(&dir, &to).is_err());
    }
}
