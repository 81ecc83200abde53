//! A slot's disk ([`disk`]): blank for a fresh start, or a copy of a checkpoint's (a reflink
//! where the filesystem has them, else only its used extents), mounted and re-owned for the
//! slot's uid range. Never the checkpoint's own image, not even for a resume that consumes it:
//! restored processes write to their disk at once, and a checkpoint must stay exactly what was
//! saved until the resume is committed (a server dying in between resumes from it again).
//! Checkpoints written before disks existed keep their files in `upper/`; a start from one
//! copies them onto a blank disk.
//!
//! A pause moves the slot's image into its checkpoint while the sandbox still runs (frozen);
//! [`MOVED_TO`] records where, so that whoever finds the sandbox alive afterwards — a failed
//! pause, or a restarted server adopting it — can give it back while the checkpoint is
//! incomplete ([`reclaim_moved_disk`]).

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
            copy_file_sparse(&saved, &image)?;
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

/// In a slot directory while a pause has moved the slot's disk image into a checkpoint whose
/// sandbox is not torn down yet: the image's path in the checkpoint.
pub(super) const MOVED_TO: &str = "disk-moved-to";

/// A pause is about to move the slot's image to `to`: record it first.
pub(super) fn record_move(slot_dir: &Path, to: &Path) -> io::Result<()> {
    fs::write(slot_dir.join(MOVED_TO), to.as_os_str().as_encoded_bytes())
}

/// The sandbox in `slot_dir` lives on: if a pause moved its image into a checkpoint that was
/// never completed (no manifest), move it back. Returns whether the slot has its image (false:
/// the image is in a complete checkpoint, the sandbox is paused and must be stopped).
pub(super) fn reclaim_moved_disk(slot_dir: &Path) -> bool {
    let marker = slot_dir.join(MOVED_TO);
    let Ok(to) = fs::read_to_string(&marker) else {
        return true;
    };
    let (to, image) = (PathBuf::from(to), slot_dir.join(disk::IMAGE));
    let complete = to
        .parent()
        .is_some_and(|c| c.join(super::manifest::MANIFEST).is_file());
    if complete {
        return false;
    }
    if to.is_file() && !image.exists() {
        if let Err(e) = fs::rename(&to, &image) {
            tracing::error!(from = %to.display(), to = %image.display(), error = %e,
                "cannot give a sandbox its disk back after an interrupted pause");
            return false;
        }
        tracing::info!(slot = %slot_dir.display(), "disk given back after an interrupted pause");
    }
    let _ = fs::remove_file(&marker);
    true
}

/// Before a slot directory is removed: the host's views of the overlay and volumes that a
/// restore mounts (left mounted when the server died during the restore) are detached, and the
/// disk is unmounted (and released by its loop device).
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
    if let Err(e) = disk::unmount(&slot_dir.join(disk::MOUNT)) {
        tracing::warn!(slot = %slot_dir.display(), error = %e, "unmount a sandbox's disk");
    }
}
