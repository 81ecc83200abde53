//! Flags for pulling template images from OCI registries (shared by `serve` and `template
//! pull`); they fill a [`RegistryConfig`].

use std::path::PathBuf;
use std::time::Duration;

use bulkhead_images::oci::RegistryConfig;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct RegistryArgs {
    /// Where to fetch a registry's images from, `REGISTRY=URL` (e.g.
    /// `docker.io=https://mirror.example` or `docker.io=http://10.0.0.5:5000`); repeatable or
    /// comma-separated. The URL's scheme picks HTTPS or plain HTTP. Registries without an
    /// entry are fetched from their own name over HTTPS.
    #[arg(
        long,
        env = "BULKHEAD_REGISTRY_MIRRORS",
        value_delimiter = ',',
        value_name = "REGISTRY=URL"
    )]
    pub registry_mirror: Vec<String>,
    /// Registries images may come from, as named in image references (`docker.io`,
    /// `ghcr.io`, `registry.local:5000`); comma-separated. Default: any.
    #[arg(
        long,
        env = "BULKHEAD_REGISTRY_ALLOW",
        value_delimiter = ',',
        value_name = "REGISTRY"
    )]
    pub registry_allow: Vec<String>,
    /// Registry credentials in Docker's `config.json` format (`{"auths": {"HOST": {"auth":
    /// base64(user:password)}}}`); keys are registry names or mirror hosts.
    #[arg(long, env = "BULKHEAD_REGISTRY_AUTH_FILE", value_name = "JSON")]
    pub registry_auth_file: Option<PathBuf>,
    /// Largest image to pull, in compressed bytes downloaded; the unpacked tree may be up to
    /// twice that.
    #[arg(long, env = "BULKHEAD_REGISTRY_MAX_BYTES", default_value_t = 8 << 30)]
    pub registry_max_bytes: u64,
    /// Seconds to wait for a registry to accept a connection before the pull fails.
    #[arg(long, env = "BULKHEAD_REGISTRY_CONNECT_TIMEOUT", default_value_t = 10)]
    pub registry_connect_timeout: u64,
}

impl RegistryArgs {
    pub fn config(&self) -> anyhow::Result<RegistryConfig> {
        let mut c = RegistryConfig {
            allowed: self
                .registry_allow
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
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
        c.limits.max_unpacked_bytes = self.registry_max_bytes.saturating_mul(2);
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
            "--registry-max-bytes",
            "1000",
        ]);
        let c = t.r.config().unwrap();
        assert_eq!(c.mirrors["docker.io"], "http://127.0.0.1:5000");
        assert_eq!(c.mirrors["ghcr.io"], "https://ghcr.mirror");
        assert_eq!(c.allowed, ["docker.io", "ghcr.io"]);
        assert_eq!(
            (c.limits.max_download_bytes, c.limits.max_unpacked_bytes),
            (1000, 2000)
        );
        let bad = T::parse_from(["t", "--registry-mirror", "docker.io"]);
        let e = bad.r.config().unwrap_err().to_string();
        assert!(e.contains("REGISTRY=URL"), "{e}");
    }
}
