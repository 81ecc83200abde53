//! What a template root filesystem is built from, as data, and its content hash. Nothing here
//! runs anything or knows the built-in templates (those are the `catalog`): image sources read
//! recipes, recipes never call back into them.

mod step;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{ImageError, Result};

pub(crate) use step::sha256_hex;
pub use step::{BuildStep, FileAsset};

/// Version of the post-bootstrap steps in `finalize.rs` (users, CA, slimming). Part of every hash:
/// bump it whenever those steps change what ends up in the tree, so old caches are not reused.
pub(crate) const FINALIZE_VERSION: u32 = 1;

/// Version of the layer machinery in `layer.rs` and `exec.rs` (chroot environment, flags passed
/// to apt/pip/npm, the clean-up after the steps). Part of every layered hash: bump it when they
/// change the tree.
pub(crate) const LAYER_VERSION: u32 = 1;

/// Debootstrap variant; fixed for now but hashed so a future choice cannot collide.
pub(crate) const VARIANT: &str = "minbase";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRecipe {
    /// Template name (e.g. `base`). Not part of the hash: identical recipes share one tree.
    pub id: String,
    /// Debian suite, e.g. `bookworm`.
    pub suite: String,
    /// Packages installed on top of `minbase` (Essential + Priority: required + apt).
    pub packages: Vec<String>,
    /// PEM bundle trusted inside the sandbox in addition to Debian's CAs, for hosts whose outbound
    /// TLS is re-signed by an inspecting proxy. Its *contents* are hashed, not its path.
    pub extra_ca_bundle: Option<PathBuf>,
    /// Bump to force a rebuild of a recipe whose inputs did not otherwise change.
    pub recipe_version: u32,
    /// Build on a copy of this template's tree instead of bootstrapping: `packages` are then
    /// installed with apt inside it, followed by `steps`. The layered recipe's
    /// `extra_ca_bundle` is used for the parent too (the CA belongs to the whole chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Box<TemplateRecipe>>,
    /// Run in order after the packages; only for layered recipes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<BuildStep>,
}

/// The hashed form. Field order is fixed by the struct, packages are sorted and deduplicated
/// (install order does not change the result), and the mirror is left out on purpose.
#[derive(Serialize)]
struct Canonical<'a> {
    format: &'static str,
    finalize_version: u32,
    arch: &'static str,
    variant: &'static str,
    suite: &'a str,
    packages: Vec<&'a str>,
    extra_ca_sha256: Option<String>,
    recipe_version: u32,
}

/// The hashed form of a layered recipe. Steps keep their order (it matters); files are hashed
/// by path, mode and content digest.
#[derive(Serialize)]
struct LayerCanonical<'a> {
    format: &'static str,
    layer_version: u32,
    parent: String,
    packages: Vec<&'a str>,
    steps: &'a [BuildStep],
    recipe_version: u32,
}

impl TemplateRecipe {
    /// The parent to build first, carrying this recipe's extra CA bundle.
    pub fn effective_parent(&self) -> Option<TemplateRecipe> {
        self.parent.as_deref().map(|p| {
            let mut p = p.clone();
            p.set_extra_ca_bundle(self.extra_ca_bundle.clone());
            p
        })
    }

    fn set_extra_ca_bundle(&mut self, ca: Option<PathBuf>) {
        self.extra_ca_bundle = ca.clone();
        if let Some(p) = self.parent.as_deref_mut() {
            p.set_extra_ca_bundle(ca);
        }
    }

    /// Trust this PEM bundle inside the template (and its parents).
    pub fn with_extra_ca_bundle(mut self, path: impl Into<PathBuf>) -> Self {
        self.set_extra_ca_bundle(Some(path.into()));
        self
    }

    /// SHA-256 (hex) of everything that affects the built tree, excluding the mirror URL.
    ///
    /// Reads the extra CA bundle to hash its contents; if it cannot be read, the hash covers
    /// the path instead and [`crate::ImageCache::build`] reports the read error.
    pub fn content_hash(&self) -> String {
        let ca = self
            .extra_ca_bundle
            .as_ref()
            .map(|p| match std::fs::read(p) {
                Ok(bytes) => sha256_hex(&bytes),
                Err(_) => format!("unreadable:{}", p.display()),
            });
        self.hash_with_ca_digest(ca)
    }

    /// The hash for a CA bundle already read into memory (so build and hash see the same bytes).
    pub(crate) fn hash_with_ca(&self, ca: Option<&[u8]>) -> String {
        self.hash_with_ca_digest(ca.map(sha256_hex))
    }

