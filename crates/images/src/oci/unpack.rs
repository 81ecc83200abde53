//! Applying one OCI layer (an uncompressed tar stream) onto a tree, safely: OCI whiteouts
//! (`.wh.NAME` deletes a lower entry, `.wh..wh..opq` empties a lower directory), hard links,
//! symlinks, FIFOs; device nodes skipped; and nothing ever written outside the tree.
//!
//! Containment: an entry's path is rejected if it is absolute or climbs with `..`; its parent
//! directories are resolved *inside* the tree (a symlink met on the way is followed as if the
//! tree were `/`, so `lib -> /usr/lib` keeps working, but `../../etc` or `/etc` targets stay
//! clamped to the tree's root); the final component is never followed (an existing symlink
//! there is replaced, not written through). The tree belongs to this unpack alone (it is the
//! cache entry's `rootfs.tmp`, under the entry's lock), so nothing can swap a component
//! between the check and the use.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::mkfifo;

use super::confine::{clean_relative, io_err, mkdir, resolve_dir};
use super::error::OciError;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// Owners at or above this are outside the 65536 ids a sandbox maps; they become `nobody`.
const ID_RANGE: u64 = 65536;
const NOBODY: u32 = 65534;

/// What one unpack may write, across all layers of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Sum of regular files' sizes.
    pub max_bytes: u64,
    /// Tar entries (files, dirs, links, whiteouts).
    pub max_entries: u64,
}

/// Running totals across layers, checked against [`UnpackLimits`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    pub bytes: u64,
    pub entries: u64,
    /// Device nodes and other entries that are not created (a sandbox gets its own /dev).
    pub skipped: u64,
}

/// Applies layer tars onto one tree.
pub struct Unpacker<'a> {
    root: &'a Path,
    limits: UnpackLimits,
    /// Set the owners recorded in the layer (needs root); otherwise files belong to the caller.
    preserve_owners: bool,
    pub stats: UnpackStats,
}

impl<'a> Unpacker<'a> {
    pub fn new(root: &'a Path, limits: UnpackLimits, preserve_owners: bool) -> Self {
        Unpacker {
            root,
            limits,
            preserve_owners,
            stats: UnpackStats::default(),
        }
    }

