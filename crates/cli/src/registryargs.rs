//! Flags for pulling template images from OCI registries (shared by `serve` and `template
//! pull`); they fill a [`RegistryConfig`].

use std::path::PathBuf;
use std::time::Duration;

use bulkhead_images::oci::RegistryConfig;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// Where to fetch a registry's images from, `REGISTRY=URL` (e.g.
    /// `docker.io=https://mirror.example` or `docker.io=http://10.0.0.5:5000`); repeatable or
    /// comma-separated. The URL's scheme picks HTTPS or plain HTTP (plain HTTP only for a
    /// `--registry-insecure` endpoint). Registries without an entry are fetched from their own
    /// name over HTTPS. The registry must still be allowed (`--registry-allow`).
    #[arg(
        long,
        env = "BULKHEAD_REGISTRY_MIRRORS",
        value_delimiter = ',',
        value_name = "REGISTRY=URL"
    )]
    pub registry_mirror: Vec<String>,
    /// Registries images may come from, as named in image references (`docker.io`,
    /// `registry.local:5000`, `*.pkg.dev`; without a port: any port; `*`: any registry at a
    /// public address); comma-separated. Default: the public registries (docker.io, ghcr.io,
    /// quay.io, gcr.io, *.gcr.io, *.pkg.dev, public.ecr.aws, mcr.microsoft.com,
    /// registry.k8s.io).
    #[arg(
        long,
        env = "BULKHEAD_REGISTRY_ALLOW",
        value_delimiter = ',',
        value_name = "HOST[:PORT]"
    )]
    pub registry_allow: Vec<String>,
    /// Registry endpoints that may be reached over plain HTTP and at loopback, private,
    /// link-local or other non-public addresses (a registry on this machine or the LAN);
    /// comma-separated `HOST[:PORT]`. Every other connection of a pull (the registry, its
    /// token service, redirects) is HTTPS to public addresses only. Default: none.
    #[arg(
        long,
        env = "BULKHEAD_REGISTRY_INSECURE",
        value_delimiter = ',',
        value_name = "HOST[:PORT]"
    )]
    pub registry_insecure: Vec<String>,
    /// Registry credentials in Docker's `config.json` format (`{"auths": {"HOST": {"auth":
    /// base64(user:password)}}}`); keys are registry names or mirror hosts.
    #[arg(long, env = "BULKHEAD_REGISTRY_AUTH_FILE", value_name = "JSON")]
    pub registry_auth_file: Option<PathBuf>,
    /// Largest image to pull, in compressed bytes downloaded.
    #[arg(long, env = "BULKHEAD_REGISTRY_MAX_BYTES", default_value_t = 8 << 30)]
    pub registry_max_bytes: u64,
    /// Largest unpacked image, in bytes of file content written to the cache; a pull stops
    /// (and leaves nothing behind) as soon as its layers would write more.
    #[arg(long, env = "BULKHEAD_REGISTRY_MAX_UNPACKED_BYTES", default_value_t = 4 << 30)]
    pub registry_max_unpacked_bytes: u64,
    /// Seconds to wait for a registry to accept a connection before the pull fails.
    #[arg(long, env = "BULKHEAD_REGISTRY_CONNECT_TIMEOUT", default_value_t = 10)]
    pub registry_connect_timeout: u64,
}

impl RegistryArgs {
    pub fn config(&self) -> anyhow::Result<RegistryConfig> {
        let list = |v: &[String]| -> Vec<String> {
            v.iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let defaults = RegistryConfig::default();
        let allowed = list(&self.registry_allow);
        let mut c = RegistryConfig {
            allowed: if allowed.is_empty() {
                defaults.allowed
            } else {
                allowed
            },
            insecure: list(&self.registry_insecure),
            connect_timeout: Duration::from_secs(self.registry_connect_timeout.max(1)),
            ..Default::default()
        };
        for m in &self.registry_mirror {
            c.add_mirror(m)
                .map_err(|e| anyhow::anyhow!("--registry-mirror {e}"))?;
        }
        if let Some(p) = &self.registry_auth_file {
            c.load_auth_file(p)?;
        }
        c.limits.max_download_bytes = self.registry_max_bytes;
        c.limits.max_unpacked_bytes = self.registry_max_unpacked_bytes;
        // Bad patterns and plain-HTTP mirrors nobody trusted fail at startup, not at a pull.
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        r: RegistryArgs,
    }

    #[test]
    fn flags_fill_the_registry_config() {
        let t = T::parse_from([
            "t",
            "--registry-mirror",
            "docker.io=http://127.0.0.1:5000,ghcr.io=https://ghcr.mirror",
            "--registry-allow",
            "docker.io,ghcr.io",
            "--registry-insecure",
            "127.0.0.1:5000",
            "--registry-max-bytes",
            "1000",
            "--registry-max-unpacked-bytes",
            "3000",
        ]);
        let c = t.r.config().unwrap();
        assert_eq!(c.mirrors["docker.io"], "http://127.0.0.1:5000");
        assert_eq!(c.mirrors["ghcr.io"], "https://ghcr.mirror");
        assert_eq!(c.allowed, ["docker.io", "ghcr.io"]);
        assert_eq!(c.insecure, ["127.0.0.1:5000"]);
        assert_eq!(
            (c.limits.max_download_bytes, c.limits.max_unpacked_bytes),
            (1000, 3000)
        );
        let bad = T::parse_from(["t", "--registry-mirror", "docker.io"]);
        let e = bad.r.config().unwrap_err().to_string();
        assert!(e.contains("REGISTRY=URL"), "{e}");
    }

    #[test]
    fn defaults_are_the_public_registries_https_and_a_4_gib_tree() {
        let c = T::parse_from(["t"]).r.config().unwrap();
        for public in [
            "docker.io",
            "ghcr.io",
            "quay.io",
            "*.pkg.dev",
            "registry.k8s.io",
        ] {
            assert!(c.allowed.iter().any(|a| a == public), "{public}");
        }
        assert!(c.insecure.is_empty());
        assert_eq!(c.limits.max_unpacked_bytes, 4 << 30);
        // A plain-HTTP mirror without --registry-insecure is refused at startup.
        let t = T::parse_from(["t", "--registry-mirror", "docker.io=http://10.0.0.5:5000"]);
        let e = t.r.config().unwrap_err().to_string();
        assert!(e.contains("--registry-insecure 10.0.0.5:5000"), "{e}");
        let t = T::parse_from(["t", "--registry-insecure", "a/b"]);
        assert!(t.r.config().is_err());
    }
}
