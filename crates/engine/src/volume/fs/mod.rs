//! File operations inside one volume for the volume content API, confined to the volume's root
//! directory whatever the volume holds.
//!
//! A volume is written by sandboxes (untrusted code as root in its user namespace), so it may
//! hold symlinks to host paths, to `/proc` magic links or to `..`. Every path is resolved with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` from a descriptor of the
//! volume root: the kernel refuses any resolution that would leave the root (an absolute
//! symlink, `..` above the root, a magic link, another mount). The last component of an
//! operation that creates, removes or changes an entry is never followed (`*at` calls on the
//! parent with `AT_SYMLINK_NOFOLLOW`/`O_NOFOLLOW`), so a planted symlink is changed itself,
//! never its target. Client paths are checked first ([`clean`]): no `..`, no NUL, bounded
//! lengths.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use bulkhead_common::confined;
use chrono::{DateTime, TimeZone, Utc};
use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use serde::Serialize;

/// Longest path a client may give (bytes), and longest single name.
pub const MAX_PATH: usize = 4096;
pub const MAX_NAME: usize = 255;
/// Deepest recursion of a directory listing.
pub const MAX_DEPTH: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum VolumeFsError {
    /// The client's path is not acceptable.
    #[error("Invalid path '{path}': {reason}")]
    BadPath { path: String, reason: &'static str },
    /// Nothing at the path (or a parent is missing).
    #[error("Path '{0}' not found in the volume")]
    NotFound(String),
    /// Resolution would leave the volume (a symlink pointing outside, a magic link).
    #[error(
        "Path '{0}' leads outside the volume (through a symlink or another mount): use a path whose components are all inside the volume"
    )]
    Escapes(String),
    #[error("Path '{0}' already exists")]
    Exists(String),
    #[error("Path '{0}' is not a directory")]
    NotADirectory(String),
    #[error("Path '{0}' is a directory: give a file path")]
    IsADirectory(String),
    #[error("Path '{0}' is a symlink: the volume content API does not write through symlinks")]
    IsASymlink(String),
    #[error("Directory '{0}' is not empty")]
    NotEmpty(String),
    /// The volume's filesystem is full.
    #[error(
        "The volume is full: delete files or ask the operator for a larger `--volume-max-bytes`"
    )]
    Full,
    #[error("Invalid {what}: {reason}")]
    BadArgument { what: &'static str, reason: String },
    /// Anything else the filesystem said.
    #[error("A file operation in the volume failed")]
    Io(#[source] io::Error),
}

type Result<T, E = VolumeFsError> = std::result::Result<T, E>;

impl VolumeFsError {
    /// Map an errno from operating on `path`.
    fn from_errno(e: Errno, path: &str) -> Self {
        match e {
            Errno::ENOENT => VolumeFsError::NotFound(path.to_string()),
            Errno::EXDEV | Errno::ELOOP => VolumeFsError::Escapes(path.to_string()),
            Errno::EEXIST => VolumeFsError::Exists(path.to_string()),
            Errno::ENOTDIR => VolumeFsError::NotADirectory(path.to_string()),
            Errno::EISDIR => VolumeFsError::IsADirectory(path.to_string()),
            Errno::ENOTEMPTY => VolumeFsError::NotEmpty(path.to_string()),
            Errno::ENOSPC | Errno::EDQUOT => VolumeFsError::Full,
            Errno::ENAMETOOLONG => VolumeFsError::BadPath {
                path: path.to_string(),
                reason: "a name is too long (max 255 bytes)",
            },
            e => VolumeFsError::Io(io::Error::from(e)),
        }
    }

    /// Map an I/O error from reading or writing an open file.
    pub fn from_io(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => VolumeFsError::Full,
            _ => VolumeFsError::Io(e),
        }
    }
}

/// A client path made relative to the volume root: no leading `/`, no `.` or empty
/// components; `..` and NUL refused. The root itself is the empty path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolPath {
    rel: PathBuf,
    /// As the client should see it (absolute, normalised).
    shown: String,
}

