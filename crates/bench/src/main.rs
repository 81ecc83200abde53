//! `bulkhead-bench`: create→first-command latency through the HTTP API of a running server
//! (sequential and a concurrent burst), against baselines measured in the same run: the same
//! command run bare on the host and under bubblewrap over the same template rootfs. With
//! `--mode persistence`: pause, resume, fork and create-from-snapshot ([`persist`]). With
//! `--mode cluster`: the control plane's scaling over fake nodes, in process ([`cluster`]).
//!
//! A measuring tool, not part of the product: it ships apart from the `bulkhead` binary and
//! talks to the server only through its HTTP API (the client of `bulkhead_cli`), except in
//! `--mode cluster`, which runs the engine itself.

mod cluster;
mod cpu;
mod persist;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkhead_cli::args::ClientArgs;
use bulkhead_images::{ImageCache, TemplateRecipe};
use clap::Parser;

use crate::cpu::{CpuPerCreate, CpuProbe, CpuSample};
use crate::stats::{Split, Stats, create_and_run, create_and_run_split};

/// Measure create→first-command latency (or, with `--mode persistence`, pause, resume, fork
/// and snapshot restores) against a running server, with baselines.
#[derive(Parser, Debug)]
#[command(name = "bulkhead-bench", version)]
struct BenchArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Sequential create→first-command iterations.
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// Concurrent creates in the burst.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// Command (argv, run without a shell).
    #[arg(long, num_args = 1.., default_values_t = ["python3".to_string(), "-c".to_string(), "print(1)".to_string()])]
    cmd: Vec<String>,
    /// Template rootfs for the bwrap baseline; default: the cached `base` image.
    #[arg(long)]
    rootfs: Option<PathBuf>,
    #[arg(
        long,
        env = "BULKHEAD_IMAGE_CACHE",
        default_value = "/var/lib/bulkhead/images"
    )]
    image_cache: PathBuf,
    #[arg(long, default_value = "base")]
    template: String,
    /// `create` (create→first command, with host and bwrap baselines), `persistence`
    /// (pause, resume, fork, create from a snapshot; against a cold create in the same run) or
    /// `cluster` (the control plane over fake nodes, in this process; no server needed).
    #[arg(long, value_enum, default_value_t = Mode::Create)]
    mode: Mode,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Pid of the server, for the CPU-per-create breakdown; default: the process listening on
    /// the API URL's port (the server must run on this machine).
    #[arg(long)]
    server_pid: Option<i32>,
    /// Skip the host and bwrap baselines.
    #[arg(long)]
    no_baselines: bool,
    /// Idle time between sequential iterations (not measured), like a user creating a sandbox
    /// now and then; 0: back to back.
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Create,
    Persistence,
    Cluster,
}

/// The flags of `--mode cluster`.
#[derive(clap::Args, Debug)]
struct ClusterArgs {
    /// Nodes of the larger cluster, measured against 1.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Offered creates per second (Poisson arrivals). A node absorbs max-starting ÷ start
    /// time (60/s with the defaults); with random arrivals a cluster reaches that only when
    /// offered several times more (a create arriving while every slot starts is refused), so
    /// the default is 10× one node and 3.3× three.
    #[arg(long, default_value_t = 600.0)]
    rate: f64,
    /// How long creates arrive, on each cluster size.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// How long a fake node's start takes (a sleep, no CPU).
    #[arg(long, default_value_t = 50)]
    start_ms: u64,
    /// Starts a fake node runs at once; one more is refused for capacity.
    #[arg(long, default_value_t = 3)]
    max_starting: u32,
    /// Creates held on the equal nodes to measure the spread.
    #[arg(long, default_value_t = 300)]
    spread: usize,
    /// Creates with one node draining, and again with one node full.
    #[arg(long, default_value_t = 60)]
    probes: usize,
    /// PostgreSQL URL for the store; default: SQLite in a temporary directory.
    #[arg(long, env = "BULKHEAD_DATABASE_URL")]
    database_url: Option<String>,
    /// Exit non-zero when a target is missed.
    #[arg(long)]
    check: bool,
}

