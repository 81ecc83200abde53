//! [`Driver::changes`](bulkhead_driver::Driver::changes) for the jail: which upper directory
//! and which lower tree a [`ChangeSource`] means, then [`crate::changes`] on them.
//!
//! - A running sandbox: its slot's upper directory (`<state>/s/<slot>/upper`) over the
//!   idmapped view of its template recorded in the handle (ids do not matter, only names and
//!   types).
//! - A checkpoint directory: `<dir>/upper/` over the template rootfs named in its manifest
//!   (`<dir>/checkpoint.json`, see `manifest.rs`).
//! - `since`: another checkpoint directory; its `upper/` is the baseline.

use std::path::{Path, PathBuf};

use bulkhead_driver::{ChangeSource, DriverError, FileChange};

use super::manifest::{Manifest, UPPER};
use super::state::{HandleData, JailDriver};

fn checkpoint_layers(dir: &Path) -> Result<(PathBuf, PathBuf), DriverError> {
    let m = Manifest::read(dir)?;
    let rootfs = m.rootfs.ok_or_else(|| {
        DriverError::io(
            format!(
                "checkpoint {} does not name its template root; its changes cannot be listed",
                dir.display()
            ),
            std::io::Error::other("no rootfs"),
        )
    })?;
    Ok((dir.join(UPPER), rootfs))
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
        let base = since.map(|d| d.join(UPPER));
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
