//! `bulkhead serve`: everything on one machine with embedded defaults. This module only turns
//! flags and environment into a [`ServerConfig`], builds the templates (with progress output)
//! and prints; the bootstrap itself is `bulkhead_server`, shared with other front ends.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bulkhead_engine::{AdmissionLimits, PoolConfig, PoolLimits};
use bulkhead_server::{
    BuiltTemplate, DriverKind, KeyBootstrap, NetworkConfig, NetworkDefault, Prepared, Server,
    ServerConfig, TemplateSize, default_pools,
};

use bulkhead_cli::args::DataArgs;

/// `--driver`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverArg {
    Jail,
    Microvm,
}

impl DriverArg {
    fn kind(self) -> DriverKind {
        match self {
            DriverArg::Jail => DriverKind::Jail,
            DriverArg::Microvm => DriverKind::Microvm,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (HTTP/1.1 and h2c).
    #[arg(long, env = "BULKHEAD_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub data: DataArgs,
    /// Log level (error, warn, info, debug, trace) or a tracing filter.
    #[arg(long, env = "BULKHEAD_LOG", default_value = "info")]
    pub log_level: String,
    /// Log line format on stderr: `text` (for people) or `json` (one object per line, with
    /// the request's span fields such as `request_id`, for log pipelines).
    #[arg(long, env = "BULKHEAD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Warm sandboxes kept ready per template, fixed (the pools do not adapt to demand);
    /// `--pool` entries override it per template.
    #[arg(long, env = "BULKHEAD_POOL_SIZE")]
    pub pool_size: Option<usize>,
    /// Warm pool bounds of one template, `NAME=MIN..MAX` (or `NAME=N`, fixed); repeatable or
    /// comma-separated. The pool grows toward the template's recent create rate within them
    /// and shrinks back when idle. Default: every template 2..128, code-interpreter-v1 2..8.
    #[arg(long, env = "BULKHEAD_POOL", value_delimiter = ',', value_parser = parse_pool)]
    pub pool: Vec<(String, PoolLimits)>,
    /// Creates doing work at once; more wait their turn in arrival order.
    #[arg(long, env = "BULKHEAD_MAX_CONCURRENT_CREATES", default_value_t = 16)]
    pub max_concurrent_creates: usize,
    /// Creates waiting for a turn; one more is refused at once with a 429 (E2B's rate-limit
    /// error in the SDKs).
    #[arg(long, env = "BULKHEAD_MAX_QUEUED_CREATES", default_value_t = 1024)]
    pub max_queued_creates: usize,
    /// Which templates' warm pools are refilled by restoring a checkpoint of a warmed sandbox
    /// (kernels already running) instead of cold starts: `auto` (templates with Jupyter
    /// kernels, e.g. code-interpreter-v1; needs --criu), `off`, or a comma-separated list of
    /// template ids.
    #[arg(long, env = "BULKHEAD_POOL_CHECKPOINT", default_value = "auto")]
    pub pool_checkpoint: bulkhead_engine::CheckpointPools,
    /// Sandbox TTL when the client gives none, in seconds.
    #[arg(long, default_value_t = 300)]
    pub default_timeout: u64,
    /// Largest TTL a client may request, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    pub max_timeout: u64,
    /// Most sandboxes running at once.
    #[arg(long, env = "BULKHEAD_MAX_SANDBOXES", default_value_t = 500)]
    pub max_sandboxes: usize,
    /// Template builds one team may run at once; one more is refused with a 429. A build's
    /// sandbox also gets no more vCPUs or memory than the team's quotas allow its sandboxes.
    #[arg(
        long,
        env = "BULKHEAD_MAX_BUILDS_PER_TEAM",
        default_value_t = bulkhead_engine::BuildLimits::default().max_builds_per_team
    )]
    pub max_builds_per_team: usize,
    /// How long a paused sandbox is kept, in seconds (default 30 days); then its checkpoint
    /// and record are deleted.
    #[arg(long, env = "BULKHEAD_PAUSED_RETENTION", default_value_t = 30 * 24 * 3600)]
    pub paused_retention: u64,
    /// Per-sandbox cap on concurrently running processes started through the API.
    #[arg(long, env = "BULKHEAD_MAX_BACKGROUND_PROCESSES", default_value_t = 100)]
    pub max_background_processes: u32,
    /// Extra CA bundle to trust inside templates (e.g. a TLS-inspecting proxy's CA).
    #[arg(long, env = "BULKHEAD_EXTRA_CA_BUNDLE")]
    pub extra_ca_bundle: Option<std::path::PathBuf>,
    /// Memory limit of `base` sandboxes in MiB.
    #[arg(long, default_value_t = 512)]
    pub memory_mb: u64,
    /// First host uid of the sandboxes' uid ranges (65536 per slot). Servers sharing a host
    /// need disjoint ranges.
    #[arg(long, env = "BULKHEAD_UID_BASE", default_value_t = 1_000_000)]
    pub uid_base: u32,
    /// CPUs of `base` sandboxes.
    #[arg(long, default_value_t = 2)]
    pub cpu_count: u32,
    /// What runs the sandboxes: `jail` (Linux namespaces on this kernel) or `microvm` (a QEMU
    /// microVM each, with its own kernel; needs --guest-kernel; see docs/microvm.md).
    #[arg(long, env = "BULKHEAD_DRIVER", value_enum, default_value_t = DriverArg::Jail)]
    pub driver: DriverArg,
    /// A template run by another driver than --driver, `TEMPLATE=DRIVER` (e.g.
    /// `code-interpreter-v1=microvm`); repeatable or comma-separated.
    #[arg(long, env = "BULKHEAD_DRIVER_FOR", value_delimiter = ',', value_parser = parse_driver_for)]
    pub driver_for: Vec<(String, DriverArg)>,
    /// The microvm driver's guest kernel: `$(scripts/guest-kernel.sh)/bzImage`.
    #[arg(long, env = "BULKHEAD_GUEST_KERNEL")]
    pub guest_kernel: Option<std::path::PathBuf>,
    /// CRIU 4.2+ binary for pause, resume, snapshots and fork (`scripts/criu.sh` builds one
    /// and prints its path). Without it those answer with how to enable them.
    #[arg(long, env = "BULKHEAD_CRIU")]
    pub criu: Option<std::path::PathBuf>,
    /// Templates to build (if not cached) and serve, comma-separated. Built-in: base,
    /// code-interpreter-v1 (the E2B code-interpreter SDKs' default; its first build downloads
    /// about 300 MB and takes a few minutes). Leave it out for quick runs.
    #[arg(
        long,
        env = "BULKHEAD_TEMPLATES",
        value_delimiter = ',',
        default_value = "base,code-interpreter-v1"
    )]
    pub templates: Vec<String>,
    /// Memory limit of `code-interpreter-v1` sandboxes in MiB.
    #[arg(long, default_value_t = 1024)]
    pub code_interpreter_memory_mb: u64,
    /// CPUs of `code-interpreter-v1` sandboxes.
    #[arg(long, default_value_t = 2)]
    pub code_interpreter_cpu_count: u32,
    #[command(flatten)]
    pub network: crate::netargs::NetworkArgs,
    #[command(flatten)]
    pub registry: crate::registryargs::RegistryArgs,
    /// Size limit of every new volume in bytes (each volume is its own filesystem of this
    /// size; at least 16 MiB).
    #[arg(long, env = "BULKHEAD_VOLUME_MAX_BYTES", default_value_t = 1 << 30)]
    pub volume_max_bytes: u64,
    /// Every sandbox's disk in MiB (E2B's `diskSizeMB`): what it may write on top of its
    /// template, bytes and files (one per 16 KiB); a write beyond it fails with ENOSPC inside
    /// the sandbox. The host pays only for what is written.
    #[arg(
        long,
        env = "BULKHEAD_SANDBOX_DISK_MB",
        default_value_t = bulkhead_engine::DEFAULT_SANDBOX_DISK_MB
    )]
    pub sandbox_disk_mb: u64,
    /// Domain of the sandboxes' hosts: create and connect answer it as `domain`, so the SDKs'
    /// `get_host(port)` gives `{port}-{id}.{domain}`. Point wildcard DNS `*.{domain}` at a TLS
    /// proxy in front of this server (docs/domains.md).
    #[arg(long, env = "BULKHEAD_SANDBOX_DOMAIN")]
    pub sandbox_domain: Option<String>,
    #[command(flatten)]
    pub metering: MeteringArgs,
    #[command(flatten)]
    pub connections: ConnectionArgs,
}

