//! Template build layers: a sandbox's exported changes (an overlay upper dir, owners as inside
//! the sandbox) stacked on its parent's tree, kept content-addressed in the image cache next to
//! the built-in templates (`<root>/<key>/rootfs`, `READY` written last, `lock` while building).
//!
//! The new tree is a hard-link copy of the parent (`cp -al`: only directories are new) with
//! the changes applied by replacing entries, never by writing into a linked file, so parent and
//! child share every unchanged file and neither can alter the other. Trees in the cache are
//! read-only from then on (sandboxes see them through an idmapped overlay lower).

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, lchown};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::entry::Entry;
use crate::error::{ImageError, Result};
use crate::exec::TOOL_PATH;
use crate::fsutil::remove_tree;

/// What `READY` records about a build layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// The layer's key (its directory name).
    pub key: String,
    /// The tree it was stacked on.
    pub parent: PathBuf,
    /// What made it (the build step, for people reading the cache).
    pub step: String,
    /// Unix milliseconds.
    pub built_at_ms: u64,
    pub size_bytes: u64,
}

/// Build layers in an image cache root.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

impl LayerStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LayerStore { root: root.into() }
    }

    /// The finished tree of layer `key`, if it is in the cache.
    pub fn get(&self, key: &str) -> Option<PathBuf> {
        let entry = Entry::new(&self.root, key);
        (valid_key(key) && entry.is_ready()).then(|| entry.rootfs())
    }

    /// Stacks `changes` (an exported upper dir, consumed: its files are linked into the new
    /// tree) on `parent` as layer `key`, and returns the new tree. A layer already built (by a
    /// concurrent build of the same step) is returned as it is. Needs root (owners are set).
    pub async fn commit(
        &self,
        key: &str,
        parent: &Path,
        changes: &Path,
        step: &str,
    ) -> Result<PathBuf> {
        if !valid_key(key) {
            return Err(ImageError::InvalidRecipe(format!(
                "layer key {key:?} is not a sha256 hex digest"
            )));
        }
        let (root, key, parent, changes, step) = (
            self.root.clone(),
            key.to_owned(),
            parent.to_owned(),
            changes.to_owned(),
            step.to_owned(),
        );
        tokio::task::spawn_blocking(move || commit_blocking(&root, &key, &parent, &changes, &step))
            .await
            .map_err(|e| ImageError::io("run", "the layer task")(std::io::Error::other(e)))?
    }
}

fn valid_key(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())
}

fn commit_blocking(
    root: &Path,
    key: &str,
    parent: &Path,
    changes: &Path,
    step: &str,
) -> Result<PathBuf> {
    let entry = Entry::new(root, key);
    let building = entry.lock_blocking()?;
    if entry.is_ready() {
        return Ok(entry.rootfs());
    }
    building.clear_leftovers(&[])?;
    let tmp = building.tmp();
    if let Err(e) = stack(parent, changes, &tmp) {
        // Still holding the lock; a failed publish is cleared by the next producer instead.
        let _ = remove_tree(&tmp);
        return Err(e);
    }
    building.publish(|size_bytes, _files| {
        let info = LayerInfo {
            key: key.to_owned(),
            parent: parent.to_owned(),
            step: step.to_owned(),
            built_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            size_bytes,
        };
        Ok(serde_json::to_vec_pretty(&info).expect("layer info serialises"))
    })
}

