//! `bulkhead`: the server (`serve`), operator commands (`keys`, `template`) and a small client
//! (`sandbox`). The hidden `__jail-launch` subcommand is the jail driver's launcher: it must run
//! in a fresh single-threaded process, so it is dispatched before anything else starts.

mod bench;
mod client;
mod keys;
mod netargs;
mod sandbox;
mod secrets;
mod serve;
mod template;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bulkhead",
    version,
    about = "Self-hosted, E2B-compatible sandboxes for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the server keeps its state; shared by `serve`, `keys` and `template`.
#[derive(clap::Args, Clone, Debug)]
pub struct DataArgs {
    /// Data directory (database, sandboxes, images).
    #[arg(
        long,
        global = true,
        env = "BULKHEAD_DATA_DIR",
        default_value = "/var/lib/bulkhead"
    )]
    pub data_dir: PathBuf,
    /// Database URL (`sqlite:///path/db` or `postgres://…`); default: SQLite in the data dir.
    #[arg(long, global = true, env = "BULKHEAD_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Template image cache (content-addressed root filesystems); default: <data-dir>/images.
    #[arg(long, global = true, env = "BULKHEAD_IMAGE_CACHE")]
    pub image_cache: Option<PathBuf>,
}

impl DataArgs {
    pub fn image_cache(&self) -> PathBuf {
        self.image_cache
            .clone()
            .unwrap_or_else(|| self.data_dir.join("images"))
    }
    pub async fn open_store(&self) -> anyhow::Result<bulkhead_store::Store> {
        std::fs::create_dir_all(&self.data_dir)?;
        Ok(match &self.database_url {
            Some(url) => bulkhead_store::Store::open(url).await?,
            None => bulkhead_store::Store::open_sqlite_in(&self.data_dir).await?,
        })
    }
}

/// How to reach a running server (for `sandbox` and `bench`).
#[derive(clap::Args, Clone, Debug)]
pub struct ClientArgs {
    #[arg(
        long,
        global = true,
        env = "E2B_API_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    pub api_url: String,
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl ClientArgs {
    pub fn client(&self) -> anyhow::Result<client::Client> {
        let key = self.api_key.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "no API key: set E2B_API_KEY or pass --api-key (see `bulkhead keys create`)"
            )
        })?;
        client::Client::new(&self.api_url, key)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the API server with embedded defaults (SQLite, local images, jail driver).
    Serve(serve::ServeArgs),
    /// Manage API keys.
    Keys {
        #[command(flatten)]
        data: DataArgs,
        #[command(subcommand)]
        cmd: keys::KeysCmd,
    },
    /// Create, list, run commands in and kill sandboxes on a running server.
    Sandbox {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: sandbox::SandboxCmd,
    },
    /// Manage secrets for egress header injection (values are write-only).
    Secrets {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: secrets::SecretsCmd,
    },
    /// Build and list template images.
    Template {
        #[command(flatten)]
        data: DataArgs,
        #[command(subcommand)]
        cmd: template::TemplateCmd,
    },
    /// Measure create→first-command latency against a running server, with baselines.
    Bench(bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "__jail-launch")
    {
        bulkhead_jail::launcher::main();
    }
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Serve(args) => serve::run(args).await,
            Cmd::Keys { data, cmd } => keys::run(data, cmd).await,
            Cmd::Sandbox { client, cmd } => sandbox::run(client, cmd).await,
            Cmd::Secrets { client, cmd } => secrets::run(client, cmd).await,
            Cmd::Template { data, cmd } => template::run(data, cmd).await,
            Cmd::Bench(args) => bench::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