/// Client connection caps and timeouts of the HTTP listener (docs/configure.md, "Client connections").
#[derive(clap::Args, Debug)]
pub struct ConnectionArgs {
    /// Most client connections open at once (the REST API and the sandbox proxy share them).
    /// Default: what the open-files limit leaves after the server's and its sandboxes'
    /// descriptors (the log says the figure at start).
    #[arg(long, env = "BULKHEAD_HTTP_MAX_CONNECTIONS")]
    pub http_max_connections: Option<usize>,
    /// Most connections from one source address; more are closed at once (0: no cap; raise
    /// it, or set 0, behind a reverse proxy that connects from one address).
    #[arg(
        long,
        env = "BULKHEAD_HTTP_MAX_CONNECTIONS_PER_IP",
        default_value_t = bulkhead_server::ConnectionLimits::default().max_per_ip
    )]
    pub http_max_connections_per_ip: usize,
    /// The last connection slots, kept for requests that are `/health`, carry a valid API key
    /// or go to a running sandbox (at most a quarter of the cap).
    #[arg(
        long,
        env = "BULKHEAD_HTTP_RESERVED_CONNECTIONS",
        default_value_t = bulkhead_server::ConnectionLimits::default().reserved
    )]
    pub http_reserved_connections: usize,
    /// Seconds a client has to send a request head, from connecting or from the end of the
    /// previous response (idle HTTP/1.1 keep-alive connections close after it).
    #[arg(
        long,
        env = "BULKHEAD_HTTP_HEADER_TIMEOUT",
        default_value_t = bulkhead_server::ConnectionLimits::default().header_timeout.as_secs()
    )]
    pub http_header_timeout: u64,
    /// Seconds a connection with no request in flight (an HTTP/2 connection without streams)
    /// stays open. A streamed response is never cut by either timeout.
    #[arg(
        long,
        env = "BULKHEAD_HTTP_IDLE_TIMEOUT",
        default_value_t = bulkhead_server::ConnectionLimits::default().idle_timeout.as_secs()
    )]
    pub http_idle_timeout: u64,
}

