//! The content-addressed cache of built trees, and the build itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bootstrap::{BootstrapTool, DebianBootstrap};
use crate::entry::{Entry, make_private};
use crate::error::{ImageError, Result};
use crate::exec::blocking;
use crate::layer::{HOST_CA_BUNDLE, LayerBuild, host_ca_bundle};
use crate::mirror::{self, DEFAULT_MIRROR};
use crate::progress::Progress;
use crate::recipe::TemplateRecipe;
use crate::source::ImageSource;

/// Default cache root for template root filesystems.
pub const DEFAULT_CACHE_ROOT: &str = "/var/cache/bulkhead/images";

/// What `READY` records about a finished build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub hash: String,
    pub recipe: TemplateRecipe,
    /// `mmdebstrap` or `debootstrap`, or `layer` for a template built on its parent's tree.
    pub tool: String,
    pub mirror: String,
    /// Unix milliseconds.
    pub built_at_ms: u64,
    pub build_seconds: f64,
    /// Allocated bytes of the tree (hard links once).
    pub size_bytes: u64,
    pub files: u64,
}

/// One entry of [`ImageCache::list`].
#[derive(Debug, Clone, PartialEq)]
pub struct CachedImage {
    pub hash: String,
    pub rootfs: PathBuf,
    /// False for a build in progress or one that died half-way.
    pub ready: bool,
    /// From `READY` when ready, otherwise measured now (the partial tree).
    pub size_bytes: u64,
    pub info: Option<ImageInfo>,
}

#[derive(Debug, Clone)]
pub struct ImageCache {
    root: PathBuf,
    install_missing_tools: bool,
    mirror: Option<String>,
    tool: Option<BootstrapTool>,
    build_ca_bundle: Option<PathBuf>,
}

impl Default for ImageCache {
    fn default() -> Self {
        ImageCache::new(DEFAULT_CACHE_ROOT)
    }
}

