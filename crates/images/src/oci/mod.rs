//! Templates from OCI registries: [`ImageCache::pull_image`] fetches an image (through the
//! operator's [`RegistryConfig`]: allow list, mirrors, credentials, limits), unpacks its layers
//! in order into a content-addressed cache entry, prepares it for sandboxes, and returns the
//! tree with the image's [`ImageConfig`] (user, env, workdir, entrypoint/cmd) for the template
//! builder to apply.
//!
//! The entry's hash covers the platform manifest's digest and [`OCI_VERSION`] (the unpack and
//! preparation code), so one image pulled under two names or tags is stored once. Pulling
//! always asks the registry which manifest a tag names (tags move); a reference by digest
//! that is already cached is served without the network.
//!
//! Entry layout, as for the other trees (see the crate docs), plus `image.json`
//! ([`PulledImage`] without the path), written before `READY`.
//!
//! Submodules, from data to effects: `error`; `config` (operator settings, reference
//! resolution); `image_config`; `decode` (compression, diff-id hashing); `confine` (paths
//! inside a tree); `unpack` (one layer onto a tree); `prepare` (sandbox files); `fetch` (the registry client).

mod config;
mod confine;
mod decode;
mod error;
mod fetch;
mod guard;
mod image_config;
mod policy;
mod prepare;
mod unpack;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use config::{DOCKER_HUB, PullLimits, RegistryConfig, RegistryCredentials, ResolvedReference};
pub use error::OciError;
pub use image_config::ImageConfig;
pub use policy::{HostPattern, PUBLIC_REGISTRIES, is_public, normalize_host};
pub use prepare::sandbox_blockers;
pub use unpack::{UnpackLimits, UnpackStats, Unpacker};

use crate::cache::{ImageCache, ImageInfo, short};
use crate::error::ImageError;
use crate::exec::blocking;
use crate::fsutil::{remove_tree, write_atomic};
use crate::progress::Progress;
use crate::recipe::{TemplateRecipe, sha256_hex};

/// Version of the unpack and preparation code; part of every pulled entry's hash.
pub const OCI_VERSION: u32 = 1;

const IMAGE_JSON: &str = "image.json";
const BLOBS_TMP: &str = "blobs.tmp";

/// A pulled image, ready to be a template (or a template builder's starting tree).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PulledImage {
    /// The normalised reference pulled (`docker.io/library/python:3.12`).
    pub reference: String,
    /// Digest of the platform manifest (the image's identity).
    pub manifest_digest: String,
    /// The cache entry's hash (also the template's content hash).
    pub hash: String,
    /// The finished tree: read-only, owned by ids 0..65535 as the jail's idmapping expects.
    #[serde(skip)]
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// `user` when the tree has E2B's default user (created at pull time when the image has
    /// account files and uid 1000 is free); `None` otherwise (the builder decides).
    pub sandbox_user: Option<String>,
    /// Compressed bytes downloaded (0 when served from the cache).
    pub downloaded_bytes: u64,
    /// Device nodes and other entries not created.
    pub skipped_entries: u64,
    /// True when the tree was already in the cache.
    #[serde(skip)]
    pub cached: bool,
}

#[derive(Serialize)]
struct Canonical<'a> {
    format: &'static str,
    oci_version: u32,
    manifest_digest: &'a str,
}

/// The cache hash of an image with this manifest digest.
pub fn image_hash(manifest_digest: &str) -> String {
    let c = Canonical {
        format: "bulkhead-oci/1",
        oci_version: OCI_VERSION,
        manifest_digest,
    };
    sha256_hex(&serde_json::to_vec(&c).unwrap_or_default())
}

impl ImageCache {
    /// Pulls `reference` (e.g. `python:3.12`, `ghcr.io/org/app@sha256:…`) unless its tree is
    /// cached, and returns it. `credentials` (from a build request) override the configured
    /// ones for this pull. Needs root to unpack (owners, set-id bits); fails fast with
    /// [`OciError::Unreachable`] naming the flags to set when no registry answers.
    pub async fn pull_image(
        &self,
        reference: &str,
        registry: &RegistryConfig,
        credentials: Option<&RegistryCredentials>,
        progress: &dyn Progress,
    ) -> Result<PulledImage, OciError> {
        let result = self
            .pull_inner(reference, registry, credentials, progress)
            .await;
        if let Err(e) = &result {
            progress.stage(&format!("failed: {e}"));
        }
        progress.done();
        result
    }

