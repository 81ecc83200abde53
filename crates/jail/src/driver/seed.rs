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
                // Recorded first: a crash right after the rename still finds its way back.
                let origin = dst.with_file_name(SEED_ORIGIN);
                fs::write(&origin, seed.upper.as_os_str().as_encoded_bytes())?;
                match fs::rename(&seed.upper, &dst) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        let _ = fs::remove_file(&origin);
                        if e.raw_os_error() != Some(libc::EXDEV) {
                            return Err(e);
                        }
                    }
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
    pub(super) fn unseed_upper(&self, slot: u32) {
        prepare_slot_removal(&self.slot_dir(slot));
    }

    /// The start succeeded: the slot's upper dir is the sandbox's own now.
    pub(super) fn seed_done(&self, slot: u32) {
        let _ = fs::remove_file(self.slot_dir(slot).join(SEED_ORIGIN));
    }
}

/// Where a slot's upper dir was moved from, while a start from a checkpoint is in flight. If
/// the start fails, or the server dies before it completes, whoever removes the slot directory
/// moves the upper dir back first ([`prepare_slot_removal`]): a resume never loses the files.
pub(super) const SEED_ORIGIN: &str = "seed-origin";

/// Before a slot directory is removed: the host's views of the overlay and volumes that a
/// restore mounts (left mounted when the server died during the restore) are detached, and an upper dir moved
/// in from a checkpoint by a start that did not complete goes back to that checkpoint.
pub(super) fn prepare_slot_removal(slot_dir: &Path) {
    let views = fs::read_dir(slot_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n == "merged" || n.starts_with("vol-")
            })
        });
    for view in views {
        if crate::sys::is_mount_root(&view).unwrap_or(false) {
            let _ = crate::sys::umount_detach(&view);
        }
    }
    let Ok(origin) = fs::read_to_string(slot_dir.join(SEED_ORIGIN)) else {
        return;
    };
    let origin = PathBuf::from(origin.trim());
    let upper = slot_dir.join("upper");
    if origin.parent().is_some_and(Path::is_dir)
        && !origin.exists()
        && upper.is_dir()
        && let Err(e) = fs::rename(&upper, &origin)
    {
        tracing::error!(
            from = %upper.display(),
            to = %origin.display(),
            error = %e,
            "cannot give a sandbox's files back to its checkpoint after a failed restore"
        );
    }
    let _ = fs::remove_file(slot_dir.join(SEED_ORIGIN));
}