impl ImageCache {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ImageCache {
            root: root.into(),
            install_missing_tools: false,
            mirror: None,
            tool: None,
            build_ca_bundle: Some(PathBuf::from(HOST_CA_BUNDLE)),
        }
    }

    /// The CA bundle that pip/npm trust while building layered templates (default: the host's
    /// [`HOST_CA_BUNDLE`], so downloads work behind a TLS-inspecting proxy whose CA the host
    /// trusts). Only used during the build; the template's trust store is unchanged. `None`
    /// uses the template's own CAs.
    pub fn with_build_ca_bundle(mut self, bundle: Option<PathBuf>) -> Self {
        self.build_ca_bundle = bundle;
        self
    }

    /// Lets [`build`](Self::build) run `apt-get install -y mmdebstrap` (or the tool chosen with
    /// [`with_tool`](Self::with_tool)) when it is missing. Off by default: installing host
    /// packages is the operator's call.
    pub fn install_missing_tools(mut self, allow: bool) -> Self {
        self.install_missing_tools = allow;
        self
    }

    /// Uses this tool only, instead of mmdebstrap-if-installed-else-debootstrap. The tool is not
    /// part of the content hash (both produce an equivalent tree).
    pub fn with_tool(mut self, tool: BootstrapTool) -> Self {
        self.tool = Some(tool);
        self
    }

    /// Overrides the mirror found in the host's APT sources.
    pub fn with_mirror(mut self, url: impl Into<String>) -> Self {
        self.mirror = Some(url.into());
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The mirror a build would use for `suite`: the override, else the host's, else
    /// [`DEFAULT_MIRROR`].
    pub fn mirror_for(&self, suite: &str) -> String {
        self.mirror
            .clone()
            .or_else(|| mirror::host_mirror(suite))
            .unwrap_or_else(|| DEFAULT_MIRROR.to_owned())
    }

    /// `<root>/<hash>/rootfs`, whether or not it is built yet.
    pub fn rootfs_path(&self, recipe: &TemplateRecipe) -> PathBuf {
        self.entry(&recipe.content_hash()).rootfs()
    }

    /// True once a build of this recipe has completed (`READY` is written last).
    pub fn is_ready(&self, recipe: &TemplateRecipe) -> bool {
        self.entry(&recipe.content_hash()).is_ready()
    }

    /// The metadata of a finished build of this recipe.
    pub fn info(&self, recipe: &TemplateRecipe) -> Option<ImageInfo> {
        self.entry(&recipe.content_hash()).ready_info()
    }

    pub(crate) fn entry(&self, hash: &str) -> Entry {
        Entry::new(&self.root, hash)
    }

    /// Builds the recipe's tree unless it is cached, and returns its path.
    ///
    /// Concurrent calls for the same recipe (in this process or others) build once: the second
    /// waits on the entry's lock and then finds it ready. A build killed half-way leaves
    /// `rootfs.tmp`, which the next build removes (after detaching any mounts left in it).
    pub async fn build(&self, recipe: &TemplateRecipe, progress: &dyn Progress) -> Result<PathBuf> {
        let result = self.build_inner(recipe, progress).await;
        if let Err(e) = &result {
            progress.stage(&format!("failed: {e}"));
        }
        progress.done();
        result
    }

    async fn build_inner(
        &self,
        recipe: &TemplateRecipe,
        progress: &dyn Progress,
    ) -> Result<PathBuf> {
        recipe.validate()?;
        // Read the bundle once so the hash and the installed file come from the same bytes.
        let ca = match &recipe.extra_ca_bundle {
            Some(p) => Some(fs::read(p).map_err(|source| ImageError::CaBundle {
                path: p.clone(),
                source,
            })?),
            None => None,
        };
        let hash = recipe.hash_with_ca(ca.as_deref());
        if nix::unistd::geteuid().is_root() {
            let cache = self.clone();
            blocking(move || cache.make_private()).await?;
        }
        let entry = Entry::new(&self.root, &hash);
        if entry.is_ready() {
            progress.stage(&format!(
                "template {} is cached ({})",
                recipe.id,
                short(&hash)
            ));
            return Ok(entry.rootfs());
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(ImageError::NotRoot {
                cache: self.root.clone(),
            });
        }
        // A layered template needs its parent's tree first (its own entry, lock and READY).
        let parent_rootfs = match recipe.effective_parent() {
            Some(parent) => Some(Box::pin(self.build_inner(&parent, progress)).await?),
            None => None,
        };
        let building = entry.lock(progress).await?;
        if entry.is_ready() {
            progress.stage(&format!(
                "template {} was built by another process ({})",
                recipe.id,
                short(&hash)
            ));
            return Ok(entry.rootfs());
        }

        let started = Instant::now();
        let building = blocking(move || building.clear_leftovers(&[]).map(|()| building)).await?;
        let tmp = building.tmp();

        let mirror = self.mirror_for(&recipe.suite);
        let host_ca = host_ca_bundle(self.build_ca_bundle.as_deref());
        let source = match &parent_rootfs {
            Some(parent) => ImageSource::Layer(LayerBuild {
                recipe,
                parent_rootfs: parent,
                mirror: &mirror,
                host_ca: host_ca.as_deref(),
            }),
            None => ImageSource::Debian(DebianBootstrap {
                recipe,
                mirror: &mirror,
                tool: self.tool,
                install_missing_tools: self.install_missing_tools,
                extra_ca: ca.as_deref(),
            }),
        };
        let tool_name = source.produce(&tmp, progress).await?;

        progress.stage("measuring and syncing to disk");
        let mut info = ImageInfo {
            hash: hash.clone(),
            recipe: recipe.clone(),
            tool: tool_name,
            mirror,
            built_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            build_seconds: 0.0,
            size_bytes: 0,
            files: 0,
        };
        let (rootfs, info) = blocking(move || {
            let rootfs = building.publish(|size_bytes, files| {
                info.size_bytes = size_bytes;
                info.files = files;
                info.build_seconds = started.elapsed().as_secs_f64();
                Ok(serde_json::to_vec_pretty(&info).unwrap_or_default())
            })?;
            Ok((rootfs, info))
        })
        .await?;
        progress.stage(&format!(
            "template {} ready: {} MB, {} files, {:.0} s ({})",
            recipe.id,
            info.size_bytes / 1_000_000,
            info.files,
            info.build_seconds,
            short(&hash)
        ));
        Ok(rootfs)
    }

    /// Makes the cache root and every directory in it owner-only ([`PRIVATE_MODE`]): caches
    /// made by older versions had world-traversable (0755) entries, through which any host
    /// user could run a tenant's set-uid root file. Called before every build (so at each
    /// server start); new entries are created private.
    ///
    /// [`PRIVATE_MODE`]: crate::entry::PRIVATE_MODE
    pub fn make_private(&self) -> Result<()> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ImageError::io("list", &self.root)(e)),
        };
        make_private(&self.root)?;
        for e in entries {
            let e = e.map_err(ImageError::io("list", &self.root))?;
            // `file_type` does not follow a symlink; only root writes the cache root.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_private(&e.path())?;
            }
        }
        Ok(())
    }

    /// Every entry in the cache, ready or not, sorted by hash.
    pub fn list(&self) -> Result<Vec<CachedImage>> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io("list", &self.root)(e)),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let hash = e.file_name().to_string_lossy().into_owned();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let entry = self.entry(&hash);
            let ready = entry.is_ready();
            let info: Option<ImageInfo> = if ready { entry.ready_info() } else { None };
            // Build layers and pulled images record their size too (not as an ImageInfo).
            let size_bytes = match &info {
                Some(i) => i.size_bytes,
                None => entry.size_bytes(),
            };
            out.push(CachedImage {
                rootfs: entry.rootfs(),
                hash,
                ready,
                size_bytes,
                info,
            });
        }
        out.sort_by(|a, b| a.hash.cmp(&b.hash));
        Ok(out)
    }
}

