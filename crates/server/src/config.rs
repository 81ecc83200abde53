//! [`ServerConfig`]: everything a server start needs, as plain data a front end fills from
//! its flags and environment, and [`ServerConfig::validate`], which rejects a configuration
//! before anything is created, with a message that says what to change.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bulkhead_engine::{AdmissionLimits, PoolConfig, PoolLimits};
use bulkhead_images::TemplateRecipe;

/// Warm pools when the operator sets none: every template keeps 2 ready and grows with demand
/// up to 128 (an idle `base` member costs ~2 MiB); `code-interpreter-v1` members hold running
/// kernels (~100 MiB each), so it grows to 8 only.
pub fn default_pools() -> PoolConfig {
    let mut c = PoolConfig {
        per_template: HashMap::new(),
        default: PoolLimits { min: 2, max: 128 },
    };
    c.per_template.insert(
        bulkhead_images::CODE_INTERPRETER_ID.to_string(),
        PoolLimits { min: 2, max: 8 },
    );
    c
}

/// Whether sandboxes whose create request does not say get internet access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkDefault {
    Deny,
    Allow,
}

/// The egress proxy's settings.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    pub default: NetworkDefault,
    /// Let policies reach loopback, private, link-local and metadata addresses.
    pub allow_private: bool,
    /// PEM bundle added to every sandbox's trust store.
    pub sandbox_ca_bundle: Option<PathBuf>,
    /// Extra PEM roots the proxy trusts upstream.
    pub upstream_ca: Vec<PathBuf>,
    /// TEST ONLY `NAME=IP` resolver overrides.
    pub resolve: Vec<String>,
}

/// CPUs and memory of one template's sandboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateSize {
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// One server's configuration. Build it from flags, then [`validate`](Self::validate) it (the
/// server's start does so too).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// `sqlite:///path/db` or `postgres://…`; `None`: SQLite in the data dir.
    pub database_url: Option<String>,
    /// Key file that encrypts secret values at rest (`--secrets-key-file`); `None`:
    /// `<data-dir>/secrets.key`, generated on the first start.
    pub secrets_key_file: Option<PathBuf>,
    /// `None`: `<data-dir>/images`.
    pub image_cache: Option<PathBuf>,
    /// Key to accept from the start (`BULKHEAD_API_KEY`); without one and without any active
    /// key, the first start creates one.
    pub api_key: Option<String>,
    /// Warm pool bounds per template ([`default_pools`] unless the operator says).
    pub pools: PoolConfig,
    /// Creates running at once and waiting (`--max-concurrent-creates`, `--max-queued-creates`).
    pub admission: AdmissionLimits,
    /// Which templates' pools are restored from a warm checkpoint (`--pool-checkpoint`).
    pub pool_checkpoint: bulkhead_engine::CheckpointPools,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub max_sandboxes: usize,
    /// Template builds one team may run at once (`--max-builds-per-team`).
    pub max_builds_per_team: usize,
    /// How long a paused sandbox (its checkpoint under `<data-dir>/checkpoints`) is kept.
    pub paused_retention: Duration,
    pub max_background_processes: u32,
    /// Extra CA bundle to trust inside templates at build time.
    pub extra_ca_bundle: Option<PathBuf>,
    pub uid_base: u32,
    /// CRIU binary for checkpoint/restore (pause, resume, snapshots, fork); None disables them.
    pub criu: Option<PathBuf>,
    /// Size of `base` (and every template without its own size).
    pub base_size: TemplateSize,
    /// Size of `code-interpreter-v1`.
    pub code_interpreter_size: TemplateSize,
    /// Built-in templates to serve, by name, in order.
    pub templates: Vec<String>,
    pub network: NetworkConfig,
    /// Size limit of every new volume in bytes (`--volume-max-bytes`).
    pub volume_max_bytes: u64,
    /// Every sandbox's disk in MiB (`--sandbox-disk-mb`).
    pub sandbox_disk_mb: u64,
    /// OCI registries for templates built from images (`--registry-*`): allow list, mirrors,
    /// credentials, pull limits.
    pub registry: bulkhead_images::oci::RegistryConfig,
    /// Domain whose `{port}-{id}.{domain}` hosts reach sandbox ports (`--sandbox-domain`).
    pub sandbox_domain: Option<String>,
    /// Usage metering, prices and the out-of-credits policy (`--metering-*`, `--price-*`,
    /// `--credits-*`).
    pub metering: bulkhead_engine::MeteringConfig,
    /// Which driver runs the sandboxes (`--driver`).
    pub driver: DriverKind,
    /// Templates another driver runs (`--driver-for TEMPLATE=DRIVER`).
    pub driver_for: Vec<(String, DriverKind)>,
    /// The microvm driver's guest kernel (`--guest-kernel`; `scripts/guest-kernel.sh`).
    pub guest_kernel: Option<PathBuf>,
    /// Client connection caps and timeouts of the HTTP listener (`--http-*`).
    pub connections: crate::ConnectionLimits,
}