    /// Applies one uncompressed layer tar. `layer` names it in errors.
    pub fn apply(&mut self, tar: impl Read, layer: &str) -> Result<(), OciError> {
        let mut archive = tar::Archive::new(tar);
        // Paths this layer created: an opaque marker or whiteout only removes lower layers'
        // entries, whatever the order of the tar.
        let mut created: HashSet<PathBuf> = HashSet::new();
        let entries = archive
            .entries()
            .map_err(|e| OciError::layer(layer, format!("not a tar stream: {e}")))?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| OciError::layer(layer, format!("corrupt tar entry: {e}")))?;
            self.stats.entries += 1;
            if self.stats.entries > self.limits.max_entries {
                return Err(OciError::TooLarge {
                    what: "files",
                    limit: self.limits.max_entries,
                });
            }
            let raw = entry
                .path()
                .map_err(|e| OciError::layer(layer, format!("unreadable entry name: {e}")))?
                .into_owned();
            let Some(rel) = clean_relative(&raw).map_err(|why| OciError::Escape {
                layer: layer.to_owned(),
                path: raw.display().to_string(),
                why,
            })?
            else {
                continue; // the root itself (`./`): the tree's root keeps its own mode
            };
            self.apply_entry(&mut entry, &rel, layer, &mut created)?;
        }
        Ok(())
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        layer: &str,
        created: &mut HashSet<PathBuf>,
    ) -> Result<(), OciError> {
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let rel_parent = rel.parent().unwrap_or(Path::new(""));
        let parent = resolve_dir(self.root, rel_parent, layer, true)?;

        if name == OPAQUE_MARKER {
            let own: HashSet<PathBuf> = created
                .iter()
                .filter_map(|p| p.strip_prefix(&parent).ok().map(Path::to_path_buf))
                .collect();
            return remove_lower(&parent, Path::new(""), &own);
        }
        if let Some(victim) = name.strip_prefix(WHITEOUT_PREFIX) {
            if victim.is_empty() || victim == "." || victim == ".." {
                return Err(OciError::layer(
                    layer,
                    format!("bad whiteout {}", rel.display()),
                ));
            }
            let target = parent.join(victim);
            if !created.contains(&target) {
                remove_any(&target)?;
            }
            return Ok(());
        }

        let dest = parent.join(&name);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);

        use tar::EntryType as T;
        match kind {
            T::Directory => {
                match fs::symlink_metadata(&dest) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&dest)?;
                        mkdir(&dest)?;
                    }
                    Err(_) => mkdir(&dest)?,
                }
                self.finish(&dest, mode, uid, gid, None)?;
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                let size = entry.size();
                self.stats.bytes += size;
                if self.stats.bytes > self.limits.max_bytes {
                    return Err(OciError::TooLarge {
                        what: "unpacked bytes",
                        limit: self.limits.max_bytes,
                    });
                }
                remove_any(&dest)?;
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&dest)
                    .map_err(io_err("create", &dest))?;
                io::copy(entry, &mut out).map_err(|e| {
                    OciError::layer(layer, format!("reading {}: {e}", rel.display()))
                })?;
                self.finish(&dest, mode, uid, gid, Some(mtime))?;
            }
            T::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| OciError::layer(layer, format!("bad symlink target: {e}")))?
                    .ok_or_else(|| {
                        OciError::layer(layer, format!("symlink {} has no target", rel.display()))
                    })?
                    .into_owned();
                remove_any(&dest)?;
                // The target is only data: it is resolved later by the kernel inside the
                // sandbox's own root, or by `resolve_dir` here, both confined to the tree.
                symlink(&target, &dest).map_err(io_err("create the symlink", &dest))?;
                self.own(&dest, uid, gid)?;
                set_mtime(&dest, mtime);
            }
            T::Link => {
                let raw = entry
                    .link_name()
                    .map_err(|e| OciError::layer(layer, format!("bad hard link target: {e}")))?
                    .ok_or_else(|| {
                        OciError::layer(layer, format!("hard link {} has no target", rel.display()))
                    })?
                    .into_owned();
                let escape = |why: &'static str| OciError::Escape {
                    layer: layer.to_owned(),
                    path: raw.display().to_string(),
                    why,
                };
                let target_rel = clean_relative(&raw)
                    .map_err(escape)?
                    .ok_or_else(|| escape("a hard link to the root directory"))?;
                let target_dir = resolve_dir(
                    self.root,
                    target_rel.parent().unwrap_or(Path::new("")),
                    layer,
                    false,
                )?;
                let target = target_dir.join(target_rel.file_name().unwrap_or_default());
                match fs::symlink_metadata(&target) {
                    Ok(m) if m.is_file() || m.file_type().is_symlink() => {}
                    _ => {
                        return Err(OciError::layer(
                            layer,
                            format!(
                                "hard link {} points at {}, which is not a file in the image",
                                rel.display(),
                                raw.display()
                            ),
                        ));
                    }
                }
                if target == dest {
                    return Ok(());
                }
                remove_any(&dest)?;
                // linkat(2) without AT_SYMLINK_FOLLOW: a symlink target is linked itself.
                fs::hard_link(&target, &dest).map_err(io_err("hard-link", &dest))?;
            }
            T::Fifo => {
                remove_any(&dest)?;
                mkfifo(&dest, Mode::from_bits_truncate(0o600))
                    .map_err(|e| io_err("create the FIFO", &dest)(e.into()))?;
                self.finish(&dest, mode, uid, gid, Some(mtime))?;
            }
            // Device nodes would be usable only through the sandbox's own /dev; never created.
            _ => {
                self.stats.skipped += 1;
                return Ok(());
            }
        }
        created.insert(dest);
        Ok(())
    }

    /// Owner, then mode (chown clears set-id bits), then mtime. Set-uid/set-gid bits are kept:
    /// an image's own `sudo`/`passwd` need them inside the sandbox. They are never effective
    /// for the host: the tree is unpacked into an owner-only cache entry (`entry::PRIVATE_MODE`),
    /// and sandboxes reach it only through `nosuid` idmapped views.
    fn finish(
        &self,
        p: &Path,
        mode: u32,
        uid: u64,
        gid: u64,
        mtime: Option<u64>,
    ) -> Result<(), OciError> {
        self.own(p, uid, gid)?;
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
            .map_err(io_err("set permissions on", p))?;
        if let Some(t) = mtime {
            set_mtime(p, t);
        }
        Ok(())
    }

    fn own(&self, p: &Path, uid: u64, gid: u64) -> Result<(), OciError> {
        if !self.preserve_owners {
            return Ok(());
        }
        let id = |v: u64| if v < ID_RANGE { v as u32 } else { NOBODY };
        std::os::unix::fs::lchown(p, Some(id(uid)), Some(id(gid))).map_err(io_err("chown", p))
    }
}

