//! [`Driver::changes`](bulkhead_driver::Driver::changes) for the jail: which upper directory
//! and which lower tree a [`ChangeSource`] means, then [`crate::changes`] on them.
//!
//! - A running sandbox: its slot's upper directory (`<state>/s/<slot>/upper`) over the
//!   idmapped view of its template recorded in the handle (ids do not matter, only names and
//!   types).
//! - A checkpoint directory: `<dir>/upper/` over the template rootfs named in
//!   `<dir>/checkpoint.json` (`{"rootfs": "…"}`).
//! - `since`: another checkpoint directory; its `upper/` is the baseline.

use std::path::{Path, PathBuf};

use bulkhead_driver::{ChangeSource, DriverError, FileChange};
use serde::Deserialize;

use super::state::{HandleData, JailDriver};

/// The part of a checkpoint's `checkpoint.json` change listing needs.
#[derive(Debug, Deserialize)]
struct CheckpointMeta {
    rootfs: PathBuf,
}

fn checkpoint_layers(dir: &Path) -> Result<(PathBuf, PathBuf), DriverError> {
    let meta_path = dir.join("checkpoint.json");
    let text = std::fs::read_to_string(&meta_path)
        .map_err(|e| DriverError::io("Cannot read the checkpoint's metadata", e))?;
    let meta: CheckpointMeta = serde_json::from_str(&text).map_err(|e| {
        DriverError::io(
            "The checkpoint's metadata is unreadable",
            std::io::Error::other(e),
        )
    })?;
    Ok((dir.join("upper"), meta.rootfs))
}

impl JailDriver {
    pub(super) async fn list_changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        let (upper, lower) = match of {
            ChangeSource::Running(h) => {
                let data: HandleData =
                    serde_json::from_value(h.data.clone()).map_err(|_| DriverError::NotRunning)?;
                (self.slot_dir(h.slot).join("upper"), data.lower)
            }
            ChangeSource::Checkpoint(dir) => checkpoint_layers(dir)?,
        };
        let base = since.map(|d| d.join("upper"));
        tokio::task::spawn_blocking(move || {
            crate::changes::changes(&upper, &lower, base.as_deref())
        })
        .await
        .expect("changes task")
        .map_err(|e| {
            DriverError::io(
                "Could not list the sandbox's file changes",
                std::io::Error::other(e),
            )
        })
    }
}
