//! A sandbox's disk: the overlay's upper and work dirs live on an ext4 filesystem of the
//! sandbox's own, in a sparse image `<slot>/disk.ext4` of the template's `diskSizeMB`,
//! loop-mounted at `<slot>/disk`. The kernel enforces its size and inode count for whatever
//! the sandbox writes (`ENOSPC` inside, never the host's disk full), and the sandbox's files
//! share no inode with the host's filesystem.
//!
//! A pause moves the image into the checkpoint and a snapshot copies it (block by block after
//! `syncfs` while the sandbox is frozen, only the used extents): owners, modes, nanosecond
//! times, xattrs, whiteouts and files open for writing come along as they were.
//!
//! Why not project quotas on the host's filesystem: the kernel this was built on has no quota
//! format (`CONFIG_QFMT_V2`, `CONFIG_XFS_QUOTA` unset), and a per-sandbox filesystem also
//! bounds inodes and makes moving a sandbox's files one rename. Measured here: a blank disk
//! (copy of a cached formatted image), attach and mount take ~1–2 ms; the format once per size
//! ~15 ms.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{loopdev, sys};

/// The image in a slot directory and in a checkpoint directory.
pub(super) const IMAGE: &str = "disk.ext4";
/// Where a slot's image is mounted.
pub(super) const MOUNT: &str = "disk";
/// The overlay's dirs inside the disk.
pub(super) const UPPER: &str = "upper";
pub(super) const WORK: &str = "work";

/// A disk's size when the spec names none (1 GiB: 65,536 files).
pub(super) const DEFAULT_MB: u64 = 1024;
/// The smallest disk: ext4 needs room for its journal and metadata.
pub(super) const MIN_MB: u64 = 32;
/// How long an unmount may take to release the image (the sandbox has died by then).
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// One inode per 16 KiB: 65,536 files per GiB, as ext4's default.
const BYTES_PER_INODE: &str = "16384";

