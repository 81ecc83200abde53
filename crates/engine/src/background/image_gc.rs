//! Garbage collection of the image cache (`bulkhead_images::ImageCache::collect_garbage`):
//! pulled images, build layers and built trees that no template, sandbox or checkpoint uses
//! any more are removed, at startup and then periodically, so deleted templates and failed
//! builds do not keep their trees forever.
//!
//! What the engine counts as a reference, all teams together:
//! - the rootfs of every registered template (built-in and custom) and of every build of a
//!   custom template (a tag may point at an older build), in memory and in the store;
//! - every tree a sandbox's driver handle names (running, paused, pool members: a sandbox
//!   keeps the tree it started on even after its template is rebuilt or deleted);
//! - every tree named in the JSON files of the checkpoint directory (paused sandboxes,
//!   snapshots: a restore needs the tree its checkpoint was taken on) and of the custom
//!   templates' directory.
//!
//! The cache adds its own checks (an entry a mount comes from, one whose lock is held, one
//! written within the grace period is kept), and a collection stops while any template build
//! runs: a build may hold a cached tree that nothing references until it finishes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::sandbox::lifecycle::SandboxState;
use bulkhead_images::{GcReport, ImageCache, entries_named_in};
use bulkhead_store::SandboxFilter;

use crate::engine::Engine;
use crate::template::types::BuildStatus;

/// How long an unreferenced entry is kept after it was written: longer than any build takes
/// from pulling a tree to registering its template.
pub(crate) const GC_GRACE: Duration = Duration::from_secs(6 * 3600);
/// How often the cache is collected after the first pass at startup.
const GC_INTERVAL: Duration = Duration::from_secs(3600);
/// JSON files larger than this in the scanned directories are not manifests.
const MAX_SCANNED_FILE: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error("Cannot list what uses the image cache ({0}); nothing was removed")]
    References(String),
    #[error("Collecting the image cache {cache} failed: {source}")]
    Collect {
        cache: PathBuf,
        // Boxed: an image error is large, and this error travels through every `Result`.
        #[source]
        source: Box<bulkhead_images::ImageError>,
    },
    #[error("The image cache collection task failed: {0}")]
    Task(String),
}

impl Engine {
    /// Collects the cache now and then every [`GC_INTERVAL`] until shutdown.
    pub fn start_image_gc(self: &Arc<Self>) {
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                match engine.collect_image_garbage(GC_GRACE).await {
                    Ok(r) if !r.removed.is_empty() => tracing::info!(
                        removed = r.removed.len(),
                        freed_bytes = r.freed_bytes,
                        kept_referenced = r.referenced,
                        kept_recent = r.recent,
                        "image cache collected"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "image cache collection failed"
                    ),
                }
                tokio::select! {
                    _ = engine.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(GC_INTERVAL) => {}
                }
            }
        });
    }

    /// One collection: removes the cache entries nothing references and nobody wrote within
    /// `grace`. Also what a template delete should call (in the background).
    pub async fn collect_image_garbage(
        self: &Arc<Self>,
        grace: Duration,
    ) -> Result<GcReport, ImageGcError> {
        if self.builds_running() {
            return Ok(GcReport::default());
        }
        let referenced = self.image_references().await?;
        let cache = ImageCache::new(&self.cfg.image_cache);
        let engine = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            cache
                .collect_garbage(&referenced, grace, &|| !engine.builds_running())
                .map_err(|source| ImageGcError::Collect {
                    cache: cache.root().to_owned(),
                    source: Box::new(source),
                })
        })
        .await
        .map_err(|e| ImageGcError::Task(e.to_string()))?
    }

    fn builds_running(&self) -> bool {
        let builds = self.builds.builds.lock().unwrap_or_else(|p| p.into_inner());
        builds.values().any(|b| {
            let st = b.state.lock().unwrap_or_else(|p| p.into_inner());
            matches!(st.status, BuildStatus::Waiting | BuildStatus::Building)
        })
    }

    /// Every tree in use (see the module docs). Fails rather than return a partial list: a
    /// tree missing from it could be removed under a sandbox.
    pub(crate) async fn image_references(&self) -> Result<Vec<PathBuf>, ImageGcError> {
        let mut out: Vec<PathBuf> = Vec::new();
        out.extend(
            self.templates
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .map(|t| t.rootfs.clone()),
        );
        for t in self
            .builds
            .custom
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            out.extend(t.builds.values().map(|b| b.rootfs.clone()));
        }
        let rows = self
            .store
            .list_templates()
            .await
            .map_err(|e| ImageGcError::References(e.to_string()))?;
        out.extend(rows.into_iter().map(|r| PathBuf::from(r.rootfs_path)));

        let root = self.cfg.image_cache.clone();
        let mut texts: Vec<String> = Vec::new();
        for l in self.live.lock().values() {
            if let Some(h) = &l.handle {
                texts.push(serde_json::to_string(h).unwrap_or_default());
            }
        }
        let filter = SandboxFilter {
            states: SandboxState::ALL
                .into_iter()
                .filter(|s| *s != SandboxState::Dead)
                .map(Into::into)
                .collect(),
            ..Default::default()
        };
        let sandboxes = self
            .store
            .list_sandboxes(&filter, None, false, None)
            .await
            .map_err(|e| ImageGcError::References(e.to_string()))?;
        texts.extend(sandboxes.into_iter().filter_map(|s| s.driver_handle));
        for t in &texts {
            out.extend(entries_named_in(&root, t));
        }

        let dirs: Vec<PathBuf> = [
            Some(self.cfg.checkpoint_dir.clone()),
            self.cfg.template_dir.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let scanned = tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            for d in &dirs {
                scan_json(&root, d, 4, &mut found)?;
            }
            Ok::<_, std::io::Error>(found)
        })
        .await
        .map_err(|e| ImageGcError::Task(e.to_string()))?
        .map_err(|e| ImageGcError::References(e.to_string()))?;
        out.extend(scanned);
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// The cache entries named in `*.json` files under `dir` (up to `depth` levels; symlinks not
/// followed). A missing directory names nothing; an unreadable one is an error.
fn scan_json(root: &Path, dir: &Path, depth: u32, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in rd {
        let e = e?;
        let ft = e.file_type()?;
        let p = e.path();
        if ft.is_dir() && depth > 0 {
            scan_json(root, &p, depth - 1, out)?;
        } else if ft.is_file()
            && p.extension().is_some_and(|x| x == "json")
            && e.metadata()?.len() <= MAX_SCANNED_FILE
        {
            // A file removed meanwhile (a checkpoint deleted) names nothing.
            if let Ok(text) = std::fs::read_to_string(&p) {
                out.extend(entries_named_in(root, &text));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_under_the_scanned_directories_are_references() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("images");
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let ck = t.path().join("checkpoints");
        std::fs::create_dir_all(ck.join("snap-1/img")).unwrap();
        std::fs::write(
            ck.join("snap-1/manifest.json"),
            format!(r#"{{"rootfs": "{}/{a}/rootfs"}}"#, root.display()),
        )
        .unwrap();
        // Not JSON: not a manifest.
        std::fs::write(
            ck.join("snap-1/img/pages-1.img"),
            format!("{}/{b}/rootfs", root.display()),
        )
        .unwrap();
        let mut found = Vec::new();
        scan_json(&root, &ck, 4, &mut found).unwrap();
        assert_eq!(found, vec![root.join(&a)]);
        scan_json(&root, &t.path().join("missing"), 4, &mut found).unwrap();
        assert_eq!(found.len(), 1);
    }
}