/// Empties `dir` of everything this layer did not create (an opaque whiteout), keeping
/// this layer's own entries, including inside subdirectories it re-created.
fn remove_lower(dir: &Path, rel: &Path, own: &HashSet<PathBuf>) -> Result<(), OciError> {
    let here = dir.join(rel);
    let Ok(entries) = fs::read_dir(&here) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let child_rel = rel.join(e.file_name());
        // Kept if this layer made it or anything below it (a file it wrote into a lower
        // directory keeps that directory, minus the lower entries).
        if own.iter().any(|p| p.starts_with(&child_rel)) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_lower(dir, &child_rel, own)?;
            }
            continue;
        }
        remove_any(&e.path())?;
    }
    Ok(())
}

/// Removes a file, symlink or whole directory (never following a symlink); missing is fine.
fn remove_any(p: &Path) -> Result<(), OciError> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p).map_err(io_err("delete", p)),
        Ok(_) => fs::remove_file(p).map_err(io_err("delete", p)),
        Err(_) => Ok(()),
    }
}

/// Best effort: a wrong mtime changes nothing a sandbox relies on.
fn set_mtime(p: &Path, secs: u64) {
    let t = TimeSpec::new(secs as i64, 0);
    let _ = utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Entries of a test layer.
    enum E<'a> {
        Dir(&'a str, u32),
        File(&'a str, &'a str, u32),
        Sym(&'a str, &'a str),
        Hard(&'a str, &'a str),
        Dev(&'a str),
    }

    /// A tar built with raw headers (`set_path` would refuse `..`, which a hostile image has).
    fn tar(entries: &[E]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            let (path, data): (&str, &[u8]) = match e {
                E::Dir(p, mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    (p, b"")
                }
                E::File(p, body, mode) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    (p, body.as_bytes())
                }
                E::Sym(p, target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_link_name_literal(target).unwrap();
                    (p, b"")
                }
                E::Hard(p, target) => {
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_link_name_literal(target).unwrap();
                    (p, b"")
                }
                E::Dev(p) => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_device_major(1).unwrap();
                    h.set_device_minor(3).unwrap();
                    (p, b"")
                }
            };
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    const LIMITS: UnpackLimits = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 1000,
    };

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        (t, root, outside)
    }

    #[test]
    fn whiteouts_and_opaque_dirs_remove_lower_entries_only() {
        let (_t, root, _) = setup();
        let mut u = Unpacker::new(&root, LIMITS, false);
        u.apply(
            &tar(&[
                E::Dir("a/", 0o755),
                E::File("a/keep", "k", 0o640),
                E::File("a/gone", "g", 0o644),
                E::Dir("o/sub/", 0o755),
                E::File("o/old", "o", 0o644),
                E::File("o/sub/old", "o", 0o644),
                E::Dev("dev/null"),
            ])[..],
            "1",
        )
        .unwrap();
        // This layer's own entries come before and after the opaque marker: both stay.
        u.apply(
            &tar(&[
                E::File("o/new1", "n", 0o600),
                E::File("o/sub/new2", "n", 0o600),
                E::File("o/.wh..wh..opq", "", 0o644),
                E::File("o/new3", "n", 0o600),
                E::File("a/.wh.gone", "", 0o644),
                E::File("a/.wh.never-existed", "", 0o644),
            ])[..],
            "2",
        )
        .unwrap();
        assert_eq!(fs::read_to_string(root.join("a/keep")).unwrap(), "k");
        assert_eq!(
            fs::metadata(root.join("a/keep")).unwrap().mode() & 0o7777,
            0o640
        );
        assert!(!root.join("a/gone").exists());
        assert!(!root.join("a/.wh.gone").exists());
        assert!(!root.join("o/old").exists());
        assert!(!root.join("o/sub/old").exists());
        for kept in ["o/new1", "o/sub/new2", "o/new3"] {
            assert!(root.join(kept).is_file(), "{kept}");
        }
        assert!(!root.join("o/.wh..wh..opq").exists());
        assert!(!root.join("dev/null").exists(), "device nodes are skipped");
        assert_eq!(u.stats.skipped, 1);
    }

    #[test]
    fn links_resolve_inside_the_tree() {
        let (_t, root, _) = setup();
        let mut u = Unpacker::new(&root, LIMITS, false);
        u.apply(
            &tar(&[
                E::Dir("usr/lib/", 0o755),
                E::Sym("lib", "usr/lib"),
                E::Sym("abs", "/usr/lib"),
                E::File("usr/lib/a.so", "so", 0o644),
                E::Hard("usr/lib/b.so", "usr/lib/a.so"),
                E::File("lib/via-rel", "r", 0o644),
                E::File("abs/via-abs", "a", 0o644),
            ])[..],
            "1",
        )
        .unwrap();
        assert_eq!(
            fs::read_link(root.join("lib")).unwrap(),
            Path::new("usr/lib")
        );
        assert!(root.join("usr/lib/via-rel").is_file());
        assert!(root.join("usr/lib/via-abs").is_file());
        let (a, b) = (
            fs::metadata(root.join("usr/lib/a.so")).unwrap(),
            fs::metadata(root.join("usr/lib/b.so")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "hard link shares the inode");
    }

    #[test]
    fn hostile_layers_cannot_write_outside() {
        let (t, root, outside) = setup();
        fs::write(outside.join("victim"), "original").unwrap();
        let out = outside.display().to_string();
        let escape = |entries: &[E]| {
            let mut u = Unpacker::new(&root, LIMITS, false);
            u.apply(&tar(entries)[..], "evil")
        };
        // Plain traversal and absolute names are refused outright.
        for e in [
            escape(&[E::File("../outside/victim", "pwned", 0o644)]),
            escape(&[E::File("a/../../outside/victim", "pwned", 0o644)]),
            escape(&[E::File("/tmp/pwned", "pwned", 0o644)]),
            escape(&[E::Hard("h", "../outside/victim")]),
            escape(&[E::Hard("h2", "/etc/passwd")]),
        ] {
            assert!(matches!(e, Err(OciError::Escape { .. })), "{e:?}");
        }
        // Symlinks pointing out are followed as if the tree were `/`: writes stay inside.
        escape(&[
            E::Sym("up", "../../.."),
            E::File("up/outside/victim", "contained", 0o644),
            E::Sym("hostabs", out.as_str()),
            E::File("hostabs/victim", "contained", 0o644),
        ])
        .unwrap();
        assert_eq!(
            fs::read_to_string(outside.join("victim")).unwrap(),
            "original"
        );
        assert!(root.join("outside/victim").is_file());
        assert!(
            root.join(out.trim_start_matches('/'))
                .join("victim")
                .is_file()
        );
        // A symlink at the final name is replaced, never written through.
        escape(&[
            E::Sym("link", &format!("{out}/victim")),
            E::File("link", "replaced", 0o644),
        ])
        .unwrap();
        assert_eq!(
            fs::read_to_string(outside.join("victim")).unwrap(),
            "original"
        );
        assert!(fs::symlink_metadata(root.join("link")).unwrap().is_file());
        // A hard link through a symlinked dir can only reach files inside the tree.
        let e = escape(&[E::Sym("h", out.as_str()), E::Hard("x", "h/victim")]);
        assert!(e.is_ok(), "{e:?}"); // h/victim resolves to <root>/<outside>/victim, inside
        assert_ne!(
            fs::metadata(root.join("x")).unwrap().ino(),
            fs::metadata(outside.join("victim")).unwrap().ino()
        );
        // Whiteouts cannot delete outside either.
        escape(&[E::File("up/outside/.wh.victim", "", 0o644)]).unwrap();
        assert!(outside.join("victim").exists());
        let e = escape(&[E::File("../outside/.wh.victim", "", 0o644)]);
        assert!(matches!(e, Err(OciError::Escape { .. })), "{e:?}");
        assert!(outside.join("victim").exists());
        drop(t);
    }

    #[test]
    fn limits_stop_the_unpack() {
        let (_t, root, _) = setup();
        let small = UnpackLimits {
            max_bytes: 4,
            max_entries: 1000,
        };
        let e = Unpacker::new(&root, small, false)
            .apply(&tar(&[E::File("big", "12345", 0o644)])[..], "1");
        assert!(matches!(e, Err(OciError::TooLarge { .. })), "{e:?}");
        let few = UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 2,
        };
        let e = Unpacker::new(&root, few, false).apply(
            &tar(&[
                E::Dir("a/", 0o755),
                E::Dir("b/", 0o755),
                E::Dir("c/", 0o755),
            ])[..],
            "1",
        );
        assert!(matches!(e, Err(OciError::TooLarge { .. })), "{e:?}");
    }
}
