//! The cluster roles: `bulkhead api` (an API replica: the REST API and the engine over the
//! nodes registered in the shared store) and `bulkhead node` (this machine's sandboxes, served
//! to the replicas over `bulkhead.node.v1`). Both take `serve`'s flags; both need the shared
//! store (`--database-url postgres://…`) and the join secret `BULKHEAD_NODE_TOKEN`.

use std::process::ExitCode;

use bulkhead_server::{NodeSettings, Server};

use crate::serve::{Replica, ServeArgs, build_templates, init_logging, run_as, shutdown_signal};

#[derive(clap::Args, Debug)]
pub struct ApiArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// This replica's name in the health sweep's lease (default: host name and process id).
    #[arg(long, env = "BULKHEAD_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// The cluster's join secret (the same on every api and node).
    #[arg(
        long = "node-token",
        env = "BULKHEAD_NODE_TOKEN",
        hide_env_values = true
    )]
    pub token: String,
}

#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// This node's name, stable across restarts (E2B's `clientID` of its sandboxes).
    #[arg(long, env = "BULKHEAD_NODE_ID")]
    pub node_id: String,
    /// The URL the API replicas call this node at; default: `http://` and --listen.
    #[arg(long, env = "BULKHEAD_NODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// The cluster's join secret (the same on every api and node).
    #[arg(
        long = "node-token",
        env = "BULKHEAD_NODE_TOKEN",
        hide_env_values = true
    )]
    pub token: String,
}

pub async fn run_api(args: ApiArgs) -> anyhow::Result<ExitCode> {
    let name = args.replica_id.unwrap_or_else(|| {
        // A restarted replica is a new lease holder: the start time is part of the name.
        format!(
            "{}-{}-{}",
            hostname(),
            std::process::id(),
            chrono::Utc::now().timestamp_millis()
        )
    });
    run_as(
        args.serve,
        Some(Replica {
            token: args.token,
            name,
        }),
    )
    .await
}

pub async fn run_node(args: NodeArgs) -> anyhow::Result<ExitCode> {
    init_logging(&args.serve.log_level, args.serve.log_format);
    let mut config = args.serve.config();
    config.registry = args.serve.registry.config()?;
    let advertise = args
        .advertise
        .unwrap_or_else(|| format!("http://{}", args.serve.listen));
    let prepared = Server::prepare_node(config).await?;
    let templates = build_templates(&prepared).await?;
    let node = prepared
        .start_node(
            templates,
            NodeSettings {
                node_id: args.node_id.clone(),
                advertise: advertise.clone(),
                token: args.token,
            },
        )
        .await?;
    let listener = node.bind().await?;
    eprintln!(
        "Node {} serving bulkhead.node.v1 on http://{} (advertised as {advertise})",
        args.node_id,
        listener.local_addr()?
    );
    let served = node.serve(listener, shutdown_signal()).await;
    node.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "bulkhead".into())
}