    async fn pull_inner(
        &self,
        reference: &str,
        registry: &RegistryConfig,
        credentials: Option<&RegistryCredentials>,
        progress: &dyn Progress,
    ) -> Result<PulledImage, OciError> {
        let r = registry.resolve(reference, credentials)?;
        // A digest reference names one manifest for good: when it is cached, no network.
        if let Some(d) = r.fetch.digest()
            && let Some(hit) = self.cached_image(&image_hash(d), &r.canonical)
        {
            progress.stage(&format!(
                "image {} is cached ({})",
                r.canonical,
                short(&hit.hash)
            ));
            return Ok(hit);
        }
        progress.stage(&format!("resolving {} at {}", r.canonical, r.endpoint));
        let client = fetch::client(registry, &r).await?;
        let (manifest, digest, config_json) =
            fetch::manifest_and_config(&client, registry, &r).await?;
        let hash = image_hash(&digest);
        if let Some(hit) = self.cached_image(&hash, &r.canonical) {
            progress.stage(&format!(
                "image {} is cached ({})",
                r.canonical,
                short(&hash)
            ));
            return Ok(hit);
        }
        let config = ImageConfig::parse(&config_json, &r.canonical)?;
        let bad = |reason: String| OciError::BadImage {
            reference: r.canonical.clone(),
            reason,
        };
        if config.os != "linux" {
            return Err(bad(format!("it is a {} image, not a Linux one", config.os)));
        }
        if manifest.layers.len() > registry.limits.max_layers {
            return Err(OciError::TooLarge {
                what: "layers",
                limit: registry.limits.max_layers as u64,
            });
        }
        if config.diff_ids.len() != manifest.layers.len() {
            return Err(bad(format!(
                "its manifest has {} layers but its config lists {}",
                manifest.layers.len(),
                config.diff_ids.len()
            )));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(ImageError::NotRoot {
                cache: self.root().to_owned(),
            }
            .into());
        }

        let entry = self.entry(&hash);
        let building = entry.lock(progress).await?;
        if let Some(hit) = self.cached_image(&hash, &r.canonical) {
            return Ok(hit);
        }
        let started = Instant::now();
        let (tmp, blobs) = (building.tmp(), entry.dir().join(BLOBS_TMP));
        let building = {
            let blobs = blobs.clone();
            blocking(move || building.clear_leftovers(&[blobs]).map(|()| building)).await?
        };
        for d in [&tmp, &blobs] {
            fs::create_dir(d).map_err(ImageError::io("create", d))?;
        }
        fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(ImageError::io("set permissions on", &tmp))?;

        let result = async {
            let (downloaded, skipped) = self
                .unpack_layers(
                    &client, registry, &r, &manifest, &config, &tmp, &blobs, progress,
                )
                .await?;
            progress.stage("preparing the tree for sandboxes");
            let t = tmp.clone();
            let user = blocking(move || prepare::prepare(&t)).await?;
            Ok::<_, OciError>((downloaded, skipped, user))
        }
        .await;
        // A refused or failed image leaves neither blobs nor a partial tree behind.
        let failed = result.is_err();
        let _ = blocking({
            let (blobs, tmp) = (blobs.clone(), tmp.clone());
            move || {
                remove_tree(&blobs)?;
                if failed { remove_tree(&tmp) } else { Ok(()) }
            }
        })
        .await;
        let (downloaded, skipped, sandbox_user) = result?;

        progress.stage("measuring and syncing to disk");
        let mut pulled = PulledImage {
            reference: r.canonical.clone(),
            manifest_digest: digest.clone(),
            hash: hash.clone(),
            rootfs: entry.rootfs(),
            config,
            sandbox_user,
            downloaded_bytes: downloaded,
            skipped_entries: skipped,
            cached: false,
        };
        let mut info = ImageInfo {
            hash: hash.clone(),
            // `template ls` shows the recipe id: for a pulled image, the reference.
            recipe: TemplateRecipe {
                id: r.canonical.clone(),
                suite: "oci".into(),
                packages: Vec::new(),
                extra_ca_bundle: None,
                recipe_version: 0,
                parent: None,
                steps: Vec::new(),
            },
            tool: "oci".into(),
            mirror: r.endpoint.clone(),
            built_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            build_seconds: 0.0,
            size_bytes: 0,
            files: 0,
        };
        let dir = entry.dir().to_owned();
        (pulled, info) = blocking(move || {
            building.publish(|size_bytes, files| {
                write_atomic(
                    &dir.join(IMAGE_JSON),
                    &serde_json::to_vec_pretty(&pulled).unwrap_or_default(),
                )?;
                info.size_bytes = size_bytes;
                info.files = files;
                info.build_seconds = started.elapsed().as_secs_f64();
                Ok(serde_json::to_vec_pretty(&info).unwrap_or_default())
            })?;
            Ok((pulled, info))
        })
        .await?;
        progress.stage(&format!(
            "image {} ready: {} MB, {} files, {:.1} s ({})",
            r.canonical,
            info.size_bytes / 1_000_000,
            info.files,
            info.build_seconds,
            short(&hash)
        ));
        Ok(pulled)
    }

