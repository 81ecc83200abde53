//! `bulkhead serve`: everything on one machine with embedded defaults.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bulkhead_engine::{Engine, EngineConfig, TemplateInfo};
use bulkhead_images::ImageCache;
use bulkhead_jail::{JailConfig, JailDriver};

use crate::args::DataArgs;

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
    /// Warm sandboxes kept ready per template.
    #[arg(long, env = "BULKHEAD_POOL_SIZE", default_value_t = 2)]
    pub pool_size: usize,
    /// Sandbox TTL when the client gives none, in seconds.
    #[arg(long, default_value_t = 300)]
    pub default_timeout: u64,
    /// Largest TTL a client may request, in seconds.
    #[arg(long, default_value_t = 24 * 3600)]
    pub max_timeout: u64,
    /// Most sandboxes running at once.
    #[arg(long, env = "BULKHEAD_MAX_SANDBOXES", default_value_t = 500)]
    pub max_sandboxes: usize,
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
}

pub async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging(&args.log_level);
    if !nix_is_root() {
        anyhow::bail!(
            "bulkhead serve must run as root (it creates namespaces, mounts and cgroups); try: sudo bulkhead serve"
        );
    }
    std::fs::create_dir_all(&args.data.data_dir)
        .with_context(|| format!("cannot create data dir {}", args.data.data_dir.display()))?;
    let store = args.data.open_store().await?;
    tracing::info!(backend = store.backend(), "store ready");

    // Keys first, so a new user sees their key even if the image build takes a while.
    if let Ok(key) = std::env::var("BULKHEAD_API_KEY") {
        if bulkhead_engine::keys::seed(&store, key.trim(), "BULKHEAD_API_KEY").await? {
            eprintln!("Seeded the API key from BULKHEAD_API_KEY.");
        }
    } else if store.count_active_api_keys().await? == 0 {
        let (_, key) = bulkhead_engine::keys::create(&store, "default").await?;
        eprintln!(
            "\nCreated your API key (shown only once; `bulkhead keys create` makes more):\n\n    {key}\n"
        );
        eprintln!("Use it with the E2B SDKs:\n");
        eprintln!(
            "    export E2B_API_KEY={key} E2B_API_URL=http://{0} E2B_SANDBOX_URL=http://{0}\n",
            args.listen
        );
    }

    let cache = ImageCache::new(args.data.image_cache()).install_missing_tools(true);
    let mut templates = Vec::new();
    for mut recipe in crate::template::selected(&args.templates)? {
        recipe.extra_ca_bundle = args.extra_ca_bundle.clone();
        let rootfs = crate::template::ensure_built(&cache, &recipe).await?;
        let (cpu_count, memory_mb) = if recipe.id == bulkhead_images::CODE_INTERPRETER_ID {
            (
                args.code_interpreter_cpu_count,
                args.code_interpreter_memory_mb,
            )
        } else {
            (args.cpu_count, args.memory_mb)
        };
        templates.push(TemplateInfo {
            id: recipe.id.clone(),
            aliases: Vec::new(),
            rootfs,
            content_hash: recipe.content_hash(),
            cpu_count,
            memory_mb,
            disk_size_mb: 4096,
            pids_max: 1024,
        });
    }

    let exe = std::env::current_exe().context("cannot find the bulkhead executable")?;
    let agent = exe.with_file_name("bulkhead-agent");
    if !agent.exists() {
        anyhow::bail!(
            "the sandbox agent binary is missing at {}: build it with `cargo build -p bulkhead-agent` (same profile as bulkhead)",
            agent.display()
        );
    }
    let net = crate::netargs::setup(&args.network, &args.data.data_dir, &store)?;
    let driver = JailDriver::new(JailConfig {
        state_dir: args.data.data_dir.join("jail"),
        agent_binary: agent,
        launcher: vec![exe.into_os_string(), "__jail-launch".into()],
        agent_args: vec![
            "--max-background-processes".into(),
            args.max_background_processes.to_string(),
        ],
        uid_base: args.uid_base,
        max_slots: (args.max_sandboxes + args.pool_size * 4 + 8) as u32,
        cgroup_parent: cgroup_parent(&args.data.data_dir),
        start_timeout: Duration::from_secs(10),
        sandbox_ca_pem: Some(net.sandbox_ca_pem.clone()),
        nameserver: Some(bulkhead_egress::GATEWAY_ADDR),
    })
    .context("cannot initialise the jail driver")?;

    let driver = Arc::new(driver);
    let engine = Engine::new(
        store,
        driver.clone(),
        EngineConfig {
            default_timeout: Duration::from_secs(args.default_timeout),
            max_timeout: Duration::from_secs(args.max_timeout),
            pool_size: args.pool_size,
            max_sandboxes: args.max_sandboxes,
            network_default_allow: net.default_allow,
            sandbox_env: net.sandbox_env.clone(),
            ..EngineConfig::default()
        },
    );
    engine.set_egress(net.egress.clone(), Some(net.audit.clone()));
    for template in templates {
        engine.register_template(template).await?;
    }
    let adopted = engine.recover().await?;
    if adopted > 0 {
        eprintln!("Re-adopted {adopted} running sandbox(es) from the previous run.");
    }
    engine.start_background();
    // Idmapped template views are kept per slot for fast starts; drop the unused ones now and
    // then so replaced templates do not stay mounted.
    let pruner = driver.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1800));
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Err(e) = pruner.prune_lowers() {
                tracing::warn!(error = %e, "pruning idmapped template views failed");
            }
        }
    });

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (is another server running?)",
                args.listen
            )
        })?;
    let app = bulkhead_api::router(engine.clone());
    eprintln!("Listening on http://{}", listener.local_addr()?);
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = stop.clone();
    // Streamed responses (command output, /execute lines) are many small writes; with Nagle on,
    // each waits for the client's delayed ACK (~40 ms per round trip).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a client connection");
        }
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        stopping.notify_waiters();
    });
    // Long-lived streams (a background command's output, a watch) would hold a graceful
    // shutdown open forever: give in-flight requests a moment, then close the rest. Processes
    // inside sandboxes keep running; clients reconnect after the restart.
    tokio::select! {
        r = server => r.context("server failed")?,
        _ = async {
            stop.notified().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        } => tracing::info!("closing the remaining client streams"),
    }
    eprintln!(
        "Shutting down; running sandboxes keep running and are re-adopted on the next start."
    );
    engine.shutdown().await;
    if let Err(e) = driver.prune_lowers() {
        tracing::warn!(error = %e, "pruning idmapped template views failed");
    }
    driver.release_cgroup_parent();
    Ok(ExitCode::SUCCESS)
}

/// `bulkhead/<instance>`: each data dir gets its own cgroup subtree, so a server reclaiming
/// leftovers never touches another server's sandboxes on the same host.
fn cgroup_parent(data_dir: &std::path::Path) -> String {
    use sha2::Digest;
    let canonical = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    format!("bulkhead/{}", &hex::encode(digest)[..8])
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .or_else(|_| tracing_subscriber::EnvFilter::try_new("info"))
        .expect("valid filter");
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
