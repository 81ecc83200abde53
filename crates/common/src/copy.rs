//! The project's one way to copy what a sandbox wrote: whole trees (`cp -a`: owners, modes,
//! times to the nanosecond, xattrs such as overlay whiteout markers, device nodes, hard links,
//! sparse files, reflinks where the filesystem has them) and single image files (a reflink,
//! else only their data extents, so a sparse 10 GiB disk holding 20 MiB costs 20 MiB to copy).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// `cp -a` of `from` to `to` (which must not exist), with reflinks where the filesystem
/// supports them and holes kept. A full disk is reported as `ENOSPC`, so callers can say so.
pub fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let out = std::process::Command::new("cp")
        .args([
            "-a",
            "--reflink=auto",
            "--sparse=always",
            "--no-target-directory",
        ])
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

/// Copy the regular file `from` to the new file `to` (created with `from`'s permission bits):
/// a reflink (`FICLONE`) where the filesystem shares extents, otherwise only the data extents
/// (`SEEK_DATA`/`SEEK_HOLE` and `copy_file_range`), leaving holes as holes. The copy is
/// removed when it fails half-way.
pub fn copy_file_sparse(from: &Path, to: &Path) -> io::Result<()> {
    let src = File::open(from)?;
    let meta = src.metadata()?;
    let dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(meta.permissions().mode() & 0o7777)
        .custom_flags(libc::O_CLOEXEC)
        .open(to)?;
    let copied = clone_or_copy_extents(&src, &dst, meta.len());
    if copied.is_err() {
        drop(dst);
        let _ = fs::remove_file(to);
    }
    copied
}

fn clone_or_copy_extents(src: &File, dst: &File, len: u64) -> io::Result<()> {
    // SAFETY: FICLONE takes the source descriptor as its argument; both fds are open.
    if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
        return Ok(());
    }
    dst.set_len(len)?;
    let mut pos: i64 = 0;
    let end = len as i64;
    while pos < end {
        let data = match seek(src, pos, libc::SEEK_DATA) {
            Ok(d) => d,
            // No data after `pos`: the rest is a hole.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) => return Err(e),
        };
        let hole = seek(src, data, libc::SEEK_HOLE)?.min(end);
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let want = (hole - off_in) as usize;
            // SAFETY: both fds are open; the offsets are valid pointers to i64s.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the source file shrank while it was copied",
                ));
            }
        }
        pos = hole;
    }
    Ok(())
}

fn seek(f: &File, offset: i64, whence: libc::c_int) -> io::Result<i64> {
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_file_is_copied_with_its_holes() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        let mut f = File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        f.seek(SeekFrom::Start((64 << 20) - 3)).unwrap();
        f.write_all(b"end").unwrap();
        drop(f);
        fs::set_permissions(&a, fs::Permissions::from_mode(0o640)).unwrap();
        copy_file_sparse(&a, &b).unwrap();
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
        let mb = fs::metadata(&b).unwrap();
        assert_eq!(mb.len(), 64 << 20);
        // Allocated: the two written extents, not 64 MiB.
        assert!(mb.blocks() * 512 < 4 << 20, "{}", mb.blocks());
        assert_eq!(mb.permissions().mode() & 0o777, 0o640);
        // Never over an existing file.
        assert_eq!(
            copy_file_sparse(&a, &b).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }

    #[test]
    fn a_tree_keeps_owners_modes_nanosecond_times_and_links() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(a.join("d")).unwrap();
        fs::write(a.join("d/f"), b"x").unwrap();
        fs::set_permissions(a.join("d/f"), fs::Permissions::from_mode(0o4755)).unwrap();
        std::os::unix::fs::symlink("d/f", a.join("l")).unwrap();
        fs::hard_link(a.join("d/f"), a.join("h")).unwrap();
        copy_tree(&a, &b).unwrap();
        let (fa, fb) = (
            fs::metadata(a.join("d/f")).unwrap(),
            fs::metadata(b.join("d/f")).unwrap(),
        );
        assert_eq!(fb.mode(), fa.mode());
        assert_eq!((fb.mtime(), fb.mtime_nsec()), (fa.mtime(), fa.mtime_nsec()));
        assert_eq!(fs::read_link(b.join("l")).unwrap(), Path::new("d/f"));
        assert_eq!(fs::metadata(b.join("h")).unwrap().ino(), fb.ino());
    }
}
