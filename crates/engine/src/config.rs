//! The engine's settings (one value, filled by the server's configuration).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::pool::policy::PoolConfig;
use crate::sandbox::admission::AdmissionLimits;
use crate::tenancy::metering::MeteringConfig;

/// A sandbox's disk when the operator names none (`--sandbox-disk-mb`): 4 GiB, 262,144 files.
pub const DEFAULT_SANDBOX_DISK_MB: u64 = 4096;
/// The smallest disk a sandbox can have (ext4 needs room for its journal and metadata).
pub const MIN_SANDBOX_DISK_MB: u64 = 32;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// TTL when the client gives none (E2B: 300 s).
    pub default_timeout: Duration,
    /// Largest TTL a client may ask for.
    pub max_timeout: Duration,
    /// Warm pool bounds per template (started, anonymous sandboxes kept ready; the filler
    /// sizes each pool to its demand within them).
    pub pools: PoolConfig,
    /// Creates running at once and waiting beyond those; more are refused with a 429.
    pub admission: AdmissionLimits,
    /// envd version reported to SDKs (they gate features on it).
    pub envd_version: String,
    /// Most sandboxes running at once (pool members not counted).
    pub max_sandboxes: usize,
    /// How long records of dead sandboxes are kept.
    pub dead_retention: Duration,
    /// How often the reaper looks for expired sandboxes.
    pub reap_interval: Duration,
    /// Domain of the sandboxes' hosts, `{port}-{id}.{domain}` (E2B's `domain` in create and
    /// connect responses; the SDK's `get_host`). `None`: responses carry no domain.
    pub sandbox_domain: Option<String>,
    /// How often each running sandbox's usage is sampled for its metrics series (E2B: 5 s).
    pub metrics_interval: Duration,
    /// `allow_internet_access` when a create request does not say (operator setting; E2B's
    /// cloud defaults to true, Bulkhead to false).
    pub network_default_allow: bool,
    /// Environment every sandbox starts with (e.g. the CA bundle variables); a create
    /// request's own `envVars` override these.
    pub sandbox_env: BTreeMap<String, String>,
    /// How long egress audit events are kept.
    pub audit_retention: Duration,
    /// Size limit of every new volume, in bytes (`--volume-max-bytes`).
    pub volume_max_bytes: u64,
    /// Every sandbox's disk in MiB (E2B's `diskSizeMB`, `--sandbox-disk-mb`): what it may write
    /// on top of its template.
    pub sandbox_disk_mb: u64,
    /// Where checkpoints (paused sandboxes, snapshots, forks in flight) are written
    /// (`<data-dir>/checkpoints`).
    pub checkpoint_dir: PathBuf,
    /// How long a paused sandbox is kept before its checkpoint and record are deleted
    /// (`--paused-retention`).
    pub paused_retention: Duration,
    /// Which templates' warm pools are refilled by restoring a checkpoint of a warmed sandbox
    /// instead of cold starts (`--pool-checkpoint`; see `pool_source`).
    pub checkpoint_pools: CheckpointPools,
    /// Template API builds: where custom templates and uploaded build contexts are kept
    /// (`<data-dir>/templates`); None turns the Template API off.
    pub template_dir: Option<PathBuf>,
    /// The image cache that build layers are kept in (next to the built-in templates).
    pub image_cache: PathBuf,
    /// Limits of one template build.
    pub build_limits: BuildLimits,
    /// OCI registries that builds `from_image(...)` pull from (`--registry-*`): allow list,
    /// mirrors, operator credentials, pull limits.
    pub registry: bulkhead_images::oci::RegistryConfig,
    /// Usage metering, prices and what happens when a team's credits run out.
    pub metering: MeteringConfig,
    /// This API replica's id in the store's `replicas` table (`bulkhead api`): it owns the
    /// sandboxes it creates and drives only what it owns (`cluster::replicas`). None under
    /// `bulkhead serve`, where one process drives every sandbox.
    pub replica: Option<String>,
}

/// Limits of a template build: each step's build sandbox gets the template's CPU and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildLimits {
    /// Wall-clock time of one step (its command is killed after it).
    pub step_timeout: Duration,
    /// Wall-clock time of the whole build.
    pub build_timeout: Duration,
    /// How long a start command's ready check may take.
    pub ready_timeout: Duration,
    /// Bytes one step may add to the tree.
    pub max_step_bytes: u64,
    /// Destinations build sandboxes may reach (package registries and code hosts).
    pub allow_out: Vec<String>,
    /// Builds one team may run at once (`--max-builds-per-team`); one more is refused (429).
    pub max_builds_per_team: usize,
}

impl Default for BuildLimits {
    fn default() -> Self {
        BuildLimits {
            step_timeout: Duration::from_secs(20 * 60),
            build_timeout: Duration::from_secs(60 * 60),
            ready_timeout: Duration::from_secs(120),
            max_step_bytes: 10 << 30,
            allow_out: [
                "pypi.org",
                "files.pythonhosted.org",
                "registry.npmjs.org",
                "registry.yarnpkg.com",
                "deb.debian.org",
                "security.debian.org",
                "*.debian.org",
                "github.com",
                "codeload.github.com",
                "*.githubusercontent.com",
                "gitlab.com",
                "bitbucket.org",
            ]
            .map(String::from)
            .to_vec(),
            max_builds_per_team: 2,
        }
    }
}

/// Which templates' pools are refilled from a warm checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CheckpointPools {
    /// Templates whose sandboxes start Jupyter kernels (their rootfs has the interpreter's
    /// `kernels.json`); the rest start cold.
    #[default]
    Auto,
    /// None: every pool member starts cold.
    Off,
    /// Exactly these templates (ids or aliases).
    Only(Vec<String>),
}

/// Why a `--pool-checkpoint` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointPoolsError {
    #[error("give `auto`, `off` or a comma-separated list of templates")]
    Empty,
}

impl std::str::FromStr for CheckpointPools {
    type Err = CheckpointPoolsError;

    /// `auto`, `off`, or a comma-separated list of template ids or aliases.
    fn from_str(s: &str) -> Result<Self, CheckpointPoolsError> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "off" | "none" => Ok(Self::Off),
            "" => Err(CheckpointPoolsError::Empty),
            list => Ok(Self::Only(
                list.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect(),
            )),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            pools: PoolConfig::default(),
            admission: AdmissionLimits::default(),
            envd_version: bulkhead_envd::ENVD_VERSION.into(),
            max_sandboxes: 1000,
            dead_retention: Duration::from_secs(3600),
            reap_interval: Duration::from_millis(250),
            metrics_interval: Duration::from_secs(5),
            sandbox_domain: None,
            network_default_allow: false,
            sandbox_env: BTreeMap::new(),
            audit_retention: Duration::from_secs(7 * 24 * 3600),
            volume_max_bytes: 1 << 30,
            sandbox_disk_mb: DEFAULT_SANDBOX_DISK_MB,
            checkpoint_dir: std::env::temp_dir().join("bulkhead-checkpoints"),
            paused_retention: Duration::from_secs(30 * 24 * 3600),
            checkpoint_pools: CheckpointPools::Auto,
            template_dir: None,
            image_cache: PathBuf::from("/var/cache/bulkhead/images"),
            build_limits: BuildLimits::default(),
            registry: Default::default(),
            metering: MeteringConfig::default(),
            replica: None,
        }
    }
}