    fn hash_with_ca_digest(&self, extra_ca_sha256: Option<String>) -> String {
        let mut packages: Vec<&str> = self.packages.iter().map(String::as_str).collect();
        packages.sort_unstable();
        packages.dedup();
        if let Some(parent) = &self.parent {
            let canonical = LayerCanonical {
                format: "bulkhead-rootfs-layer/1",
                layer_version: LAYER_VERSION,
                parent: parent.hash_with_ca_digest(extra_ca_sha256),
                packages,
                steps: &self.steps,
                recipe_version: self.recipe_version,
            };
            let json = serde_json::to_vec(&canonical).unwrap_or_default();
            return sha256_hex(&json);
        }
        let canonical = Canonical {
            format: "bulkhead-rootfs/1",
            finalize_version: FINALIZE_VERSION,
            arch: debian_arch(),
            variant: VARIANT,
            suite: &self.suite,
            packages,
            extra_ca_sha256,
            recipe_version: self.recipe_version,
        };
        // Serialising a struct of strings and integers cannot fail.
        let json = serde_json::to_vec(&canonical).unwrap_or_default();
        sha256_hex(&json)
    }

    /// Rejects names that would be misparsed on the tool command line (`--include=a,b`).
    pub fn validate(&self) -> Result<()> {
        let suite_ok = !self.suite.is_empty()
            && self
                .suite
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !suite_ok {
            return Err(ImageError::InvalidRecipe(format!(
                "suite {:?} is not a Debian suite name (like bookworm)",
                self.suite
            )));
        }
        for p in &self.packages {
            if !is_package_name(p) {
                return Err(ImageError::InvalidRecipe(format!(
                    "{p:?} is not a Debian package name (lowercase letters, digits, + - .)"
                )));
            }
        }
        match &self.parent {
            Some(parent) => {
                if parent.suite != self.suite {
                    return Err(ImageError::InvalidRecipe(format!(
                        "template {} is layered on {} but names suite {} instead of {}",
                        self.id, parent.id, self.suite, parent.suite
                    )));
                }
                parent.validate()?;
                for step in &self.steps {
                    step.validate()?;
                }
            }
            None if !self.steps.is_empty() => {
                return Err(ImageError::InvalidRecipe(format!(
                    "template {} has build steps but no parent template to run them in",
                    self.id
                )));
            }
            None => {}
        }
        Ok(())
    }
}

/// Debian policy §5.6.1: at least two characters, lowercase alphanumerics and `+ - .`, starting
/// with an alphanumeric.
fn is_package_name(p: &str) -> bool {
    let b = p.as_bytes();
    b.len() >= 2
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.')
        })
}