/// The isolation driver of a server's sandboxes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DriverKind {
    /// Linux namespaces on the host kernel (`bulkhead-jail`).
    #[default]
    Jail,
    /// A QEMU microVM per sandbox (`bulkhead-microvm`, docs/microvm.md).
    Microvm,
}

/// A configuration the server cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the microvm driver (--driver or --driver-for) needs a guest kernel: pass --guest-kernel $(scripts/guest-kernel.sh)/bzImage"
    )]
    NoGuestKernel,
    #[error("unknown template {name:?}: the built-in templates are: {builtin}")]
    UnknownTemplate { name: String, builtin: String },
    #[error("no template selected: pass --templates with some of: {0}")]
    NoTemplate(String),
    #[error("--egress-resolve {0:?}: expected NAME=IP")]
    ResolveSyntax(String),
    #[error("--egress-resolve {item:?}: {ip:?} is not an IP address")]
    ResolveAddress {
        item: String,
        ip: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error(
        "--sandbox-domain {0:?} is not a domain name: use dot-separated labels of letters, digits and hyphens, e.g. sandbox.example.com"
    )]
    SandboxDomain(String),
    #[error("--max-sandboxes must be at least 1")]
    NoSandboxes,
    #[error("--default-timeout must be at least 1 second")]
    ZeroTimeout,
    #[error(
        "--default-timeout ({default} s) is longer than --max-timeout ({max} s): lower the first or raise the second"
    )]
    TimeoutAboveMax { default: u64, max: u64 },
    #[error("--pool {template}={min}..{max}: the minimum is above the maximum")]
    PoolBounds {
        template: String,
        min: usize,
        max: usize,
    },
    #[error("{flag} must be at least {min}")]
    TooSmall { flag: &'static str, min: u64 },
    #[error(
        "--max-sandboxes and the warm pools' maxima need {needed} uid ranges, more than fit above --uid-base {uid_base}: lower them or the uid base"
    )]
    UidRange { needed: u64, uid_base: u32 },
    #[error(transparent)]
    Connections(#[from] crate::LimitsError),
}

impl ServerConfig {
    /// Where the secrets key comes from: the operator's file, or one kept in the data dir.
    pub fn secrets_key_source(&self) -> bulkhead_store::SecretsKeySource {
        bulkhead_store::SecretsKeySource::new(self.secrets_key_file.as_deref(), &self.data_dir)
    }