impl ConnectionArgs {
    fn limits(&self) -> bulkhead_server::ConnectionLimits {
        bulkhead_server::ConnectionLimits {
            max_connections: self.http_max_connections,
            max_per_ip: self.http_max_connections_per_ip,
            reserved: self.http_reserved_connections,
            header_timeout: Duration::from_secs(self.http_header_timeout),
            idle_timeout: Duration::from_secs(self.http_idle_timeout),
        }
    }
}

/// Usage metering and credits (docs/usage.md).
#[derive(clap::Args, Debug)]
pub struct MeteringArgs {
    /// How often each sandbox's usage is written to the store, in seconds (a crash loses at
    /// most one interval; credits are drawn at each).
    #[arg(long, env = "BULKHEAD_METERING_INTERVAL", default_value_t = 15.0)]
    pub metering_interval: f64,
    /// Credits per vCPU-hour of a running sandbox.
    #[arg(long, env = "BULKHEAD_PRICE_VCPU_HOUR", default_value_t = 0.0)]
    pub price_vcpu_hour: f64,
    /// Credits per GiB-hour of a running sandbox's memory limit.
    #[arg(long, env = "BULKHEAD_PRICE_GIB_HOUR", default_value_t = 0.0)]
    pub price_gib_hour: f64,
    /// Credits per GiB-hour of a paused sandbox's checkpoint on disk.
    #[arg(long, env = "BULKHEAD_PRICE_PAUSED_GIB_HOUR", default_value_t = 0.0)]
    pub price_paused_gib_hour: f64,
    /// Seconds a team's sandboxes keep running once its balance reached zero.
    #[arg(long, env = "BULKHEAD_CREDITS_GRACE", default_value_t = 60)]
    pub credits_grace: u64,
    /// What then happens to them: `pause` (kept, resumable after a top-up) or `kill`.
    #[arg(long, env = "BULKHEAD_CREDITS_EXHAUSTED", default_value = "pause")]
    pub credits_exhausted: bulkhead_engine::ExhaustedAction,
}

