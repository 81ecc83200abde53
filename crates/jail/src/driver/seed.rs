//! A slot's disk ([`disk`]): blank for a fresh start, or a checkpoint's, moved (a resume into
//! the slot it was paused in) or copied (only its used extents), then mounted and re-owned for
//! the slot's uid range. Rolled back when the start fails, so the checkpoint stays restorable.
//! Checkpoints written before disks existed keep their files in `upper/`; a start from one
//! copies them onto a blank disk.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use bulkhead_common::copy::{copy_file_sparse, copy_tree};
use bulkhead_driver::DriverError;

use super::disk;
use super::manifest::LEGACY_UPPER;
use super::state::JailDriver;
use crate::IDS_PER_SLOT;
use crate::uidshift::Shift;

/// Where a start gets its disk from.
#[derive(Debug, Clone)]
pub(super) struct Seed {
    /// The checkpoint directory.
    pub(super) dir: PathBuf,
    /// The checkpoint is not needed afterwards: move instead of copying when possible.
    pub(super) consume: bool,
    /// Host uid of the sandbox's root when it was saved.
    pub(super) uid_base: u32,
    /// The slot it was saved from.
    pub(super) slot: u32,
}

impl JailDriver {
    /// The slot's disk, mounted at `<slot>/disk` with the overlay's upper and work dirs:
    /// blank (`disk_mb`, 0 for the default) or from `seed`.
    pub(super) async fn make_disk(
        &self,
        slot: u32,
        disk_mb: u64,
        seed: Option<&Seed>,
    ) -> Result<(), DriverError> {
        let dir = self.slot_dir(slot);
        let uid = self.slot_uid(slot);
        let cache = self.disk_cache();
        let mb = if disk_mb == 0 {
            disk::DEFAULT_MB
        } else {
            disk_mb
        };
        let seed = seed.cloned();
        tokio::task::spawn_blocking(move || -> io::Result<()> {
            let (image, mnt) = (dir.join(disk::IMAGE), dir.join(disk::MOUNT));
            fs::create_dir(&mnt)?;
            let Some(seed) = seed else {
                disk::create(&cache, &image, mb)?;
                disk::mount(&image, &mnt, false)?;
                return disk::lay_out(&mnt, uid);
            };
            let shift = Shift {
                from: seed.uid_base,
                to: uid,
                count: IDS_PER_SLOT,
            };
            let saved = seed.dir.join(disk::IMAGE);
            if !saved.is_file() {
                // A checkpoint from before disks: its files onto a blank disk.
                disk::create(&cache, &image, mb)?;
                disk::mount(&image, &mnt, false)?;
                let upper = mnt.join(disk::UPPER);
                copy_tree(&seed.dir.join(LEGACY_UPPER), &upper)?;
                disk::lay_out(&mnt, uid)?;
                return shift.apply(&upper).map(drop);
            }
            let mut moved = false;
            if seed.consume {
                // Recorded first: a crash right after the rename still finds its way back.
                let origin = dir.join(SEED_ORIGIN);
                fs::write(&origin, saved.as_os_str().as_encoded_bytes())?;
                match fs::rename(&saved, &image) {
                    Ok(()) => moved = true,
                    Err(e) => {
                        let _ = fs::remove_file(&origin);
                        if e.raw_os_error() != Some(libc::EXDEV) {
                            return Err(e);
                        }
                    }
                }
            }
            if !moved {
                copy_file_sparse(&saved, &image)?;
            }
            disk::mount(&image, &mnt, false)?;
            disk::reset_work(&mnt, uid)?;
            if shift.from != shift.to {
                shift.apply(&mnt.join(disk::UPPER))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| DriverError::io("disk task", io::Error::other(e)))?
        .map_err(|e| match seed_kind(&e) {
            Some(msg) => DriverError::io(msg, e),
            None => DriverError::io("prepare the sandbox's disk", e),
        })
    }

    /// After a failed start: give a moved disk back to the checkpoint.
    pub(super) fn unseed_disk(&self, slot: u32) {
        prepare_slot_removal(&self.slot_dir(slot));
    }

    /// The start succeeded: the slot's disk is the sandbox's own now.
    pub(super) fn seed_done(&self, slot: u32) {
        let _ = fs::remove_file(self.slot_dir(slot).join(SEED_ORIGIN));
    }
}

/// What to tell the user about a failed disk preparation whose cause they can act on.
fn seed_kind(e: &io::Error) -> Option<&'static str> {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => Some(
            "no space left on the host for the sandbox's disk; free some in the data directory",
        ),
        _ if e.kind() == io::ErrorKind::ResourceBusy => Some("the sandbox's disk is still in use"),
        _ => None,
    }
}

/// Where a slot's disk image was moved from, while a start from a checkpoint is in flight. If
/// the start fails, or the server dies before it completes, whoever removes the slot directory
/// moves the image back first ([`prepare_slot_removal`]): a resume never loses the files.
pub(super) const SEED_ORIGIN: &str = "seed-origin";

/// Before a slot directory is removed: the host's views of the overlay and volumes that a
/// restore mounts (left mounted when the server died during the restore) are detached, the
/// disk is unmounted (and released by its loop device), and a disk image moved in from a
/// checkpoint by a start that did not complete goes back to that checkpoint.
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
    let unmounted = disk::unmount(&slot_dir.join(disk::MOUNT));
    if let Err(e) = &unmounted {
        tracing::warn!(slot = %slot_dir.display(), error = %e, "unmount a sandbox's disk");
    }
    let Ok(origin) = fs::read_to_string(slot_dir.join(SEED_ORIGIN)) else {
        return;
    };
    let origin = PathBuf::from(origin.trim());
    let image = slot_dir.join(disk::IMAGE);
    // Back even when the release timed out: a late write by a dying mount is a consistent
    // filesystem operation, a deleted image is a lost sandbox.
    if origin.parent().is_some_and(Path::is_dir)
        && !origin.exists()
        && image.is_file()
        && let Err(e) = fs::rename(&image, &origin)
    {
        tracing::error!(
            from = %image.display(),
            to = %origin.display(),
            error = %e,
            "cannot give a sandbox's disk back to its checkpoint after a failed restore"
        );
    }
    let _ = fs::remove_file(slot_dir.join(SEED_ORIGIN));
}
