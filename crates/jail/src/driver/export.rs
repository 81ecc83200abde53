//! `Driver::export_changes`: a sandbox's filesystem changes as an overlay upper dir owned as
//! inside the sandbox, for template builds. Taken with the filesystem-only pause (frozen, then
//! the disk moved out, then the sandbox torn down), so no process writes while it is read; the
//! upper dir is then copied off the disk.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bulkhead_driver::{CheckpointOptions, DriverError, DriverHandle};

use bulkhead_common::copy::copy_tree;

use super::disk::View;
use super::manifest::{LEGACY_UPPER, Manifest};
use super::state::JailDriver;
use crate::IDS_PER_SLOT;
use crate::uidshift::Shift;

impl JailDriver {
    pub(super) async fn export_sandbox_changes(
        &self,
        handle: &DriverHandle,
        dest: &Path,
    ) -> Result<(), DriverError> {
        if dest.exists() {
            return Err(DriverError::io(
                format!("export target {} already exists", dest.display()),
                io::Error::from(io::ErrorKind::AlreadyExists),
            ));
        }
        let mut tmp = dest.as_os_str().to_owned();
        tmp.push(".checkpoint");
        let tmp = std::path::PathBuf::from(tmp);
        let _ = fs::remove_dir_all(&tmp);
        let opts = CheckpointOptions {
            leave_running: false,
            filesystem_only: true,
        };
        self.checkpoint_sandbox(handle, &tmp, opts).await?;
        let (tmp2, dest2, views) = (tmp.clone(), dest.to_path_buf(), self.view_dir());
        let moved = tokio::task::spawn_blocking(move || -> io::Result<()> {
            let manifest = Manifest::read(&tmp2).map_err(|e| io::Error::other(e.to_string()))?;
            let staged = {
                let view = View::open(&tmp2, &views)?;
                let staged = tmp2.join(LEGACY_UPPER);
                // Off the sandbox's disk onto the host's: a layer outlives the disk.
                copy_tree(view.upper(), &staged)?;
                staged
            };
            // Back from the slot's host ids to the ids the sandbox saw (its root is uid 0).
            Shift {
                from: manifest.uid_base,
                to: 0,
                count: IDS_PER_SLOT,
            }
            .apply(&staged)?;
            // Now owned by host root with the sandbox's set-uid bits: owner-only before it
            // becomes visible at `dest` (the upper dir's own mode is not part of a layer).
            fs::set_permissions(&staged, fs::Permissions::from_mode(0o700))?;
            fs::rename(&staged, &dest2)?;
            fs::remove_dir_all(&tmp2)
        })
        .await
        .map_err(|e| DriverError::io("export task", io::Error::other(e)))?;
        if let Err(e) = moved {
            let _ = fs::remove_dir_all(&tmp);
            return Err(DriverError::io(
                format!("export the sandbox's changes to {}", dest.display()),
                e,
            ));
        }
        Ok(())
    }
}