    /// Checks everything that can be checked without touching the host.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.recipes()?;
        self.connections.validate()?;
        if self.uses(DriverKind::Microvm) && self.guest_kernel.is_none() {
            return Err(ConfigError::NoGuestKernel);
        }
        parse_overrides(&self.network.resolve)?;
        if self.max_sandboxes == 0 {
            return Err(ConfigError::NoSandboxes);
        }
        if let Some(d) = &self.sandbox_domain
            && !is_domain_name(d)
        {
            return Err(ConfigError::SandboxDomain(d.clone()));
        }
        if self.max_builds_per_team == 0 {
            return Err(ConfigError::TooSmall {
                flag: "--max-builds-per-team",
                min: 1,
            });
        }
        if self.admission.max_concurrent == 0 {
            return Err(ConfigError::TooSmall {
                flag: "--max-concurrent-creates",
                min: 1,
            });
        }
        let mut bounds: Vec<_> = self.pools.per_template.iter().collect();
        bounds.sort_by(|a, b| a.0.cmp(b.0));
        for (template, l) in bounds {
            if l.min > l.max {
                return Err(ConfigError::PoolBounds {
                    template: template.clone(),
                    min: l.min,
                    max: l.max,
                });
            }
        }
        if self.sandbox_disk_mb < bulkhead_engine::MIN_SANDBOX_DISK_MB {
            return Err(ConfigError::TooSmall {
                flag: "--sandbox-disk-mb",
                min: bulkhead_engine::MIN_SANDBOX_DISK_MB,
            });
        }
        if self.volume_max_bytes < bulkhead_engine::volume_storage::MIN_VOLUME_BYTES {
            return Err(ConfigError::TooSmall {
                flag: "--volume-max-bytes",
                min: bulkhead_engine::volume_storage::MIN_VOLUME_BYTES,
            });
        }
        if self.default_timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.default_timeout > self.max_timeout {
            return Err(ConfigError::TimeoutAboveMax {
                default: self.default_timeout.as_secs(),
                max: self.max_timeout.as_secs(),
            });
        }
        for (flag, value, min) in [
            ("--cpu-count", u64::from(self.base_size.cpu_count), 1),
            ("--memory-mb", self.base_size.memory_mb, 16),
            (
                "--code-interpreter-cpu-count",
                u64::from(self.code_interpreter_size.cpu_count),
                1,
            ),
            (
                "--code-interpreter-memory-mb",
                self.code_interpreter_size.memory_mb,
                16,
            ),
            (
                "--max-background-processes",
                u64::from(self.max_background_processes),
                1,
            ),
        ] {
            if value < min {
                return Err(ConfigError::TooSmall { flag, min });
            }
        }
        // Each slot owns 65536 host uids above the base; they must stay within u32.
        let needed = u64::from(self.slots());
        if u64::from(self.uid_base) + needed * 65536 > u64::from(u32::MAX) {
            return Err(ConfigError::UidRange {
                needed,
                uid_base: self.uid_base,
            });
        }
        Ok(())
    }

    /// The recipes named in `templates`, in order, each once, with the template CA bundle.
    pub fn recipes(&self) -> Result<Vec<TemplateRecipe>, ConfigError> {
        let builtin = || TemplateRecipe::builtin_ids().join(", ");
        let mut out: Vec<TemplateRecipe> = Vec::new();
        for name in self
            .templates
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
        {
            if out.iter().any(|r| r.id == name) {
                continue;
            }
            let mut recipe =
                TemplateRecipe::builtin(name).ok_or_else(|| ConfigError::UnknownTemplate {
                    name: name.to_string(),
                    builtin: builtin(),
                })?;
            recipe.extra_ca_bundle = self.extra_ca_bundle.clone();
            out.push(recipe);
        }
        if out.is_empty() {
            return Err(ConfigError::NoTemplate(builtin()));
        }
        Ok(out)
    }

    /// The image cache directory.
    pub fn image_cache_dir(&self) -> PathBuf {
        self.image_cache
            .clone()
            .unwrap_or_else(|| self.data_dir.join("images"))
    }

    /// Jail slots: every sandbox, every served template's warm pool at its max, a start in
    /// flight per template and a few spare for starts racing a kill.
    pub fn slots(&self) -> u32 {
        let pools: usize = self
            .templates
            .iter()
            .map(|t| self.pools.limits(t).max.max(self.pools.limits(t).min) + 1)
            .sum();
        (self.max_sandboxes + pools + 8) as u32
    }

    /// Does any template run on `kind`?
    pub fn uses(&self, kind: DriverKind) -> bool {
        self.driver == kind || self.driver_for.iter().any(|(_, k)| *k == kind)
    }

    /// CPUs and memory of the template `id`.
    pub fn size_of(&self, id: &str) -> TemplateSize {
        if id == bulkhead_images::CODE_INTERPRETER_ID {
            self.code_interpreter_size
        } else {
            self.base_size
        }
    }
}