/// `target` (absent) = a hard-link copy of `parent` with the upper dir `changes` applied.
pub fn stack(parent: &Path, changes: &Path, target: &Path) -> Result<()> {
    let out = std::process::Command::new("cp")
        .env("PATH", TOOL_PATH)
        .args(["-al", "--no-target-directory", "--"])
        .arg(parent)
        .arg(target)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(ImageError::io("run cp -al for", target))?;
    if !out.status.success() {
        return Err(ImageError::Copy {
            from: parent.to_owned(),
            to: target.to_owned(),
            status: out.status.to_string(),
            tail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    apply_dir(changes, target)
}

/// Applies the entries of the upper directory `upper` to the directory `dest` (a real
/// directory of the new tree, never a symlink: every directory on the way was made by us).
fn apply_dir(upper: &Path, dest: &Path) -> Result<()> {
    let rd = fs::read_dir(upper).map_err(ImageError::io("read", upper))?;
    for e in rd {
        let e = e.map_err(ImageError::io("read", upper))?;
        let from = e.path();
        let to = dest.join(e.file_name());
        let md = fs::symlink_metadata(&from).map_err(ImageError::io("stat", &from))?;
        let ft = md.file_type();
        if ft.is_char_device() && md.rdev() == 0 {
            // A whiteout: the entry was deleted.
            remove_if_present(&to)?;
        } else if ft.is_dir() {
            let existing = fs::symlink_metadata(&to).ok();
            let keep = existing.as_ref().is_some_and(|m| m.is_dir()) && !is_opaque(&from);
            if !keep {
                remove_if_present(&to)?;
                fs::create_dir(&to).map_err(ImageError::io("create", &to))?;
            }
            apply_dir(&from, &to)?;
            lchown(&to, Some(md.uid()), Some(md.gid())).map_err(ImageError::io("chown", &to))?;
            fs::set_permissions(&to, fs::Permissions::from_mode(md.mode() & 0o7777))
                .map_err(ImageError::io("set permissions on", &to))?;
        } else {
            remove_if_present(&to)?;
            strip_overlay_xattrs(&from);
            if fs::hard_link(&from, &to).is_err() {
                copy_one(&from, &to)?;
            }
        }
    }
    Ok(())
}

fn remove_if_present(p: &Path) -> Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => remove_tree(p),
        Ok(_) => fs::remove_file(p).map_err(ImageError::io("remove", p)),
        Err(_) => Ok(()),
    }
}

fn copy_one(from: &Path, to: &Path) -> Result<()> {
    let out = std::process::Command::new("cp")
        .env("PATH", TOOL_PATH)
        .args(["-a", "--no-target-directory", "--"])
        .arg(from)
        .arg(to)
        .output()
        .map_err(ImageError::io("copy", from))?;
    if out.status.success() {
        return Ok(());
    }
    Err(ImageError::Copy {
        from: from.to_owned(),
        to: to.to_owned(),
        status: out.status.to_string(),
        tail: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

fn is_opaque(dir: &Path) -> bool {
    xattr_names(dir)
        .iter()
        .any(|n| n == "user.overlay.opaque" || n == "trusted.overlay.opaque")
}

/// Overlay bookkeeping on a copied-up file (`user.overlay.*`, `trusted.overlay.*`) would be
/// read again when the file becomes part of a lower layer: drop it.
fn strip_overlay_xattrs(p: &Path) {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return;
    };
    for name in xattr_names(p) {
        if name.starts_with("user.overlay.") || name.starts_with("trusted.overlay.") {
            let Ok(n) = CString::new(name) else { continue };
            // SAFETY: both are valid NUL-terminated strings.
            unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) };
        }
    }
}

fn xattr_names(p: &Path) -> Vec<String> {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return Vec::new();
    };
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    buf.truncate(n as usize);
    buf.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[bulkhead_testkit::requires(Root)]
    #[test]
    fn stacking_applies_new_files_deletions_and_opaque_dirs_without_touching_the_parent() {
        let t = tempfile::tempdir().unwrap();
        let (parent, upper, target) = (t.path().join("p"), t.path().join("u"), t.path().join("t"));
        fs::create_dir_all(parent.join("etc")).unwrap();
        fs::create_dir_all(parent.join("old/sub")).unwrap();
        fs::write(parent.join("etc/keep"), "keep").unwrap();
        fs::write(parent.join("etc/gone"), "gone").unwrap();
        fs::write(parent.join("etc/changed"), "v1").unwrap();
        fs::write(parent.join("old/sub/x"), "x").unwrap();

        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::create_dir_all(upper.join("new")).unwrap();
        fs::write(upper.join("etc/changed"), "v2").unwrap();
        fs::write(upper.join("new/file"), "n").unwrap();
        std::os::unix::fs::symlink("/etc/keep", upper.join("new/link")).unwrap();
        // A whiteout is a 0/0 character device (mknod: root).
        nix::sys::stat::mknod(
            &upper.join("etc/gone"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            0,
        )
        .expect("mknod a whiteout");
        fs::create_dir_all(upper.join("old")).unwrap();
        let opaque = CString::new(upper.join("old").as_os_str().as_bytes()).unwrap();
        // SAFETY: valid strings and buffer.
        let set = unsafe {
            libc::lsetxattr(
                opaque.as_ptr(),
                c"user.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        } == 0;

        stack(&parent, &upper, &target).unwrap();
        assert_eq!(fs::read_to_string(target.join("etc/keep")).unwrap(), "keep");
        assert_eq!(
            fs::read_to_string(target.join("etc/changed")).unwrap(),
            "v2"
        );
        assert_eq!(fs::read_to_string(target.join("new/file")).unwrap(), "n");
        assert_eq!(
            fs::read_link(target.join("new/link")).unwrap(),
            Path::new("/etc/keep")
        );
        assert!(
            set,
            "user.overlay.opaque needs user xattrs on the test's file system"
        );
        assert!(fs::symlink_metadata(target.join("etc/gone")).is_err());
        assert!(fs::symlink_metadata(target.join("old/sub")).is_err());
        // The parent is untouched, and unchanged files are shared, not copied.
        assert_eq!(
            fs::read_to_string(parent.join("etc/changed")).unwrap(),
            "v1"
        );
        assert_eq!(fs::read_to_string(parent.join("etc/gone")).unwrap(), "gone");
        assert_eq!(
            fs::metadata(parent.join("etc/keep")).unwrap().ino(),
            fs::metadata(target.join("etc/keep")).unwrap().ino()
        );
    }

    #[test]
    fn layer_keys_must_be_digests() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("cache");
        let store = LayerStore::new(&root);
        // Ready-looking entries: only the one named by a digest is served.
        for name in ["../evil", "short", &"a".repeat(64)] {
            fs::create_dir_all(root.join(name).join("rootfs")).unwrap();
            fs::write(root.join(name).join("READY"), "{}").unwrap();
        }
        assert!(store.get("../evil").is_none());
        assert!(store.get("short").is_none());
        assert!(store.get(&"a".repeat(64)).is_some());
        assert!(store.get(&"b".repeat(64)).is_none());
    }
}