impl VolPath {
    pub fn is_root(&self) -> bool {
        self.rel.as_os_str().is_empty()
    }
    pub fn shown(&self) -> &str {
        &self.shown
    }
    fn name(&self) -> &OsStr {
        self.rel.file_name().unwrap_or_else(|| OsStr::new("."))
    }
    fn parent(&self) -> &Path {
        self.rel.parent().unwrap_or_else(|| Path::new(""))
    }
    fn child(&self, name: &OsStr) -> VolPath {
        let rel = self.rel.join(name);
        let shown = format!("/{}", rel.to_string_lossy());
        VolPath { rel, shown }
    }
}

/// Check and normalise a client path (see [`VolPath`]).
pub fn clean(path: &str) -> Result<VolPath> {
    let bad = |reason| VolumeFsError::BadPath {
        path: path.chars().take(200).collect(),
        reason,
    };
    if path.len() > MAX_PATH {
        return Err(bad("it is too long (max 4096 bytes)"));
    }
    if path.contains('\0') {
        return Err(bad("it contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(bad("'..' is not allowed")),
            c if c.len() > MAX_NAME => return Err(bad("a name is too long (max 255 bytes)")),
            c => parts.push(c),
        }
    }
    let rel: PathBuf = parts.iter().collect();
    Ok(VolPath {
        shown: format!("/{}", parts.join("/")),
        rel,
    })
}

/// `file`, `directory`, `symlink` or `unknown`, as E2B's `VolumeEntryStat.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Directory,
    Symlink,
    Unknown,
}