const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn time_process(mut c: std::process::Command) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let st = c.stdout(std::process::Stdio::null()).status()?;
    anyhow::ensure!(st.success(), "baseline command failed: {st}");
    Ok(t0.elapsed())
}

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if args.mode == Mode::Cluster {
        let c = &args.cluster;
        anyhow::ensure!(
            c.seconds.is_finite() && c.seconds > 0.0,
            "--seconds must be positive"
        );
        let cfg = cluster::Config {
            nodes: c.nodes,
            start: Duration::from_millis(c.start_ms),
            max_starting: c.max_starting,
            rate: c.rate,
            duration: Duration::from_secs_f64(c.seconds),
            spread: c.spread,
            probes: c.probes,
            database_url: c.database_url.clone(),
        };
        return cluster::run(cfg, c.check).await;
    }
    let client = Arc::new(args.client.client()?);
    if args.mode == Mode::Persistence {
        return persist::run(&client, args.n).await;
    }
    let rootfs = args.rootfs.clone().unwrap_or_else(|| {
        ImageCache::new(args.image_cache.clone()).rootfs_path(&TemplateRecipe::base())
    });
    println!(
        "bulkhead bench: command {:?}, {} sequential ({} ms apart), burst {}",
        args.cmd, args.n, args.gap_ms, args.burst
    );

    // Baselines first (same run, same machine state).
    let mut host = Stats {
        name: "host: bare command".into(),
        samples: Vec::new(),
    };
    let baselines = if args.no_baselines { 0 } else { args.n };
    for _ in 0..baselines.max(1) {
        let mut c = std::process::Command::new(&args.cmd[0]);
        // Same PATH as inside the sandbox, so a bare name runs the distribution's binary (not,
        // say, a version-manager shim).
        c.args(&args.cmd[1..]).env("PATH", SANDBOX_PATH);
        host.samples.push(time_process(c)?);
    }
    let mut bwrap = Stats {
        name: "bwrap: --unshare-all over template rootfs".into(),
        samples: Vec::new(),
    };
    if baselines > 0 && which("bwrap") && rootfs.exists() {
        for _ in 0..baselines {
            let mut c = std::process::Command::new("bwrap");
            c.args([
                "--unshare-all",
                "--unshare-user",
                "--uid",
                "0",
                "--gid",
                "0",
                "--die-with-parent",
                "--new-session",
            ])
            .args(["--cap-drop", "ALL", "--ro-bind"])
            .arg(&rootfs)
            .args([
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
                "--clearenv",
            ])
            .args(["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"])
            .args(&args.cmd);
            bwrap.samples.push(time_process(c)?);
        }
    } else {
        println!("(bwrap baseline skipped: install bubblewrap and build the base template)");
    }

    let mut seq = Stats {
        name: "bulkhead: create→first command (sequential)".into(),
        samples: Vec::new(),
    };
    let mut probe = match CpuProbe::new(args.server_pid, client.host_port()) {
        Ok(p) => Some(p),
        Err(e) => {
            println!("(CPU per create skipped: {e:#})");
            None
        }
    };
    // One warm-up create: its sandbox shows where the server's sandbox cgroups are.
    let (_, id) = create_and_run(&client, &args.template, &args.cmd).await?;
    if let Some(p) = probe.as_mut() {
        p.find_sandbox_cgroup();
        if !p.has_sandbox_cgroup() {
            println!("(sandbox cgroups not found: their CPU counts as the rest)");
        }
    }
    client
        .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await?;
    let before = match &probe {
        Some(p) => Some(settle(p).await?),
        None => None,
    };
    let mut splits = Vec::new();
    for _ in 0..args.n {
        if args.gap_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
        }
        let (split, id) = create_and_run_split(&client, &args.template, &args.cmd).await?;
        seq.samples.push(split.total());
        splits.push(split);
        client
            .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await?;
    }
    // Includes the pool refills the claims triggered: they are part of what a create costs.
    let cpu = match (&probe, before) {
        (Some(p), Some(a)) => Some(CpuPerCreate::between(&a, &settle(p).await?, args.n)),
        _ => None,
    };

    let mut burst = Stats {
        name: format!("bulkhead: create→first command (burst {})", args.burst),
        samples: Vec::new(),
    };
    let mut tasks = Vec::new();
    for _ in 0..args.burst {
        let client = client.clone();
        let template = args.template.clone();
        let cmd = args.cmd.clone();
        tasks.push(tokio::spawn(async move {
            create_and_run(&client, &template, &cmd).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        let (d, id) = t.await??;
        burst.samples.push(d);
        ids.push(id);
    }
    for id in ids {
        client
            .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await?;
    }

    println!("{}", host.row(None));
    if !bwrap.samples.is_empty() {
        println!("{}", bwrap.row(Some(&host)));
    }
    println!("{}", seq.row(Some(&host)));
    if !bwrap.samples.is_empty() {
        println!("{}", seq.row(Some(&bwrap)));
    }
    if !burst.samples.is_empty() {
        println!("{}", burst.row(Some(&host)));
    }
    println!(
        "sequential tail: p99/p50 = {:.2}, p95/p50 = {:.2}",
        seq.pct(99.0) / seq.pct(50.0),
        seq.pct(95.0) / seq.pct(50.0)
    );
    println!("{}", slowest(&splits, 5));
    if let (Some(cpu), Some(p)) = (cpu, &probe) {
        println!(
            "{}",
            cpu.rows(&format!(
                "sequential, {} creates + kills, server pid {}",
                args.n,
                p.server_pid()
            ))
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The `k` slowest iterations, split into create and first command, against the medians.
fn slowest(splits: &[Split], k: usize) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = |f: &dyn Fn(&Split) -> f64| {
        let mut v: Vec<f64> = splits.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let mut order: Vec<(usize, &Split)> = splits.iter().enumerate().collect();
    order.sort_by_key(|(_, s)| std::cmp::Reverse(s.total()));
    let rows: Vec<String> = order
        .iter()
        .take(k)
        .map(|(i, s)| {
            format!(
                "#{i}: create {:.2} + command {:.2}",
                ms(s.create),
                ms(s.command)
            )
        })
        .collect();
    format!(
        "slowest iterations (ms; medians: create {:.2}, command {:.2}): {}",
        median(&|s| ms(s.create)),
        median(&|s| ms(s.command)),
        rows.join(", ")
    )
}

/// Wait until the server and its sandboxes stop spending CPU (a pool refill done), at most
/// 10 s, and sample then.
async fn settle(p: &CpuProbe) -> anyhow::Result<CpuSample> {
    let mut last = p.sample()?;
    let mut quiet = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = p.sample()?;
        if now.server_activity() == last.server_activity() {
            quiet += 1;
            if quiet == 2 {
                return Ok(now);
            }
        } else {
            quiet = 0;
        }
        last = now;
    }
    Ok(last)
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}