/// The Debian architecture the host (and so the tree) uses.
pub(crate) fn debian_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "i386",
        "arm" => "armhf",
        "powerpc64" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recipe shaped like the built-in `base` (the catalogue pins the real one's hash).
    fn base() -> TemplateRecipe {
        TemplateRecipe {
            id: "base".to_owned(),
            suite: "bookworm".to_owned(),
            packages: ["bash", "ca-certificates", "curl", "git", "python3"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            extra_ca_bundle: None,
            recipe_version: 1,
            parent: None,
            steps: Vec::new(),
        }
    }

    #[test]
    fn hash_ignores_id_and_package_order_and_duplicates() {
        let base = base();
        let mut other = base.clone();
        other.id = "something-else".to_owned();
        other.packages.reverse();
        other.packages.push("git".to_owned());
        assert_eq!(base.content_hash(), other.content_hash());
        assert_eq!(
            base.content_hash(),
            base.clone().content_hash(),
            "deterministic"
        );
    }

    #[test]
    fn hash_changes_with_every_input() {
        let base = base();
        let h = base.content_hash();

        let mut r = base.clone();
        r.suite = "trixie".to_owned();
        assert_ne!(r.content_hash(), h);

        let mut r = base.clone();
        r.packages.push("jq".to_owned());
        assert_ne!(r.content_hash(), h);

        let mut r = base.clone();
        r.recipe_version += 1;
        assert_ne!(r.content_hash(), h);

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("a.crt");
        std::fs::write(&ca, "one").unwrap();
        let with_ca = base.clone().with_extra_ca_bundle(&ca);
        let h1 = with_ca.content_hash();
        assert_ne!(h1, h);
        assert_eq!(h1, base.hash_with_ca(Some(b"one")));
        // Contents, not the path, count.
        let moved = dir.path().join("b.crt");
        std::fs::rename(&ca, &moved).unwrap();
        assert_eq!(base.clone().with_extra_ca_bundle(&moved).content_hash(), h1);
        std::fs::write(&moved, "two").unwrap();
        assert_ne!(base.clone().with_extra_ca_bundle(&moved).content_hash(), h1);
    }

    fn layered() -> TemplateRecipe {
        TemplateRecipe {
            id: "layer".into(),
            suite: "bookworm".into(),
            packages: vec!["nodejs".into()],
            extra_ca_bundle: None,
            recipe_version: 1,
            parent: Some(Box::new(base())),
            steps: vec![
                BuildStep::Pip {
                    packages: vec!["numpy==2.4.6".into()],
                },
                BuildStep::Npm {
                    packages: vec!["deno@2.9.6".into()],
                },
                BuildStep::File(FileAsset::new("/opt/a.py", "print(1)\n", 0o644)),
                BuildStep::Run {
                    command: "true".into(),
                },
            ],
        }
    }

    #[test]
    fn layered_hash_covers_parent_pins_assets_and_steps() {
        let r = layered();
        r.validate().unwrap();
        let h = r.content_hash();
        assert_ne!(h, base().content_hash());
        assert_eq!(h, layered().content_hash(), "deterministic");

        let mut other = layered();
        other.id = "renamed".into();
        assert_eq!(other.content_hash(), h, "the id is not hashed");

        let mut changes: Vec<TemplateRecipe> = Vec::new();
        let mut c = layered();
        c.steps[0] = BuildStep::Pip {
            packages: vec!["numpy==2.4.5".into()],
        };
        changes.push(c);
        let mut c = layered();
        c.steps[1] = BuildStep::Npm {
            packages: vec!["deno@2.9.5".into()],
        };
        changes.push(c);
        let mut c = layered();
        c.steps[2] = BuildStep::File(FileAsset::new("/opt/a.py", "print(2)\n", 0o644));
        changes.push(c);
        let mut c = layered();
        c.steps[2] = BuildStep::File(FileAsset::new("/opt/a.py", "print(1)\n", 0o755));
        changes.push(c);
        let mut c = layered();
        c.steps.swap(0, 1);
        changes.push(c);
        let mut c = layered();
        c.steps.pop();
        changes.push(c);
        let mut c = layered();
        c.packages.push("jq".into());
        changes.push(c);
        let mut c = layered();
        c.recipe_version += 1;
        changes.push(c);
        let mut c = layered();
        c.parent.as_mut().unwrap().packages.push("jq".into());
        changes.push(c);
        for (i, c) in changes.iter().enumerate() {
            assert_ne!(c.content_hash(), h, "change {i} did not change the hash");
        }
    }

    #[test]
    fn layered_extra_ca_reaches_the_parent() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "pem").unwrap();
        let r = layered();
        let with_ca = layered().with_extra_ca_bundle(&ca);
        assert_ne!(with_ca.content_hash(), r.content_hash());
        let parent = with_ca.effective_parent().unwrap();
        assert_eq!(parent.extra_ca_bundle.as_deref(), Some(ca.as_path()));
        assert_eq!(
            parent.content_hash(),
            base().with_extra_ca_bundle(&ca).content_hash()
        );
        // Setting the field directly (as `bulkhead serve` does) also applies to the parent.
        let mut direct = layered();
        direct.extra_ca_bundle = Some(ca.clone());
        assert_eq!(direct.content_hash(), with_ca.content_hash());
        assert_eq!(direct.effective_parent().unwrap().extra_ca_bundle, Some(ca));
    }

    #[test]
    fn layered_validation() {
        let mut r = layered();
        r.suite = "trixie".into();
        assert!(r.validate().is_err(), "suite must match the parent");
        let mut r = layered();
        r.steps.push(BuildStep::Pip {
            packages: vec!["numpy".into()],
        });
        assert!(r.validate().is_err(), "unpinned");
        let mut r = base();
        r.steps.push(BuildStep::Run {
            command: "true".into(),
        });
        assert!(r.validate().is_err(), "steps need a parent");
        // READY round trip keeps the hash (file digests are stored) but cannot be rebuilt.
        let json = serde_json::to_string(&layered()).unwrap();
        let back: TemplateRecipe = serde_json::from_str(&json).unwrap();
        assert_eq!(back.content_hash(), layered().content_hash());
        assert!(back.validate().is_err());
        // The base recipe's serialised form is unchanged by the new fields.
        let base = serde_json::to_value(base()).unwrap();
        assert!(base.get("parent").is_none() && base.get("steps").is_none());
    }

    #[test]
    fn validation() {
        base().validate().unwrap();
        for bad in ["", "a", "Python3", "a,b", "--foo", "x y"] {
            let mut r = base();
            r.packages = vec![bad.to_owned()];
            assert!(r.validate().is_err(), "{bad:?} accepted");
        }
        let mut r = base();
        r.packages = vec!["libstdc++6".to_owned(), "python3.11".to_owned()];
        r.validate().unwrap();
        r.suite = "../etc".to_owned();
        assert!(r.validate().is_err());
    }
}
