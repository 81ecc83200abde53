//! Moving a saved overlay upper dir to another slot's uid range: every entry owned by an id of
//! the old range gets the same offset in the new one. Runs on checkpoint copies only, where
//! no sandbox process is running, and still walks through descriptors only, never following a
//! symlink (the tree is sandbox-written).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, lchown};
use std::path::Path;

use bulkhead_common::confined;

/// Which ids move where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shift {
    pub from: u32,
    pub to: u32,
    pub count: u32,
}

impl Shift {
    /// The id in the new range, or None for an id outside the old range (left alone).
    pub fn map(&self, id: u32) -> Option<u32> {
        (id >= self.from && u64::from(id) < u64::from(self.from) + u64::from(self.count))
            .then(|| id - self.from + self.to)
    }

    /// Shift ownership of `root` and everything beneath it; returns how many entries changed.
    ///
    /// Set-uid/set-gid bits are put back after the chown (which clears them): the sandbox's
    /// own `sudo` and `passwd` need them. They are only ever effective inside sandboxes: every
    /// tree this runs on sits in an owner-only directory on the host (a checkpoint, a slot, an
    /// export, the image cache), so no other host user can reach the file to execute it.
    pub fn apply(&self, root: &Path) -> io::Result<u64> {
        if self.from == self.to {
            return Ok(0);
        }
        let mut changed = 0;
        // The root is the server's own path; what lies beneath it was written by a sandbox and
        // is walked through descriptors only (see `bulkhead_common::confined`).
        let md = fs::symlink_metadata(root)?;
        let (uid, gid) = (self.map(md.uid()), self.map(md.gid()));
        if uid.is_some() || gid.is_some() {
            lchown(root, uid, gid)?;
            changed += 1;
        }
        for found in confined::Walker::new(root)? {
            let found = found?;
            let st = &found.stat;
            let (uid, gid) = (self.map(st.st_uid), self.map(st.st_gid));
            if uid.is_none() && gid.is_none() {
                continue;
            }
            let name = cstring(&found.name)?;
            let dir = found.dir.as_raw_fd();
            // SAFETY: an open directory descriptor and a valid C string; never follows a
            // symlink; u32::MAX (-1) leaves an id unchanged.
            let r = unsafe {
                libc::fchownat(
                    dir,
                    name.as_ptr(),
                    uid.unwrap_or(u32::MAX),
                    gid.unwrap_or(u32::MAX),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_mode & 0o6000 != 0 {
                // A regular file when it was found; AT_SYMLINK_NOFOLLOW so that a symlink in
                // its place would fail (EOPNOTSUPP) rather than change its target.
                // SAFETY: as above.
                let r = unsafe {
                    libc::fchmodat(
                        dir,
                        name.as_ptr(),
                        st.st_mode & 0o7777,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            changed += 1;
        }
        Ok(changed)
    }
}

fn cstring(name: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_only_the_old_range() {
        let s = Shift {
            from: 1_000_000,
            to: 1_131_072,
            count: 65536,
        };
        assert_eq!(s.map(1_000_000), Some(1_131_072));
        assert_eq!(s.map(1_001_000), Some(1_132_072));
        assert_eq!(s.map(1_065_535), Some(1_196_607));
        assert_eq!(s.map(1_065_536), None);
        assert_eq!(s.map(0), None);
        assert_eq!(s.map(999_999), None);
    }

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn shifts_a_tree_without_following_symlinks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("upper");
        fs::create_dir_all(root.join("home/user")).unwrap();
        let file = root.join("home/user/f");
        fs::write(&file, b"x").unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, b"host").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("home/user/link")).unwrap();
        for p in [&root, &root.join("home"), &root.join("home/user"), &file] {
            lchown(p, Some(1_000_000), Some(1_000_000)).unwrap();
        }
        lchown(
            root.join("home/user/link"),
            Some(1_001_000),
            Some(1_001_000),
        )
        .unwrap();
        lchown(&outside, Some(1_000_000), Some(1_000_000)).unwrap();
        // After the chowns above, which clear it.
        fs::set_permissions(&file, fs::Permissions::from_mode(0o4755)).unwrap();

        let s = Shift {
            from: 1_000_000,
            to: 1_065_536,
            count: 65536,
        };
        assert_eq!(s.apply(&root).unwrap(), 5);
        let md = |p: &Path| fs::symlink_metadata(p).unwrap();
        assert_eq!(md(&root).uid(), 1_065_536);
        assert_eq!(md(&file).uid(), 1_065_536);
        assert_eq!(md(&file).mode() & 0o7777, 0o4755, "set-uid bit kept");
        assert_eq!(md(&root.join("home/user/link")).uid(), 1_066_536);
        assert_eq!(
            md(&outside).uid(),
            1_000_000,
            "the symlink's target is untouched"
        );
    }
}
