//! Building [`EntryInfo`] from the filesystem, the way envd reports entries.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use bulkhead_envd::Timestamp;
use bulkhead_envd::filesystem::{EntryInfo, FileType};
use bulkhead_envd::rest::METADATA_XATTR_PREFIX;

use crate::users::UserDb;

/// Go's `os.FileMode.String()` for a raw `st_mode`, e.g. `-rw-r--r--`, `drwxrwxrwt` is
/// rendered as `dtrwxrwxrwx`, a setuid program as `urwxr-xr-x`, a symlink as `Lrwxrwxrwx`.
pub fn go_mode_string(st_mode: u32) -> String {
    let kind = st_mode & libc::S_IFMT;
    let mut out = String::with_capacity(12);
    // Go prints one letter per set type bit, in the order of "dalTLDpSugct?".
    if kind == libc::S_IFDIR {
        out.push('d');
    }
    if kind == libc::S_IFLNK {
        out.push('L');
    }
    if kind == libc::S_IFBLK || kind == libc::S_IFCHR {
        out.push('D');
    }
    if kind == libc::S_IFIFO {
        out.push('p');
    }
    if kind == libc::S_IFSOCK {
        out.push('S');
    }
    if st_mode & libc::S_ISUID != 0 {
        out.push('u');
    }
    if st_mode & libc::S_ISGID != 0 {
        out.push('g');
    }
    if kind == libc::S_IFCHR {
        out.push('c');
    }
    if st_mode & libc::S_ISVTX != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

fn file_type(meta: &std::fs::Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_file() {
        FileType::File
    } else if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::Unspecified
    }
}

fn timestamp(meta: &std::fs::Metadata) -> Option<Timestamp> {
    let t = Timestamp {
        seconds: meta.mtime(),
        nanos: i32::try_from(meta.mtime_nsec()).unwrap_or(0),
    };
    (t != Timestamp::default()).then_some(t)
}

/// Reads the `user.e2b.*` extended attributes of `path` (not following symlinks), prefix
/// stripped. Missing support or permission simply yields no metadata.
pub fn read_metadata(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return out;
    };
    let mut names = vec![0_u8; 4096];
    // SAFETY: the buffer is valid for `names.len()` bytes; the path is NUL-terminated.
    let len = unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let Ok(len) = usize::try_from(len) else {
        return out;
    };
    for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Some(key) = name.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        let Ok(c_name) = CString::new(name) else {
            continue;
        };
        let mut value = vec![0_u8; 4096];
        // SAFETY: buffers are valid for their lengths; strings are NUL-terminated.
        let n = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if let Ok(n) = usize::try_from(n) {
            out.insert(
                String::from_utf8_lossy(key).into_owned(),
                String::from_utf8_lossy(&value[..n]).into_owned(),
            );
        }
    }
    out
}

/// Describes the entry at `path` without following it if it is a symlink; for a symlink, `type`
/// and `mode` describe the target and `symlink_target` is the fully resolved target path.
pub fn entry_info(path: &Path, users: &UserDb) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    Ok(entry_from_metadata(path, &meta, users))
}

/// Like [`entry_info`] with metadata already at hand.
pub fn entry_from_metadata(path: &Path, meta: &std::fs::Metadata, users: &UserDb) -> EntryInfo {
    let is_symlink = meta.file_type().is_symlink();
    let (r#type, mode, symlink_target) = if is_symlink {
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        match std::fs::metadata(&target) {
            Ok(target_meta) => (
                file_type(&target_meta),
                target_meta.mode() & 0o777,
                Some(target.to_string_lossy().into_owned()),
            ),
            Err(_) => (
                FileType::Unspecified,
                0,
                Some(target.to_string_lossy().into_owned()),
            ),
        }
    } else {
        (file_type(meta), meta.mode() & 0o777, None)
    };
    EntryInfo {
        name: path
            .file_name()
            .map_or_else(|| "/".to_owned(), |n| n.to_string_lossy().into_owned()),
        r#type: r#type.into(),
        path: path.to_string_lossy().into_owned(),
        size: i64::try_from(meta.size()).unwrap_or(i64::MAX),
        mode,
        permissions: go_mode_string(meta.mode()),
        owner: users.user_name(meta.uid()),
        group: users.group_name(meta.gid()),
        modified_time: timestamp(meta),
        symlink_target,
        metadata: if is_symlink || meta.file_type().is_fifo() {
            BTreeMap::new()
        } else {
            read_metadata(path)
        },
        is_symlink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_match_go() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(
            go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(go_mode_string(libc::S_IFIFO | 0o600), "prw-------");
        assert_eq!(go_mode_string(libc::S_IFSOCK | 0o755), "Srwxr-xr-x");
    }

    #[test]
    fn symlinks_describe_their_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("missing"), &dangling).unwrap();
        let users = UserDb::default();

        let entry = entry_info(&link, &users).unwrap();
        assert!(entry.is_symlink);
        assert_eq!(entry.r#type(), FileType::Directory);
        assert_eq!(entry.permissions, "Lrwxrwxrwx");
        let canonical = std::fs::canonicalize(&target).unwrap();
        assert_eq!(
            entry.symlink_target.as_deref(),
            Some(canonical.to_str().unwrap())
        );

        let entry = entry_info(&dangling, &users).unwrap();
        assert!(entry.is_symlink);
        assert_eq!(entry.r#type(), FileType::Unspecified);

        let file = dir.path().join("f");
        std::fs::write(&file, "abc").unwrap();
        let entry = entry_info(&file, &users).unwrap();
        assert_eq!(
            (entry.r#type(), entry.size, entry.is_symlink),
            (FileType::File, 3, false)
        );
        assert_eq!(entry.name, "f");
        assert!(entry.modified_time.is_some());
    }
}