pub(crate) fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::progress::Quiet;

    #[tokio::test]
    async fn ready_entries_are_returned_without_building() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(dir.path());
        let recipe = TemplateRecipe::debian();
        assert!(!cache.is_ready(&recipe));
        assert!(cache.list().unwrap().is_empty());

        // Simulate a finished build: the tree plus READY.
        let rootfs = cache.rootfs_path(&recipe);
        fs::create_dir_all(rootfs.join("etc")).unwrap();
        let entry = rootfs.parent().unwrap();
        let info = ImageInfo {
            hash: recipe.content_hash(),
            recipe: recipe.clone(),
            tool: "mmdebstrap".into(),
            mirror: DEFAULT_MIRROR.into(),
            built_at_ms: 1,
            build_seconds: 2.0,
            size_bytes: 1234,
            files: 3,
        };
        fs::write(entry.join("READY"), serde_json::to_vec(&info).unwrap()).unwrap();
        assert!(cache.is_ready(&recipe));
        assert_eq!(cache.info(&recipe), Some(info.clone()));
        // Works without root and without any tool: nothing is built.
        assert_eq!(cache.build(&recipe, &Quiet).await.unwrap(), rootfs);

        // A half-built sibling shows up as not ready; junk names are ignored.
        fs::create_dir_all(dir.path().join("a".repeat(64)).join("rootfs.tmp")).unwrap();
        fs::create_dir_all(dir.path().join("not-a-hash")).unwrap();
        let listed = cache.list().unwrap();
        assert_eq!(listed.len(), 2);
        let ready: Vec<_> = listed.iter().filter(|c| c.ready).collect();
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].size_bytes, 1234);
        assert_eq!(ready[0].info.as_ref(), Some(&info));
    }

    #[tokio::test]
    async fn unreadable_ca_bundle_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(dir.path());
        let recipe = TemplateRecipe::base().with_extra_ca_bundle(dir.path().join("missing.crt"));
        let err = cache.build(&recipe, &Quiet).await.unwrap_err();
        assert!(matches!(err, ImageError::CaBundle { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn invalid_recipe_is_rejected_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(dir.path());
        let mut recipe = TemplateRecipe::base();
        recipe.packages.push("bad,name".into());
        let err = cache.build(&recipe, &Quiet).await.unwrap_err();
        assert!(matches!(err, ImageError::InvalidRecipe(_)), "{err:?}");
        assert!(cache.list().unwrap().is_empty());
    }
}
