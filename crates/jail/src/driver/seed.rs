//! Filling a slot's upper dir from a checkpoint: moved (a resume into the slot it was paused
//! in) or copied with reflinks where the filesystem has them, then re-owned for the slot's
//! uid range. Rolled back when the start fails, so the checkpoint stays restorable.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use bulkhead_driver::DriverError;

use super::state::JailDriver;
use crate::IDS_PER_SLOT;
use crate::uidshift::Shift;

/// Where a start gets its upper dir from.
#[derive(Debug, Clone)]
pub(super) struct Seed {
    /// The checkpoint's `upper/`.
    pub(super) upper: PathBuf,
    /// The checkpoint is not needed afterwards: move instead of copying when possible.
    pub(super) consume: bool,
    /// Host uid of the sandbox's root when it was saved.
    pub(super) uid_base: u32,
    /// The slot it was saved from.
    pub(super) slot: u32,
}

impl Seed {
    pub(super) fn slot_hint(&self) -> u32 {
        self.slot
    }
}

/// `cp -a` with reflinks where the filesystem supports them (btrfs, xfs), a plain copy
/// otherwise. Keeps owners, modes, times, xattrs (overlay whiteouts and opaque markers) and
/// hard links.
pub(super) fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let out = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto", "--no-target-directory"])
        .arg(from)
        .arg(to)
        .stdin(std::process::Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if msg.contains("No space left") {
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    Err(io::Error::other(format!("cp -a: {msg}")))
}

impl JailDriver {
    fn shift_for(&self, slot: u32, seed: &Seed) -> Shift {
        Shift {
            from: seed.uid_base,
            to: self.slot_uid(slot),
            count: IDS_PER_SLOT,
        }
    }

    /// Replace the fresh slot's empty upper dir with the checkpoint's.
    pub(super) async fn seed_upper(&self, slot: u32, seed: &Seed) -> Result<(), DriverError> {
        let dst = self.slot_dir(slot).join("upper");
        let shift = self.shift_for(slot, seed);
        let seed = seed.clone();
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            fs::remove_dir(&dst)?;
            if seed.consume && shift.from == shift.to {
                match fs::rename(&seed.upper, &dst) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
                    Err(e) => return Err(e),
                }
            }
            copy_tree(&seed.upper, &dst)?;
            shift.apply(&dst).map(drop)
        })
        .await
        .map_err(|e| DriverError::io("seed task", io::Error::other(e)))?
        .map_err(|e| DriverError::io("restore the sandbox's files from the checkpoint", e))
    }

    /// After a failed start: give a moved upper dir back to the checkpoint.
    pub(super) fn unseed_upper(&self, slot: u32, seed: &Seed) {
        if !seed.consume || seed.upper.exists() {
            return;
        }
        let src = self.slot_dir(slot).join("upper");
        if let Err(e) = fs::rename(&src, &seed.upper) {
            tracing::error!(
                slot,
                from = %src.display(),
                to = %seed.upper.display(),
                error = %e,
                "cannot give the sandbox's files back to its checkpoint after a failed restore"
            );
        }
    }
}
