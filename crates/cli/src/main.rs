//! `bulkhead`: the server (`serve`), operator commands (`keys`, `teams`, `usage`, `template`) and a small client
//! (`sandbox`). The hidden `__jail-launch` subcommand is the jail driver's launcher: it must run
//! in a fresh single-threaded process, so it is dispatched before anything else starts.

mod cluster;
mod doctor;
mod keys;
mod mcp;
mod netargs;
mod registryargs;
mod sandbox;
mod secrets;
mod serve;
mod teams;
mod template;

use clap::{Parser, Subcommand};

use bulkhead_cli::args::{ClientArgs, DataArgs};

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

#[derive(Subcommand)]
enum Cmd {
    /// Start the API server with embedded defaults (SQLite, local images, jail driver).
    Serve(Box<serve::ServeArgs>),
    /// A cluster's API replica: the REST API over the nodes registered in the shared store
    /// (`--database-url postgres://…`, `BULKHEAD_NODE_TOKEN`).
    Api(Box<cluster::ApiArgs>),
    /// A cluster node: this machine's sandboxes, served to the API replicas.
    Node(Box<cluster::NodeCommand>),
    /// Manage API keys.
    Keys {
        #[command(flatten)]
        data: DataArgs,
        #[command(subcommand)]
        cmd: keys::KeysCmd,
    },
    /// Manage teams: credits and quotas (keys belong to a team).
    Teams {
        #[command(flatten)]
        data: DataArgs,
        #[command(subcommand)]
        cmd: teams::TeamsCmd,
    },
    /// Metered usage (vCPU, memory and storage seconds, cost) per sandbox.
    Usage(teams::UsageArgs),
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
    /// Which drivers this host can run (jail, microvm with KVM or TCG), and why not.
    Doctor(doctor::DoctorArgs),
    /// Serve MCP on stdin/stdout for local agent clients, relayed to a running server.
    Mcp(mcp::McpArgs),
    /// Print the REST API's OpenAPI document (what `GET /openapi.json` serves; checked in as
    /// docs/openapi.json: `bulkhead openapi > docs/openapi.json`).
    Openapi,
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
            Cmd::Serve(args) => serve::run(*args).await,
            Cmd::Api(args) => cluster::run_api(*args).await,
            Cmd::Node(args) => cluster::run_node_command(*args).await,
            Cmd::Keys { data, cmd } => keys::run(data, cmd).await,
            Cmd::Teams { data, cmd } => teams::run(data, cmd).await,
            Cmd::Usage(args) => teams::usage(args).await,
            Cmd::Sandbox { client, cmd } => sandbox::run(client, cmd).await,
            Cmd::Secrets { client, cmd } => secrets::run(client, cmd).await,
            Cmd::Template { data, cmd } => template::run(data, cmd).await,
            Cmd::Doctor(args) => doctor::run(args),
            Cmd::Mcp(args) => mcp::run(args).await,
            Cmd::Openapi => {
                print!("{}", bulkhead_api::openapi_json());
                Ok(std::process::ExitCode::SUCCESS)
            }
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
