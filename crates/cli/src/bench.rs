//! `bulkhead bench`: create→first-command latency through the HTTP API (sequential and a
//! concurrent burst), against baselines measured in the same run: the same command run bare on
//! the host and under bubblewrap over the same template rootfs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkhead_images::{ImageCache, TemplateRecipe};

use crate::args::ClientArgs;
use crate::bench_stats::{Stats, create_and_run};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
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
    /// `create` (create→first command, with host and bwrap baselines) or `persistence`
    /// (pause, resume, fork, create from a snapshot; against a cold create in the same run).
    #[arg(long, value_enum, default_value_t = Mode::Create)]
    mode: Mode,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Create,
    Persistence,
}

const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn time_process(mut c: std::process::Command) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let st = c.stdout(std::process::Stdio::null()).status()?;
    anyhow::ensure!(st.success(), "baseline command failed: {st}");
    Ok(t0.elapsed())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let client = Arc::new(args.client.client()?);
    if args.mode == Mode::Persistence {
        return crate::bench_persist::run(&client, args.n).await;
    }
    let rootfs = args.rootfs.clone().unwrap_or_else(|| {
        ImageCache::new(args.image_cache.clone()).rootfs_path(&TemplateRecipe::base())
    });
    println!(
        "bulkhead bench: command {:?}, {} sequential, burst {}",
        args.cmd, args.n, args.burst
    );

    // Baselines first (same run, same machine state).
    let mut host = Stats {
        name: "host: bare command".into(),
        samples: Vec::new(),
    };
    for _ in 0..args.n {
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
    if which("bwrap") && rootfs.exists() {
        for _ in 0..args.n {
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
    for _ in 0..args.n {
        let (d, id) = create_and_run(&client, &args.template, &args.cmd).await?;
        seq.samples.push(d);
        client
            .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await?;
    }

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
    println!("{}", burst.row(Some(&host)));
    Ok(ExitCode::SUCCESS)
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}
