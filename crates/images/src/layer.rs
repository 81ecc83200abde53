//! The layered image source: a copy of the parent template's tree, with the recipe's extra
//! Debian packages and build steps run in a chroot of it (files are written from the host).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use tokio::process::Command;

use crate::error::{ImageError, Result};
use crate::exec::{TOOL_PATH, blocking, run_in_chroot, run_streaming};
use crate::finalize::slim_and_neutralise;
use crate::fsutil::remove_tree;
use crate::mirror;
use crate::progress::Progress;
use crate::recipe::{BuildStep, FileAsset, TemplateRecipe};

/// The host's CA bundle, used (never installed) for downloads during layer builds: on hosts
/// behind a TLS-inspecting proxy it is the only bundle that verifies PyPI and npm.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Builds `recipe` (which has a parent) at `target` from the parent's finished tree.
pub(crate) async fn build_layer(
    recipe: &TemplateRecipe,
    parent_rootfs: &Path,
    target: &Path,
    host_ca: Option<&Path>,
    progress: &dyn Progress,
) -> Result<()> {
    let parent_id = recipe.parent.as_deref().map_or("parent", |p| p.id.as_str());
    progress.stage(&format!("copying the {parent_id} template's tree"));
    // cp -a keeps owners, modes, hard links and xattrs; reflinks make it nearly free on
    // filesystems that support them.
    let mut cp = Command::new("cp");
    cp.env("PATH", TOOL_PATH)
        .args(["-a", "--reflink=auto", "--"])
        .arg(parent_rootfs)
        .arg(target);
    let (status, tail) = run_streaming(cp, "cp -a", progress).await?;
    if !status.success() {
        return Err(ImageError::Copy {
            from: parent_rootfs.to_owned(),
            to: target.to_owned(),
            status: status.to_string(),
            tail,
        });
    }

    match host_ca {
        Some(ca) => progress.stage(&format!(
            "downloads inside the build trust the host's CA bundle {} (not installed in the \
             template)",
            ca.display()
        )),
        None => progress.stage("no host CA bundle: downloads trust the template's own CAs"),
    }

    if !recipe.packages.is_empty() {
        let mut packages: Vec<&str> = recipe.packages.iter().map(String::as_str).collect();
        packages.sort_unstable();
        packages.dedup();
        progress.stage(&format!(
            "installing Debian packages: {}",
            packages.join(" ")
        ));
        let script = format!(
            "apt-get update -q\napt-get install -y -q --no-install-recommends {}\napt-get clean",
            packages.join(" ")
        );
        run_in_chroot(target, host_ca, &script, "apt-get install", progress).await?;
    }

    let total = recipe.steps.len();
    for (i, step) in recipe.steps.iter().enumerate() {
        let what = step.describe();
        progress.stage(&format!("step {}/{total}: {what}", i + 1));
        match step {
            BuildStep::File(asset) => {
                let (root, asset) = (target.to_owned(), asset.clone());
                blocking(move || write_asset(&root, &asset)).await?;
            }
            other => {
                let script = other.render().unwrap_or_default();
                run_in_chroot(target, host_ca, &script, &what, progress).await?;
            }
        }
    }

    progress.stage("removing caches, documentation and host files");
    let root = target.to_owned();
    blocking(move || {
        for dir in ["root/.cache", "root/.npm", "root/.config/pip"] {
            let p = root.join(dir);
            if fs::symlink_metadata(&p).is_ok() {
                remove_tree(&p)?;
            }
        }
        slim_and_neutralise(&root)
    })
    .await
}

/// Writes an asset under `root` without following symlinks out of the tree: every existing
/// parent must be a real directory; missing ones are created 0755.
pub(crate) fn write_asset(root: &Path, asset: &FileAsset) -> Result<()> {
    asset.validate()?;
    let rel = asset.path().trim_start_matches('/');
    let dest = root.join(rel);
    let mut dir = root.to_path_buf();
    let parents: Vec<Component> = Path::new(rel).components().collect();
    for c in &parents[..parents.len().saturating_sub(1)] {
        dir.push(c);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::InvalidRecipe(format!(
                    "cannot write {}: {} in the tree is not a directory (or is a symlink)",
                    asset.path(),
                    dir.display()
                )));
            }
            Err(_) => {
                fs::create_dir(&dir).map_err(ImageError::io("create", &dir))?;
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                    .map_err(ImageError::io("set permissions on", &dir))?;
            }
        }
    }
    if let Ok(m) = fs::symlink_metadata(&dest) {
        if m.is_dir() {
            return Err(ImageError::InvalidRecipe(format!(
                "cannot write {}: it is a directory in the tree",
                asset.path()
            )));
        }
        fs::remove_file(&dest).map_err(ImageError::io("replace", &dest))?;
    }
    fs::write(&dest, asset.contents()).map_err(ImageError::io("write", &dest))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(asset.mode()))
        .map_err(ImageError::io("set permissions on", &dest))
}

/// The host bundle to use for build-time downloads, if the host has one.
pub(crate) fn host_ca_bundle(configured: Option<&Path>) -> Option<PathBuf> {
    configured.filter(|p| p.is_file()).map(Path::to_path_buf)
}

/// The layered image source: the recipe's packages and steps on a copy of its parent's tree.
pub(crate) struct LayerBuild<'a> {
    pub recipe: &'a TemplateRecipe,
    /// The parent template's finished tree (built first, never modified).
    pub parent_rootfs: &'a Path,
    pub mirror: &'a str,
    /// The host's CA bundle for downloads during the build (see [`host_ca_bundle`]).
    pub host_ca: Option<&'a Path>,
}

impl LayerBuild<'_> {
    /// Builds the tree at `target` (which must not exist); returns `layer`.
    pub async fn produce(&self, target: &Path, progress: &dyn Progress) -> Result<String> {
        if !self.recipe.packages.is_empty() {
            mirror::check(self.mirror, &self.recipe.suite, progress).await?;
        }
        build_layer(
            self.recipe,
            self.parent_rootfs,
            target,
            self.host_ca,
            progress,
        )
        .await?;
        Ok("layer".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_assets_inside_the_tree_only() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("etc")).unwrap();
        let a = FileAsset::new("/opt/bulkhead/interpreter/kernels.json", "{}\n", 0o644);
        write_asset(&root, &a).unwrap();
        let p = root.join("opt/bulkhead/interpreter/kernels.json");
        assert_eq!(fs::read(&p).unwrap(), b"{}\n");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(
            fs::metadata(root.join("opt/bulkhead"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        // Rewriting replaces the file.
        write_asset(
            &root,
            &FileAsset::new("/opt/bulkhead/interpreter/kernels.json", "[]", 0o600),
        )
        .unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"[]");

        // A symlinked directory could point out of the tree: refused, nothing written outside.
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("srv")).unwrap();
        let err = write_asset(&root, &FileAsset::new("/srv/x", "x", 0o644)).unwrap_err();
        assert!(matches!(err, ImageError::InvalidRecipe(_)), "{err:?}");
        assert!(!outside.join("x").exists());
        // So is a symlink at the file itself: it is replaced, not written through.
        std::os::unix::fs::symlink(outside.join("target"), root.join("etc/link")).unwrap();
        write_asset(&root, &FileAsset::new("/etc/link", "y", 0o644)).unwrap();
        assert!(!outside.join("target").exists());
        assert!(
            fs::symlink_metadata(root.join("etc/link"))
                .unwrap()
                .is_file()
        );
    }
}