impl MeteringArgs {
    fn config(&self) -> bulkhead_engine::MeteringConfig {
        bulkhead_engine::MeteringConfig {
            // At least 100 ms: a zero interval would spin.
            interval: Duration::from_secs_f64(self.metering_interval.max(0.1)),
            prices: bulkhead_engine::Prices {
                vcpu_hour: self.price_vcpu_hour.max(0.0),
                gib_hour: self.price_gib_hour.max(0.0),
                paused_gib_hour: self.price_paused_gib_hour.max(0.0),
            },
            grace: Duration::from_secs(self.credits_grace),
            on_exhausted: self.credits_exhausted,
        }
    }
}

/// Why a `--driver-for` or `--pool` value was refused (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
enum FlagError {
    #[error("{spec:?}: expected TEMPLATE=DRIVER (e.g. base=microvm)")]
    DriverForShape { spec: String },
    #[error("{spec:?}: {driver:?} is not a driver (jail or microvm)")]
    NotADriver { spec: String, driver: String },
    #[error("{spec:?}: expected NAME=MIN..MAX (e.g. base=4..128) or NAME=N")]
    PoolShape { spec: String },
    #[error("{spec:?}: {value:?} is not a number of sandboxes")]
    NotACount {
        spec: String,
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

/// `TEMPLATE=DRIVER`.
fn parse_driver_for(s: &str) -> Result<(String, DriverArg), FlagError> {
    use clap::ValueEnum;
    let (template, driver) = s
        .split_once('=')
        .filter(|(t, _)| !t.trim().is_empty())
        .ok_or_else(|| FlagError::DriverForShape { spec: s.to_owned() })?;
    let driver = DriverArg::from_str(driver.trim(), true).map_err(|_| FlagError::NotADriver {
        spec: s.to_owned(),
        driver: driver.to_owned(),
    })?;
    Ok((template.trim().to_string(), driver))
}

/// `NAME=MIN..MAX` or `NAME=N`.
fn parse_pool(s: &str) -> Result<(String, PoolLimits), FlagError> {
    let (name, bounds) = s
        .split_once('=')
        .ok_or_else(|| FlagError::PoolShape { spec: s.to_owned() })?;
    let num = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|source| FlagError::NotACount {
                spec: s.to_owned(),
                value: v.to_owned(),
                source,
            })
    };
    let limits = match bounds.split_once("..") {
        Some((min, max)) => PoolLimits {
            min: num(min)?,
            max: num(max)?,
        },
        None => PoolLimits::fixed(num(bounds)?),
    };
    Ok((name.trim().to_string(), limits))
}

impl ServeArgs {
    /// Pool bounds: `--pool-size` (fixed for all) or the defaults, then the `--pool` entries.
    fn pools(&self) -> PoolConfig {
        let mut c = match self.pool_size {
            Some(n) => PoolConfig::fixed(n),
            None => default_pools(),
        };
        for (name, limits) in &self.pool {
            c.per_template.insert(name.clone(), *limits);
        }
        c
    }

