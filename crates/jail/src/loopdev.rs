//! Loop devices for sandbox disks: attach an image file (`LOOP_CONFIGURE`, autoclear, direct
//! I/O) and find out whether one is still attached. Raw ioctls: libc has no constants for
//! them, and `mount -o loop` costs a process per sandbox.
//!
//! Autoclear: the device detaches itself when its last user (the mounted filesystem) lets go,
//! so an unmount is all a teardown needs, and a server that dies leaks no device.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LOOP_MAJOR: u32 = 7;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h, Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device attached to an image. Mount it, then drop this: with autoclear the device
/// stays while the filesystem is mounted and goes with the last unmount.
#[derive(Debug)]
pub struct Attached {
    /// `/dev/loopN`.
    pub path: PathBuf,
    _dev: File,
}

/// Attach `image` (read-write) to a free loop device.
pub fn attach(image: &Path) -> io::Result<Attached> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // Another attacher may take the free device between the two calls: ask again.
    for _ in 0..16 {
        // SAFETY: plain ioctl on an open descriptor; returns the device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: an all-zero loop_config is valid; the fields set below are plain integers.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = backing.as_raw_fd() as u32;
        cfg.block_size = 4096;
        // Direct I/O: the image's pages are not cached a second time under the filesystem's.
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        // SAFETY: `cfg` is a valid loop_config for the duration of the call.
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg) } == 0 {
            return Ok(Attached { path, _dev: dev });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        "no free loop device after 16 tries",
    ))
}

/// The loop device (by minor number) a mounted filesystem at `mnt` lives on, if any.
pub fn device_of_mount(mnt: &Path) -> Option<u32> {
    let dev = fs::metadata(mnt).ok()?.dev();
    (libc::major(dev) == LOOP_MAJOR).then(|| libc::minor(dev))
}

/// Wait until loop device `minor` has let go of its image (its filesystem's last mount gone),
/// so that nothing writes to the image any more and it may be mounted again elsewhere.
pub fn wait_released(minor: u32, budget: Duration) -> io::Result<()> {
    let backing = PathBuf::from(format!(
        "/sys/dev/block/{LOOP_MAJOR}:{minor}/loop/backing_file"
    ));
    let until = Instant::now() + budget;
    while backing.exists() {
        if Instant::now() >= until {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "loop device {minor} still holds its image {budget:?} after the unmount \
                     (a process still has the sandbox's filesystem)"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Is `image` attached to any loop device now? (By device and inode of the file the kernel
/// names, which follows renames.)
pub fn is_attached(image: &Path) -> io::Result<bool> {
    let m = fs::metadata(image)?;
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Ok(false);
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        // The path follows renames; a deleted image reads "<path> (deleted)" and is not ours.
        let Ok(backing) = fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(backing.trim_end_matches('\n'))
            .metadata()
            .is_ok_and(|b| b.dev() == m.dev() && b.ino() == m.ino())
        {
            return Ok(true);
        }
    }
    Ok(false)
}
