//! What a template root filesystem is built from, and its content hash.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{ImageError, Result};

/// Version of the post-bootstrap steps in `finalize.rs` (users, CA, slimming). Part of every hash:
/// bump it whenever those steps change what ends up in the tree, so old caches are not reused.
pub(crate) const FINALIZE_VERSION: u32 = 1;

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

impl TemplateRecipe {
    /// The default template: Debian bookworm `minbase` plus what agents expect to find.
    ///
    /// bash and coreutils are Essential (always in minbase) but listed because sandboxes rely on
    /// them; passwd (Priority: required) is in minbase already. `netbase` provides /etc/services
    /// and /etc/protocols, which socket libraries look up. No sudo: `root` is a separate user.
    pub fn base() -> Self {
        TemplateRecipe {
            id: "base".to_owned(),
            suite: "bookworm".to_owned(),
            packages: [
                "bash",
                "ca-certificates",
                "coreutils",
                "curl",
                "git",
                "iproute2",
                "less",
                "netbase",
                "procps",
                "python3",
            ]
            .into_iter()
            .map(str::to_owned)
            .collect(),
            extra_ca_bundle: None,
            recipe_version: 1,
        }
    }

    pub fn with_extra_ca_bundle(mut self, path: impl Into<PathBuf>) -> Self {
        self.extra_ca_bundle = Some(path.into());
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

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
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

    #[test]
    fn base_hash_is_pinned() {
        // Changing this value invalidates every deployed cache: only do it together with a
        // deliberate FINALIZE_VERSION or recipe change.
        if debian_arch() == "amd64" {
            assert_eq!(
                TemplateRecipe::base().content_hash(),
                "c41be0a75d173f45c2ca033944c8320e4a4e088d05c520e1cbf080f95d67f394",
                "base recipe hash changed"
            );
        }
        assert_eq!(TemplateRecipe::base().content_hash().len(), 64);
    }

    #[test]
    fn hash_ignores_id_and_package_order_and_duplicates() {
        let base = TemplateRecipe::base();
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
        let base = TemplateRecipe::base();
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

    #[test]
    fn validation() {
        TemplateRecipe::base().validate().unwrap();
        for bad in ["", "a", "Python3", "a,b", "--foo", "x y"] {
            let mut r = TemplateRecipe::base();
            r.packages = vec![bad.to_owned()];
            assert!(r.validate().is_err(), "{bad:?} accepted");
        }
        let mut r = TemplateRecipe::base();
        r.packages = vec!["libstdc++6".to_owned(), "python3.11".to_owned()];
        r.validate().unwrap();
        r.suite = "../etc".to_owned();
        assert!(r.validate().is_err());
    }
}
