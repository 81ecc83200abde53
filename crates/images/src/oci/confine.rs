//! Naming paths inside an image's tree: entry names checked to stay relative and below the
//! root, and directories resolved the way a process chrooted into the tree would see them
//! (symlinks followed, but `/` and `..` clamped to the tree's root), so a layer can never
//! direct a write, link or deletion at a host path.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use super::error::OciError;

/// Symlinks followed while resolving one path (Linux's own limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// The real directory that `rel` names inside the tree, following symlinks as if the tree
/// were `/`. Missing directories are created (0755) when `create` is set (tars need not
/// list parents first).
pub(super) fn resolve_dir(
    root: &Path,
    rel: &Path,
    layer: &str,
    create: bool,
) -> Result<PathBuf, OciError> {
    let mut pending: Vec<PathBuf> = rel.components().map(|c| c.as_os_str().into()).collect();
    pending.reverse();
    let mut stack: Vec<PathBuf> = Vec::new(); // components below the root, resolved
    let mut hops = 0;
    while let Some(c) = pending.pop() {
        if c.as_os_str() == ".." {
            stack.pop(); // clamped at the root, as `/..` is `/`
            continue;
        }
        if c.as_os_str() == "." || c.as_os_str().is_empty() {
            continue;
        }
        let here: PathBuf = root.join(stack.iter().collect::<PathBuf>()).join(&c);
        match fs::symlink_metadata(&here) {
            Ok(m) if m.is_dir() => stack.push(c),
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(OciError::layer(
                        layer,
                        format!("too many symlinks resolving {}", rel.display()),
                    ));
                }
                let target = fs::read_link(&here).map_err(io_err("read the symlink", &here))?;
                if target.is_absolute() {
                    stack.clear();
                }
                let mut parts: Vec<PathBuf> = target
                    .components()
                    .filter(|c| !matches!(c, Component::RootDir))
                    .map(|c| c.as_os_str().into())
                    .collect();
                parts.reverse();
                pending.extend(parts);
            }
            Ok(_) => {
                return Err(OciError::layer(
                    layer,
                    format!("{} is used as a directory but is not one", rel.display()),
                ));
            }
            Err(_) if create => {
                mkdir(&here)?;
                stack.push(c);
            }
            Err(_) => {
                return Err(OciError::layer(
                    layer,
                    format!("directory {} does not exist", rel.display()),
                ));
            }
        }
    }
    Ok(root.join(stack.iter().collect::<PathBuf>()))
}

/// `path` as a relative path of normal components, or `None` for the root. Absolute paths
/// and `..` are refused: an image has no business naming them.
pub(super) fn clean_relative(path: &Path) -> Result<Option<PathBuf>, &'static str> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path"),
            Component::ParentDir => return Err("a path that climbs out with `..`"),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

pub(super) fn mkdir(p: &Path) -> Result<(), OciError> {
    fs::create_dir(p).map_err(io_err("create", p))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(io_err("set permissions on", p))
}

pub(super) fn io_err(action: &'static str, p: &Path) -> impl FnOnce(io::Error) -> OciError {
    let path = p.to_owned();
    move |source| OciError::Io {
        action,
        path,
        source,
    }
}