/// E2B's `VolumeEntryStat`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = VolumeEntryStat)]
pub struct EntryStat {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: DateTime<Utc>,
    pub mtime: DateTime<Utc>,
    pub ctime: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Owner and mode for an entry the API creates or changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attrs {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

impl Attrs {
    fn check(&self) -> Result<()> {
        if let Some(m) = self.mode
            && m > 0o7777
        {
            return Err(VolumeFsError::BadArgument {
                what: "mode",
                reason: format!("{m:o} has bits outside 07777"),
            });
        }
        for (what, v) in [("uid", self.uid), ("gid", self.gid)] {
            if let Some(v) = v
                && v >= 65536
            {
                return Err(VolumeFsError::BadArgument {
                    what,
                    reason: format!("{v} is outside a sandbox's ids (0-65535)"),
                });
            }
        }
        Ok(())
    }
}

fn ts(sec: i64, nsec: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(sec, nsec.clamp(0, 999_999_999) as u32)
        .single()
        .unwrap_or_default()
}

fn kind_of(st: &FileStat) -> EntryType {
    match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
        SFlag::S_IFREG => EntryType::File,
        SFlag::S_IFDIR => EntryType::Directory,
        SFlag::S_IFLNK => EntryType::Symlink,
        _ => EntryType::Unknown,
    }
}

/// One volume's root, opened once per operation.
pub struct VolumeRoot {
    fd: OwnedFd,
    /// Owner of entries created without an explicit uid/gid (None: whoever the server is).
    default_owner: Option<(u32, u32)>,
}

const RESOLVE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

impl VolumeRoot {
    /// Open the volume's root directory on the host.
    pub fn open(dir: &Path, default_owner: Option<(u32, u32)>) -> Result<Self> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeFsError::Io(io::Error::from(e)))?;
        Ok(Self { fd, default_owner })
    }

    /// `openat2` beneath the root.
    fn resolve(&self, rel: &Path, flags: OFlag, shown: &str) -> Result<OwnedFd> {
        confined::open_beneath(self.fd.as_fd(), rel, flags, RESOLVE)
            .map_err(|e| VolumeFsError::from_errno(e, shown))
    }

    /// The directory holding `p`'s last component.
    fn parent_dir(&self, p: &VolPath) -> Result<OwnedFd> {
        self.resolve(p.parent(), OFlag::O_PATH | OFlag::O_DIRECTORY, p.shown())
    }

    fn stat_at(&self, dir: BorrowedFd<'_>, p: &VolPath) -> Result<EntryStat> {
        let name = p.name();
        let st = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| VolumeFsError::from_errno(e, p.shown()))?;
        let kind = kind_of(&st);
        let target = if kind == EntryType::Symlink {
            nix::fcntl::readlinkat(dir, name)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(EntryStat {
            name: if p.is_root() {
                String::new()
            } else {
                name.to_string_lossy().into_owned()
            },
            kind,
            path: p.shown().to_string(),
            size: if kind == EntryType::Directory {
                0
            } else {
                st.st_size as u64
            },
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: ts(st.st_atime, st.st_atime_nsec),
            mtime: ts(st.st_mtime, st.st_mtime_nsec),
            ctime: ts(st.st_ctime, st.st_ctime_nsec),
            target,
        })
    }

    /// Stat without following a final symlink.
    pub fn stat(&self, p: &VolPath) -> Result<EntryStat> {
        if p.is_root() {
            let st = self.resolve(Path::new(""), OFlag::O_PATH | OFlag::O_DIRECTORY, "/")?;
            let mut e = self.stat_at(st.as_fd(), &clean(".")?)?;
            e.path = "/".into();
            return Ok(e);
        }
        let dir = self.parent_dir(p)?;
        self.stat_at(dir.as_fd(), p)
    }

    /// Entries under a directory, `depth` levels deep (1 = its children), sorted by path.
    pub fn list(&self, p: &VolPath, depth: u32) -> Result<Vec<EntryStat>> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(VolumeFsError::BadArgument {
                what: "depth",
                reason: format!("{depth} is outside 1-{MAX_DEPTH}"),
            });
        }
        let dir = self.resolve(&p.rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, p.shown())?;
        let mut out = Vec::new();
        self.list_into(dir, p, depth, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn list_into(
        &self,
        dir: OwnedFd,
        p: &VolPath,
        depth: u32,
        out: &mut Vec<EntryStat>,
    ) -> Result<()> {
        let names = dir_names(dir.as_fd(), p.shown())?;
        for name in names {
            let child = p.child(&name);
            let st = match self.stat_at(dir.as_fd(), &child) {
                Ok(st) => st,
                // Removed meanwhile (a sandbox may be writing): skip it.
                Err(VolumeFsError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            let is_dir = st.kind == EntryType::Directory;
            out.push(st);
            if is_dir && depth > 1 {
                match confined::open_subdir(dir.as_fd(), &name) {
                    Ok(sub) => self.list_into(sub, &child, depth - 1, out)?,
                    Err(Errno::ENOENT) | Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => {}
                    Err(e) => return Err(VolumeFsError::from_errno(e, child.shown())),
                }
            }
        }
        Ok(())
    }

    /// Open a file for reading (a symlink is followed only while it stays inside the volume).
    pub fn open_read(&self, p: &VolPath) -> Result<File> {
        // O_NONBLOCK: a FIFO a sandbox planted must not park this thread until a writer comes
        // (no effect on regular files, the only kind read below).
        let fd = self.resolve(&p.rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, p.shown())?;
        let f = File::from(fd);
        let meta = f.metadata().map_err(VolumeFsError::Io)?;
        if meta.is_dir() {
            return Err(VolumeFsError::IsADirectory(p.shown().to_string()));
        }
        if !meta.is_file() {
            return Err(VolumeFsError::BadPath {
                path: p.shown().to_string(),
                reason: "it is not a regular file",
            });
        }
        clear_nonblock(&f)?;
        Ok(f)
    }

    /// Create the directories of `p` one by one (`mkdir -p`), never following a symlink.
    fn mkdir_all(&self, p: &VolPath, attrs: &Attrs) -> Result<OwnedFd> {
        let mut cur = self.resolve(Path::new(""), OFlag::O_PATH | OFlag::O_DIRECTORY, "/")?;
        let mut at = clean("")?;
        for comp in p.rel.iter() {
            at = at.child(comp);
            match nix::sys::stat::mkdirat(cur.as_fd(), comp, Mode::from_bits_truncate(0o755)) {
                Ok(()) => self.apply_attrs(cur.as_fd(), &at, attrs, 0o755)?,
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(VolumeFsError::from_errno(e, at.shown())),
            }
            cur = nix::fcntl::openat(
                cur.as_fd(),
                comp,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::ELOOP | Errno::ENOTDIR => VolumeFsError::NotADirectory(at.shown().into()),
                e => VolumeFsError::from_errno(e, at.shown()),
            })?;
        }
        Ok(cur)
    }

    /// Set owner and mode of an entry the API just created in `dir`.
    fn apply_attrs(
        &self,
        dir: BorrowedFd<'_>,
        p: &VolPath,
        attrs: &Attrs,
        default_mode: u32,
    ) -> Result<()> {
        change_attrs(dir, p, attrs, self.default_owner, default_mode)
    }

    /// Create a directory. `parents`: create missing parents and accept an existing
    /// directory; otherwise the parent must exist and the path must not.
    pub fn make_dir(&self, p: &VolPath, attrs: &Attrs, parents: bool) -> Result<EntryStat> {
        attrs.check()?;
        if p.is_root() {
            return Err(VolumeFsError::Exists("/".into()));
        }
        if parents {
            self.mkdir_all(p, attrs)?;
            let st = self.stat(p)?;
            if st.kind != EntryType::Directory {
                return Err(VolumeFsError::NotADirectory(p.shown().into()));
            }
            return Ok(st);
        }
        let dir = self.parent_dir(p)?;
        nix::sys::stat::mkdirat(dir.as_fd(), p.name(), Mode::from_bits_truncate(0o755))
            .map_err(|e| VolumeFsError::from_errno(e, p.shown()))?;
        self.apply_attrs(dir.as_fd(), p, attrs, 0o755)?;
        self.stat_at(dir.as_fd(), p)
    }

    /// Create or truncate a regular file for writing. `parents`: create missing parents.
    /// A symlink at the path is refused, not followed.
    pub fn open_write(&self, p: &VolPath, attrs: &Attrs, parents: bool) -> Result<File> {
        attrs.check()?;
        if p.is_root() {
            return Err(VolumeFsError::IsADirectory("/".into()));
        }
        let dir = if parents {
            let parent = clean(&p.parent().to_string_lossy())?;
            self.mkdir_all(&parent, &Attrs::default())?
        } else {
            self.parent_dir(p)?
        };
        // An existing file keeps its owner and mode unless the request sets them.
        let existing = nix::sys::stat::fstatat(
            dir.as_fd(),
            p.name(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .ok()
        .map(|st| st.st_mode & 0o7777);
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            p.name(),
            // O_NONBLOCK: an existing FIFO without a reader fails (ENXIO) instead of blocking.
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| match e {
            Errno::ELOOP => VolumeFsError::IsASymlink(p.shown().into()),
            Errno::ENXIO | Errno::ENODEV => VolumeFsError::BadPath {
                path: p.shown().into(),
                reason: "it is not a regular file",
            },
            e => VolumeFsError::from_errno(e, p.shown()),
        })?;
        let file = File::from(fd);
        // Truncate only what is a regular file (never a FIFO or a device a sandbox made).
        let meta = file.metadata().map_err(VolumeFsError::Io)?;
        if !meta.is_file() {
            return Err(VolumeFsError::BadPath {
                path: p.shown().into(),
                reason: "it is not a regular file",
            });
        }
        file.set_len(0).map_err(VolumeFsError::from_io)?;
        clear_nonblock(&file)?;
        match existing {
            Some(mode) => change_attrs(dir.as_fd(), p, attrs, None, mode)?,
            None => self.apply_attrs(dir.as_fd(), p, attrs, 0o644)?,
        }
        Ok(file)
    }

    /// Change owner and mode (`update_metadata`); a symlink's own owner is changed.
    pub fn set_attrs(&self, p: &VolPath, attrs: &Attrs) -> Result<EntryStat> {
        attrs.check()?;
        let dir = if p.is_root() {
            return Err(VolumeFsError::BadPath {
                path: "/".into(),
                reason: "the volume root's metadata cannot be changed",
            });
        } else {
            self.parent_dir(p)?
        };
        let cur = self.stat_at(dir.as_fd(), p)?;
        change_attrs(dir.as_fd(), p, attrs, None, cur.mode)?;
        self.stat_at(dir.as_fd(), p)
    }

    /// Remove a file, symlink or (recursively) directory; never follows a symlink.
    pub fn remove(&self, p: &VolPath) -> Result<()> {
        if p.is_root() {
            return Err(VolumeFsError::BadPath {
                path: "/".into(),
                reason: "the volume root cannot be removed (delete the volume instead)",
            });
        }
        let dir = self.parent_dir(p)?;
        remove_at(dir.as_fd(), p.name(), p.shown())
    }
}

/// Set owner and mode of `p` in `dir`, not following a symlink (a symlink keeps its mode).
fn change_attrs(
    dir: BorrowedFd<'_>,
    p: &VolPath,
    attrs: &Attrs,
    default_owner: Option<(u32, u32)>,
    default_mode: u32,
) -> Result<()> {
    let name = p.name();
    let owner = match (attrs.uid, attrs.gid, default_owner) {
        (None, None, None) => None,
        (u, g, def) => Some((u.or(def.map(|d| d.0)), g.or(def.map(|d| d.1)))),
    };
    if let Some((u, g)) = owner {
        nix::unistd::fchownat(
            dir,
            name,
            u.map(Uid::from_raw),
            g.map(Gid::from_raw),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| VolumeFsError::from_errno(e, p.shown()))?;
    }
    // Never follow: a sandbox may swap the entry for a symlink at any moment, and a followed
    // absolute link would resolve against the host's root. (glibc does this with fchmodat2 or
    // an O_PATH descriptor; a symlink answers EOPNOTSUPP and keeps its mode.)
    let mode = attrs.mode.unwrap_or(default_mode);
    match nix::sys::stat::fchmodat(
        dir,
        name,
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
    ) {
        Ok(()) | Err(Errno::EOPNOTSUPP) => {}
        Err(e) => return Err(VolumeFsError::from_errno(e, p.shown())),
    }
    Ok(())
}

/// Back to blocking I/O on an open regular file (it was opened `O_NONBLOCK`).
fn clear_nonblock(f: &File) -> Result<()> {
    let flags = nix::fcntl::fcntl(f, nix::fcntl::FcntlArg::F_GETFL)
        .map_err(|e| VolumeFsError::Io(io::Error::from(e)))?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(f, nix::fcntl::FcntlArg::F_SETFL(flags))
        .map_err(|e| VolumeFsError::Io(io::Error::from(e)))?;
    Ok(())
}

/// The names in an open directory (without `.` and `..`), through the shared confined primitive.
fn dir_names(dir: BorrowedFd<'_>, shown: &str) -> Result<Vec<std::ffi::OsString>> {
    confined::dir_names(dir).map_err(|e| match e.raw_os_error() {
        Some(n) => VolumeFsError::from_errno(Errno::from_raw(n), shown),
        None => VolumeFsError::Io(e),
    })
}

/// Remove `name` in `dir`; a directory is emptied first, through descriptors only.
fn remove_at(dir: BorrowedFd<'_>, name: &OsStr, shown: &str) -> Result<()> {
    match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(VolumeFsError::from_errno(e, shown)),
    }
    let sub = confined::open_subdir(dir, name).map_err(|e| VolumeFsError::from_errno(e, shown))?;
    let names = dir_names(sub.as_fd(), shown)?;
    for n in names {
        let child = format!("{shown}/{}", n.to_string_lossy());
        match remove_at(sub.as_fd(), &n, &child) {
            Ok(()) | Err(VolumeFsError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir)
        .map_err(|e| VolumeFsError::from_errno(e, shown))
}

#[cfg(test)]
mod tests;
