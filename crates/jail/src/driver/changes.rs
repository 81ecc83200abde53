//! [`Driver::changes`](bulkhead_driver::Driver::changes) for the jail: which upper directory
//! and which lower tree a [`ChangeSource`] means, then [`crate::changes`] on them.
//!
//! - A running sandbox: its slot's upper directory (`<state>/s/<slot>/disk/upper`) over the
//!   idmapped view of its template recorded in the handle (ids do not matter, only names and
//!   types).
//! - A checkpoint directory: the upper dir on its disk (mounted read-only for the listing,
//!   [`View`]) over the template rootfs named in its manifest (`<dir>/checkpoint.json`, see
//!   `manifest.rs`).
//! - `since`: another checkpoint directory; its upper dir is the baseline.

use std::path::{Path, PathBuf};

use bulkhead_driver::{ChangeSource, DriverError, FileChange};

use super::disk::View;
use super::manifest::Manifest;
use super::state::{HandleData, JailDriver};

fn checkpoint_rootfs(dir: &Path) -> Result<PathBuf, DriverError> {
    let m = Manifest::read(dir)?;
    m.rootfs.ok_or_else(|| {
        DriverError::io(
            format!(
                "checkpoint {} does not name its template root; its changes cannot be listed",
                dir.display()
            ),
            std::io::Error::other("no rootfs"),
        )
    })
}

impl JailDriver {
    pub(super) async fn list_changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        // A running sandbox's upper dir, or the checkpoint whose disk holds it.
        let source = match of {
            ChangeSource::Running(h) => {
                // Only a sandbox this driver runs: a stopped one's slot may be someone else's.
                if self.lookup(h).is_none_or(|sb| sb.exited().is_some()) {
                    return Err(DriverError::NotRunning);
                }
                let data: HandleData =
                    serde_json::from_value(h.data.clone()).map_err(|_| DriverError::NotRunning)?;
                Ok((self.upper_dir(h.slot), data.lower))
            }
            ChangeSource::Checkpoint(dir) => Err(dir.clone()),
        };
        let (since, views) = (since.map(Path::to_path_buf), self.view_dir());
        tokio::task::spawn_blocking(move || -> Result<Vec<FileChange>, DriverError> {
            let opened = |dir: &Path| {
                View::open(dir, &views).map_err(|e| {
                    DriverError::io(format!("open the disk of checkpoint {}", dir.display()), e)
                })
            };
            // Kept open (mounted) until the listing is done.
            let (_view, upper, lower) = match source {
                Ok((upper, lower)) => (None, upper, lower),
                Err(dir) => {
                    let view = opened(&dir)?;
                    let upper = view.upper().to_path_buf();
                    (Some(view), upper, checkpoint_rootfs(&dir)?)
                }
            };
            let base = since.as_deref().map(opened).transpose()?;
            crate::changes::changes(&upper, &lower, base.as_ref().map(View::upper)).map_err(|e| {
                DriverError::io(
                    "Could not list the sandbox's file changes",
                    std::io::Error::other(e),
                )
            })
        })
        .await
        .expect("changes task")
    }
}