/// `NAME=IP` overrides, by normalised name.
pub(crate) fn parse_overrides(
    items: &[String],
) -> Result<HashMap<String, Vec<IpAddr>>, ConfigError> {
    let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for item in items {
        let (name, ip) = item
            .split_once('=')
            .ok_or_else(|| ConfigError::ResolveSyntax(item.clone()))?;
        let addr: IpAddr = ip.parse().map_err(|source| ConfigError::ResolveAddress {
            item: item.clone(),
            ip: ip.to_string(),
            source,
        })?;
        map.entry(bulkhead_egress::normalize_name(name))
            .or_default()
            .push(addr);
    }
    Ok(map)
}

/// A DNS name: dot-separated labels of 1 to 63 letters, digits and inner hyphens.
fn is_domain_name(d: &str) -> bool {
    d.len() <= 253
        && d.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:3000".parse().unwrap(),
            data_dir: "/var/lib/bulkhead".into(),
            database_url: None,
            secrets_key_file: None,
            image_cache: None,
            api_key: None,
            pools: default_pools(),
            admission: AdmissionLimits::default(),
            max_builds_per_team: bulkhead_engine::BuildLimits::default().max_builds_per_team,
            pool_checkpoint: bulkhead_engine::CheckpointPools::Auto,
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            max_sandboxes: 500,
            paused_retention: Duration::from_secs(30 * 24 * 3600),
            max_background_processes: 100,
            extra_ca_bundle: None,
            uid_base: 1_000_000,
            criu: None,
            base_size: TemplateSize {
                cpu_count: 2,
                memory_mb: 512,
            },
            code_interpreter_size: TemplateSize {
                cpu_count: 2,
                memory_mb: 1024,
            },
            templates: vec!["base".into(), "code-interpreter-v1".into()],
            sandbox_domain: None,
            metering: Default::default(),
            network: NetworkConfig {
                default: NetworkDefault::Deny,
                allow_private: false,
                sandbox_ca_bundle: None,
                upstream_ca: Vec::new(),
                resolve: Vec::new(),
            },
            volume_max_bytes: 1 << 30,
            sandbox_disk_mb: bulkhead_engine::DEFAULT_SANDBOX_DISK_MB,
            registry: Default::default(),
            driver: DriverKind::Jail,
            driver_for: Vec::new(),
            guest_kernel: None,
            connections: Default::default(),
        }
    }

    fn err(c: ServerConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn the_defaults_are_valid() {
        let c = config();
        c.validate().unwrap();
        // Every sandbox, each served pool at its max plus a start in flight, and spares.
        assert_eq!(c.slots(), 500 + (128 + 1) + (8 + 1) + 8);
        assert_eq!(
            c.image_cache_dir(),
            PathBuf::from("/var/lib/bulkhead/images")
        );
        assert_eq!(c.size_of("base").memory_mb, 512);
        assert_eq!(
            c.size_of(bulkhead_images::CODE_INTERPRETER_ID).memory_mb,
            1024
        );
    }

    #[test]
    fn selects_templates_in_order_once_with_the_ca_bundle() {
        let mut c = config();
        c.templates = vec![
            "base".into(),
            " code-interpreter-v1".into(),
            "base".into(),
            "".into(),
        ];
        c.extra_ca_bundle = Some("/etc/ca.pem".into());
        let recipes = c.recipes().unwrap();
        let ids: Vec<_> = recipes.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["base", "code-interpreter-v1"]);
        assert!(
            recipes
                .iter()
                .all(|r| r.extra_ca_bundle == c.extra_ca_bundle)
        );
    }

    #[test]
    fn the_microvm_driver_needs_a_guest_kernel() {
        let mut c = config();
        c.driver = DriverKind::Microvm;
        assert!(matches!(c.validate(), Err(ConfigError::NoGuestKernel)));
        c.guest_kernel = Some("/k/bzImage".into());
        c.validate().unwrap();
        // Also when only some templates run in VMs.
        let mut c = config();
        c.driver_for = vec![("base".into(), DriverKind::Microvm)];
        assert!(c.uses(DriverKind::Microvm) && c.uses(DriverKind::Jail));
        assert!(matches!(c.validate(), Err(ConfigError::NoGuestKernel)));
    }

    #[test]
    fn template_errors_name_the_choices() {
        let mut c = config();
        c.templates = vec!["nope".into()];
        let e = err(c.clone());
        assert!(
            e.contains("\"nope\"") && e.contains("code-interpreter-v1"),
            "{e}"
        );
        c.templates = vec![" ".into()];
        assert!(err(c).starts_with("no template selected: pass --templates"));
    }

    #[test]
    fn resolver_overrides_parse() {
        let m = parse_overrides(&[
            "API.Allowed.test=203.0.113.10".into(),
            "api.allowed.test=::1".into(),
        ])
        .unwrap();
        assert_eq!(m["api.allowed.test"].len(), 2);
        let mut c = config();
        c.network.resolve = vec!["nope".into()];
        assert_eq!(
            err(c.clone()),
            "--egress-resolve \"nope\": expected NAME=IP"
        );
        c.network.resolve = vec!["a=b".into()];
        assert!(err(c).contains("\"b\" is not an IP address"));
    }

    #[test]
    fn sandbox_domain_must_be_a_domain_name() {
        for good in ["bulkhead.test", "sbx.example.com", "localhost", "a-1.b2"] {
            let mut c = config();
            c.sandbox_domain = Some(good.into());
            assert!(c.validate().is_ok(), "{good}");
        }
        for bad in [
            "",
            ".example.com",
            "example.com.",
            "a..b",
            "-a.b",
            "a b",
            "a_b.c",
            "x.com:443",
        ] {
            let mut c = config();
            c.sandbox_domain = Some(bad.into());
            assert!(err(c).contains("--sandbox-domain"), "{bad:?}");
        }
    }

    #[test]
    fn limits_and_timeouts_must_make_sense() {
        let mut c = config();
        c.max_sandboxes = 0;
        assert!(err(c).contains("--max-sandboxes"));
        let mut c = config();
        c.default_timeout = Duration::ZERO;
        assert!(err(c).contains("--default-timeout"));
        let mut c = config();
        c.default_timeout = Duration::from_secs(600);
        c.max_timeout = Duration::from_secs(60);
        let e = err(c);
        assert!(e.contains("(600 s)") && e.contains("(60 s)"), "{e}");
        let mut c = config();
        c.base_size.cpu_count = 0;
        assert_eq!(err(c), "--cpu-count must be at least 1");
        let mut c = config();
        c.code_interpreter_size.memory_mb = 1;
        assert_eq!(err(c), "--code-interpreter-memory-mb must be at least 16");
        let mut c = config();
        c.max_background_processes = 0;
        assert!(err(c).contains("--max-background-processes"));
    }

    #[test]
    fn connection_limits_are_validated_with_the_rest() {
        let mut c = config();
        c.connections.max_connections = Some(1000);
        c.connections.reserved = 1000;
        assert!(err(c).contains("--http-reserved-connections"));
    }

    #[test]
    fn uid_ranges_must_fit() {
        let mut c = config();
        c.uid_base = u32::MAX - 65536;
        assert!(err(c.clone()).contains("--uid-base"));
        c.uid_base = 1_000_000;
        c.max_sandboxes = 70_000;
        assert!(err(c).contains("uid ranges"));
    }
}