    /// Downloads and applies every layer in order; returns (bytes downloaded, entries skipped).
    #[allow(clippy::too_many_arguments)]
    async fn unpack_layers(
        &self,
        client: &fetch::RegistryClient,
        registry: &RegistryConfig,
        r: &ResolvedReference,
        manifest: &oci_client::manifest::OciImageManifest,
        config: &ImageConfig,
        tmp: &Path,
        blobs: &Path,
        progress: &dyn Progress,
    ) -> Result<(u64, u64), OciError> {
        let limits = UnpackLimits {
            max_bytes: registry.limits.max_unpacked_bytes,
            max_entries: registry.limits.max_entries,
        };
        let mut stats = UnpackStats::default();
        let mut downloaded = 0u64;
        let total = manifest.layers.len();
        for (i, layer) in manifest.layers.iter().enumerate() {
            let name = format!("{}/{total} ({})", i + 1, short_digest(&layer.digest));
            progress.stage(&format!(
                "downloading layer {name}, {:.1} MB",
                layer.size as f64 / 1e6
            ));
            let file = blobs.join(format!("layer-{i}"));
            let budget = registry
                .limits
                .max_download_bytes
                .saturating_sub(downloaded);
            downloaded += fetch::blob(client, registry, r, layer, &file, budget).await?;

            progress.stage(&format!("unpacking layer {name}"));
            let (root, media_type, expected) = (
                tmp.to_owned(),
                layer.media_type.clone(),
                config.diff_ids[i].clone(),
            );
            let carried = std::mem::take(&mut stats);
            stats = tokio::task::spawn_blocking(move || {
                let f = fs::File::open(&file).map_err(|source| OciError::Io {
                    action: "open",
                    path: file.clone(),
                    source,
                })?;
                // Tar headers and padding take at most ~1.5 KiB per entry beyond the files.
                let cap = limits
                    .max_bytes
                    .saturating_add(limits.max_entries.saturating_mul(1536))
                    .saturating_sub(carried.bytes);
                let too_large = OciError::TooLarge {
                    what: "unpacked bytes",
                    limit: limits.max_bytes,
                };
                let mut hashing =
                    decode::Hashing::new(decode::decoder(f, &media_type, &name)?, cap);
                let mut u = Unpacker::new(&root, limits, true);
                u.stats = carried;
                let applied = u.apply(&mut hashing, &name);
                if hashing.exceeded {
                    return Err(too_large);
                }
                applied?;
                let drained = hashing.finish();
                if hashing.exceeded {
                    return Err(too_large);
                }
                let actual = drained
                    .map_err(|e| OciError::layer(&name, format!("reading the layer: {e}")))?;
                if actual != expected {
                    return Err(OciError::DiffId {
                        layer: name,
                        expected,
                        actual,
                    });
                }
                let _ = fs::remove_file(&file);
                Ok(u.stats)
            })
            .await
            .map_err(|e| OciError::layer("?", format!("unpack task failed: {e}")))??;
        }
        Ok((downloaded, stats.skipped))
    }

    /// The pulled image stored under `hash`, if its entry is complete, as `reference` (one
    /// image may be cached under another name or tag than the one asked for now).
    fn cached_image(&self, hash: &str, reference: &str) -> Option<PulledImage> {
        let entry = self.entry(hash);
        if !entry.is_ready() {
            return None;
        }
        let bytes = fs::read(entry.dir().join(IMAGE_JSON)).ok()?;
        let mut p: PulledImage = serde_json::from_slice(&bytes).ok()?;
        p.rootfs = entry.rootfs();
        p.cached = true;
        p.downloaded_bytes = 0;
        p.reference = reference.to_owned();
        Some(p)
    }
}

fn short_digest(d: &str) -> &str {
    let hex = d.split_once(':').map_or(d, |(_, h)| h);
    &hex[..hex.len().min(12)]
}

impl From<ImageError> for OciError {
    fn from(e: ImageError) -> Self {
        OciError::Image(Box::new(e))
    }
}