    /// The server configuration these flags (and `BULKHEAD_API_KEY`) describe.
    pub(crate) fn config(&self) -> ServerConfig {
        let net = &self.network;
        ServerConfig {
            listen: self.listen,
            data_dir: self.data.data_dir.clone(),
            database_url: self.data.database_url.clone(),
            secrets_key_file: self.data.secrets_key_file.clone(),
            image_cache: self.data.image_cache.clone(),
            api_key: std::env::var("BULKHEAD_API_KEY").ok(),
            pools: self.pools(),
            admission: AdmissionLimits {
                max_concurrent: self.max_concurrent_creates,
                max_queued: self.max_queued_creates,
            },
            pool_checkpoint: self.pool_checkpoint.clone(),
            default_timeout: Duration::from_secs(self.default_timeout),
            max_timeout: Duration::from_secs(self.max_timeout),
            max_sandboxes: self.max_sandboxes,
            max_builds_per_team: self.max_builds_per_team,
            paused_retention: Duration::from_secs(self.paused_retention),
            max_background_processes: self.max_background_processes,
            extra_ca_bundle: self.extra_ca_bundle.clone(),
            uid_base: self.uid_base,
            criu: self.criu.clone(),
            base_size: TemplateSize {
                cpu_count: self.cpu_count,
                memory_mb: self.memory_mb,
            },
            code_interpreter_size: TemplateSize {
                cpu_count: self.code_interpreter_cpu_count,
                memory_mb: self.code_interpreter_memory_mb,
            },
            templates: self.templates.clone(),
            volume_max_bytes: self.volume_max_bytes,
            sandbox_disk_mb: self.sandbox_disk_mb,
            // Filled by `run` from `--registry-*`: reading the auth file can fail.
            registry: Default::default(),
            sandbox_domain: self.sandbox_domain.clone(),
            metering: self.metering.config(),
            driver: self.driver.kind(),
            driver_for: self
                .driver_for
                .iter()
                .map(|(t, d)| (t.clone(), d.kind()))
                .collect(),
            guest_kernel: self.guest_kernel.clone(),
            connections: self.connections.limits(),
            network: NetworkConfig {
                default: match net.network_default {
                    crate::netargs::NetworkDefault::Deny => NetworkDefault::Deny,
                    crate::netargs::NetworkDefault::Allow => NetworkDefault::Allow,
                },
                allow_private: net.egress_allow_private,
                sandbox_ca_bundle: net.sandbox_ca_bundle.clone(),
                upstream_ca: net.egress_upstream_ca.clone(),
                resolve: net.egress_resolve.clone(),
            },
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    run_as(args, None).await
}

/// A cluster's API replica: the join token and this replica's name (see `bulkhead api`).
pub(crate) struct Replica {
    pub(crate) token: String,
    pub(crate) name: String,
    /// The URL the other replicas forward requests to.
    pub(crate) advertise: String,
}

/// `serve`, or with `replica` an API replica of a cluster (the engine over the nodes in the
/// store instead of this machine's driver).
pub(crate) async fn run_as(args: ServeArgs, replica: Option<Replica>) -> anyhow::Result<ExitCode> {
    init_logging(&args.log_level, args.log_format);
    let mut config = args.config();
    config.registry = args.registry.config()?;
    let prepared = Server::prepare(config).await?;
    match &prepared.keys {
        KeyBootstrap::Seeded => eprintln!("Seeded the API key from BULKHEAD_API_KEY."),
        KeyBootstrap::Created(key) => {
            eprintln!(
                "\nCreated your API key (shown only once; `bulkhead keys create` makes more):\n\n    {key}\n"
            );
            eprintln!("Use it with the E2B SDKs:\n");
            eprintln!(
                "    export E2B_API_KEY={key} E2B_API_URL=http://{0} E2B_SANDBOX_URL=http://{0}\n",
                args.listen
            );
        }
        KeyBootstrap::Unchanged => {}
    }

    let templates = build_templates(&prepared).await?;
    let is_replica = replica.is_some();
    let server = match replica {
        None => prepared.start(templates).await?,
        Some(r) => {
            prepared
                .start_cluster(templates, r.token, r.name, r.advertise)
                .await?
        }
    };
    if server.readopted > 0 {
        eprintln!(
            "Re-adopted {} running sandbox(es) from the previous run.",
            server.readopted
        );
    }
    let listener = server.bind().await?;
    eprintln!("Listening on http://{}", listener.local_addr()?);
    let served = server.serve_http(listener, shutdown_signal()).await;
    if served.is_ok() && is_replica {
        eprintln!(
            "Shutting down; running sandboxes keep running and the other API replicas take them over."
        );
    } else if served.is_ok() {
        eprintln!(
            "Shutting down; running sandboxes keep running and are re-adopted on the next start."
        );
    }
    server.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Builds (or finds cached) the configured templates. Building stays in the front end: it
/// owns the progress display (a spinner on a terminal).
pub(crate) async fn build_templates(prepared: &Prepared) -> anyhow::Result<Vec<BuiltTemplate>> {
    let cache = prepared.image_cache();
    let mut templates = Vec::new();
    for recipe in prepared.recipes() {
        let rootfs = crate::template::ensure_built(&cache, &recipe).await?;
        templates.push(BuiltTemplate { recipe, rootfs });
    }
    Ok(templates)
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn init_logging(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .or_else(|_| tracing_subscriber::EnvFilter::try_new("info"))
        .expect("valid filter");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // The current span's fields (`request_id`, method, path) go in `span`, every
        // enclosing span's in `spans`.
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn driver_for_names_templates_and_drivers() {
        let cli = Cli::try_parse_from([
            "serve",
            "--driver-for",
            "code-interpreter-v1=microvm,base=jail",
        ])
        .unwrap();
        let c = cli.serve.config();
        assert_eq!(c.driver, DriverKind::Jail);
        assert_eq!(
            c.driver_for,
            [
                ("code-interpreter-v1".to_string(), DriverKind::Microvm),
                ("base".to_string(), DriverKind::Jail)
            ]
        );
        for bad in ["base", "=microvm", "base=kvm"] {
            let e = Cli::try_parse_from(["serve", "--driver-for", bad])
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains("TEMPLATE=DRIVER") || e.contains("jail or microvm"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_default_flags_make_a_valid_config() {
        let cli =
            Cli::try_parse_from(["serve", "--templates", "base", "--data-dir", "/d"]).unwrap();
        let c = cli.serve.config();
        c.validate().unwrap();
        assert_eq!(c.templates, ["base"]);
        assert_eq!(c.data_dir, std::path::PathBuf::from("/d"));
        // `BULKHEAD_IMAGE_CACHE` (set by scripts/test.sh) is a flag default too.
        let cache = std::env::var_os("BULKHEAD_IMAGE_CACHE")
            .map_or_else(|| std::path::PathBuf::from("/d/images"), Into::into);
        assert_eq!(c.image_cache_dir(), cache);
        assert_eq!(c.default_timeout, Duration::from_secs(300));
        assert_eq!(c.max_timeout, Duration::from_secs(24 * 3600));
        assert_eq!(
            c.size_of("base"),
            TemplateSize {
                cpu_count: 2,
                memory_mb: 512
            }
        );
        assert_eq!(
            c.size_of("code-interpreter-v1"),
            TemplateSize {
                cpu_count: 2,
                memory_mb: 1024
            }
        );
        assert_eq!(c.network.default, NetworkDefault::Deny);
        assert_eq!(c.pools, default_pools());
        assert_eq!(c.admission.max_concurrent, 16);
    }

    #[test]
    fn pool_flags_set_bounds_per_template_and_pool_size_fixes_the_rest() {
        let cli = Cli::try_parse_from([
            "serve",
            "--pool-size",
            "3",
            "--pool",
            "base=4..64",
            "--pool",
            "code-interpreter-v1=1",
        ])
        .unwrap();
        let c = cli.serve.config();
        assert_eq!(c.pools.limits("base"), PoolLimits { min: 4, max: 64 });
        assert_eq!(c.pools.limits("code-interpreter-v1"), PoolLimits::fixed(1));
        assert_eq!(c.pools.limits("other"), PoolLimits::fixed(3));
        let bad = Cli::try_parse_from(["serve", "--pool", "base=4-8"]);
        assert!(bad.is_err());
        let cli =
            Cli::try_parse_from(["serve", "--templates", "base", "--pool", "base=9..3"]).unwrap();
        let e = cli.serve.config().validate().unwrap_err().to_string();
        assert!(e.contains("minimum is above the maximum"), "{e}");
    }

    #[test]
    fn flag_errors_say_what_shape_is_expected() {
        let pool = |s| parse_pool(s).unwrap_err().to_string();
        assert_eq!(
            pool("base"),
            r#""base": expected NAME=MIN..MAX (e.g. base=4..128) or NAME=N"#
        );
        assert_eq!(
            pool("base=4-8"),
            r#""base=4-8": "4-8" is not a number of sandboxes"#
        );
        let driver = |s| parse_driver_for(s).unwrap_err().to_string();
        assert_eq!(
            driver("=jail"),
            r#""=jail": expected TEMPLATE=DRIVER (e.g. base=microvm)"#
        );
        assert_eq!(
            driver("base= kvm"),
            r#""base= kvm": " kvm" is not a driver (jail or microvm)"#
        );
    }

    #[test]
    fn bad_flags_are_refused_before_anything_starts() {
        let cli = Cli::try_parse_from(["serve", "--templates", "nope"]).unwrap();
        let e = cli.serve.config().validate().unwrap_err().to_string();
        assert!(e.starts_with("unknown template \"nope\""), "{e}");
    }
}