/// A formatted, empty image of `mb` MiB, made once per size under `cache` and shared by
/// copying (it stays sparse: a few MiB of metadata).
fn blank(cache: &Path, mb: u64) -> io::Result<PathBuf> {
    let path = cache.join(format!("blank-{mb}m.ext4"));
    if path.is_file() {
        return Ok(path);
    }
    fs::create_dir_all(cache)?;
    let tmp = cache.join(format!(".blank-{mb}m-{:x}", sys::random_u64()));
    let f = fs::File::create(&tmp)?;
    f.set_len(mb << 20)?;
    drop(f);
    // 4 MiB journal (the disk is small and scratch); inode tables and journal left unzeroed
    // (the image is sparse, holes read as zeros); no blocks reserved for root.
    let out = std::process::Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-b",
            "4096",
            "-i",
            BYTES_PER_INODE,
            "-I",
            "256",
            "-J",
            "size=4",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
        ])
        .arg(&tmp)
        .stdin(std::process::Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::new(
                e.kind(),
                format!("cannot run mkfs.ext4 (install e2fsprogs): {e}"),
            ));
        }
    };
    if !out.status.success() {
        let _ = fs::remove_file(&tmp);
        return Err(io::Error::other(format!(
            "mkfs.ext4 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    fs::rename(&tmp, &path)?;
    Ok(path)
}

/// A new, empty disk image of `mb` MiB at `image`.
pub(super) fn create(cache: &Path, image: &Path, mb: u64) -> io::Result<()> {
    let blank = blank(cache, mb.max(MIN_MB))?;
    bulkhead_common::copy::copy_file_sparse(&blank, image)
}

/// Mount `image` at `mnt`. Refused while any loop device still holds the image: two mounts of
/// one ext4 filesystem would corrupt it.
pub(super) fn mount(image: &Path, mnt: &Path, read_only: bool) -> io::Result<()> {
    if loopdev::is_attached(image)? {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "the disk image {} is still in use (being released or mounted elsewhere); try again",
                image.display()
            ),
        ));
    }
    let dev = loopdev::attach(image)?;
    let (src, target) = (sys::cpath(&dev.path)?, sys::cpath(mnt)?);
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    // noinit_itable: no kernel thread zeroing inode tables the sparse image already reads as
    // zeros; discard: blocks the sandbox frees become holes in the image again.
    let mut data = c"noinit_itable,discard";
    if read_only {
        // Still replays a journal the image needs (the device is writable), then writes nothing.
        flags |= libc::MS_RDONLY;
        data = c"noinit_itable";
    }
    // SAFETY: all pointers are valid C strings for the duration of the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            c"ext4".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmount the disk at `mnt` (if mounted) and wait until its loop device has let go of the
/// image, so that it can be moved, copied or mounted again safely.
pub(super) fn unmount(mnt: &Path) -> io::Result<()> {
    if !sys::is_mount_root(mnt).unwrap_or(false) {
        return Ok(());
    }
    let minor = loopdev::device_of_mount(mnt);
    while sys::is_mount_root(mnt).unwrap_or(false) {
        sys::umount_detach(mnt)?;
    }
    match minor {
        Some(m) => loopdev::wait_released(m, RELEASE_BUDGET),
        None => Ok(()),
    }
}

/// A fresh disk's layout: the overlay's upper and work dirs owned by the sandbox's root.
pub(super) fn lay_out(mnt: &Path, uid: u32) -> io::Result<()> {
    let _ = fs::remove_dir(mnt.join("lost+found"));
    for sub in [UPPER, WORK] {
        let p = mnt.join(sub);
        match fs::create_dir(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::chown(&p, Some(uid), Some(uid))?;
    }
    Ok(())
}

/// Empty the overlay's work dir of a disk that held a mounted overlay (a `volatile` mount
/// leaves a marker there that makes the next mount refuse).
pub(super) fn reset_work(mnt: &Path, uid: u32) -> io::Result<()> {
    let work = mnt.join(WORK);
    match fs::remove_dir_all(&work) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    lay_out(mnt, uid)
}

/// Bytes used and the disk's size, from the filesystem itself.
pub(super) fn usage(mnt: &Path) -> (u64, u64) {
    let Ok(c) = sys::cpath(mnt) else {
        return (0, 0);
    };
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return (0, 0);
    }
    let total = st.f_blocks.saturating_mul(st.f_frsize);
    let free = st.f_bfree.saturating_mul(st.f_frsize);
    (total.saturating_sub(free), total)
}

/// `syncfs` on the filesystem holding `path` (a sandbox's disk, or the checkpoint's host
/// filesystem).
pub(super) fn sync(path: &Path) -> io::Result<()> {
    let f = fs::File::open(path)?;
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A checkpoint's disk mounted read-only for reading its files (change listings, template
/// exports); unmounted when dropped. A checkpoint written before disks existed has its files
/// in `<dir>/upper/` and needs no mount.
pub(super) struct View {
    upper: PathBuf,
    mounted: Option<PathBuf>,
}

impl View {
    /// `scratch`: a directory for the mount point, outside the checkpoint (a copy of the
    /// checkpoint must not descend into the view).
    pub(super) fn open(checkpoint: &Path, scratch: &Path) -> io::Result<View> {
        let image = checkpoint.join(IMAGE);
        if !image.is_file() {
            return Ok(View {
                upper: checkpoint.join(super::manifest::LEGACY_UPPER),
                mounted: None,
            });
        }
        fs::create_dir_all(scratch)?;
        let mnt = scratch.join(format!("view-{:x}", sys::random_u64()));
        fs::create_dir(&mnt)?;
        if let Err(e) = mount(&image, &mnt, true) {
            let _ = fs::remove_dir(&mnt);
            return Err(e);
        }
        Ok(View {
            upper: mnt.join(UPPER),
            mounted: Some(mnt),
        })
    }

    /// The sandbox's files (an overlay upper dir).
    pub(super) fn upper(&self) -> &Path {
        &self.upper
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if let Some(mnt) = &self.mounted {
            if let Err(e) = unmount(mnt) {
                tracing::warn!(mnt = %mnt.display(), error = %e, "unmount a checkpoint's disk view");
            }
            let _ = fs::remove_dir(mnt);
        }
    }
}
