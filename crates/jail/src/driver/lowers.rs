//! Idmapped lowers: each slot's read-only view of a template root, owned by the slot's uid
//! range. Created through the launcher on first use, kept for reuse, pruned when idle.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use bulkhead_driver::{DriverError, StartError};

use super::fsutil::template_key;
use super::launch::LaunchError;
use super::state::JailDriver;
use crate::slots;
use crate::spec::{IdmapSpec, LaunchReply, LaunchRequest};
use crate::{IDS_PER_SLOT, JailError, sys};

impl JailDriver {
    /// Unmount the idmapped template views no running sandbox uses (they are otherwise kept
    /// for reuse). Returns how many were removed.
    pub fn prune_lowers(&self) -> Result<usize, JailError> {
        let dir = self.inner.cfg.state_dir.join("l");
        // Keep the views of busy slots: a running sandbox uses one, a start in flight may be
        // about to.
        let busy: BTreeSet<u32> = {
            let slots = self.inner.slots.lock().expect("slot table poisoned");
            (0..slots.max()).filter(|n| slots.is_busy(*n)).collect()
        };
        let mut removed = 0;
        let rd =
            fs::read_dir(&dir).map_err(|e| JailError::io(format!("read {}", dir.display()), e))?;
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let slot = name.split('-').next().and_then(|n| n.parse::<u32>().ok());
            if slot.is_some_and(|n| busy.contains(&n)) {
                continue;
            }
            if sys::is_mount_root(&p).unwrap_or(false) {
                sys::umount_detach(&p)
                    .map_err(|e| JailError::io(format!("umount {}", p.display()), e))?;
            }
            fs::remove_dir(&p).map_err(|e| JailError::io(format!("rmdir {}", p.display()), e))?;
            removed += 1;
        }
        Ok(removed)
    }

    /// The slot's idmapped view of `rootfs`, created on first use and kept.
    pub(super) async fn ensure_lower(
        &self,
        slot: u32,
        rootfs: &Path,
    ) -> Result<PathBuf, DriverError> {
        let key = template_key(rootfs)
            .map_err(|e| DriverError::io(format!("template root {}", rootfs.display()), e))?;
        let lower = self
            .inner
            .cfg
            .state_dir
            .join("l")
            .join(format!("{slot}-{key}"));
        if sys::is_mount_root(&lower).unwrap_or(false) {
            return Ok(lower);
        }
        let req = LaunchRequest::Idmap(IdmapSpec {
            source: rootfs.to_path_buf(),
            target: lower.clone(),
            uid_base: slots::slot_uid(self.inner.cfg.uid_base, slot),
            id_count: IDS_PER_SLOT,
            volume: false,
        });
        let timeout = self.inner.cfg.start_timeout;
        let failure = match self.inner.launcher.run(&req, timeout).await {
            Ok(LaunchReply::Done { ok: true }) => return Ok(lower),
            Ok(LaunchReply::Failed { error }) => LaunchError::Idmap(error),
            Ok(other) => LaunchError::Unexpected(other),
            Err(e) => e,
        };
        Err(StartError::setup(failure).into())
    }
}
