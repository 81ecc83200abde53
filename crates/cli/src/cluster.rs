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
    /// This replica's name in the replicas table and the health sweep's lease (default: host
    /// name, process id and start time).
    #[arg(long, env = "BULKHEAD_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// The URL the other API replicas forward requests for this one's sandboxes to; default:
    /// `http://` and --listen.
    #[arg(long, env = "BULKHEAD_API_ADVERTISE")]
    pub advertise: Option<String>,
    /// The cluster's join secret (the same on every api and node).
    #[arg(
        long = "node-token",
        env = "BULKHEAD_NODE_TOKEN",
        hide_env_values = true
    )]
    pub token: String,
}

/// `bulkhead node [FLAGS]` runs a node; `bulkhead node drain …` drains one.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeCommand {
    #[command(subcommand)]
    pub cmd: Option<NodeCmd>,
    #[command(flatten)]
    pub run: NodeArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum NodeCmd {
    /// Drain a node: no new sandboxes there, and the API replicas pause what runs on it (each
    /// resumes on its next request once the node is back). The node keeps running; stop it
    /// (SIGTERM drains too) or roll it afterwards. `--cancel` takes sandboxes there again.
    Drain(DrainArgs),
}

#[derive(clap::Args, Debug)]
pub struct DrainArgs {
    /// The node's --node-id.
    pub node_id: String,
    /// The cluster's database (`postgres://…`).
    #[arg(long, env = "BULKHEAD_DATABASE_URL")]
    pub database_url: String,
    /// Wait until nothing runs on the node, showing progress.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this many seconds (exit status 1).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Take sandboxes there again (a restarted node takes them anyway).
    #[arg(long, conflicts_with = "wait")]
    pub cancel: bool,
}

#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// This node's name, stable across restarts (E2B's `clientID` of its sandboxes).
    // Required unless a subcommand is given (`Option` only so that `node drain` parses).
    #[arg(long, env = "BULKHEAD_NODE_ID", required = true)]
    pub node_id: Option<String>,
    /// The URL the API replicas call this node at; default: `http://` and --listen.
    #[arg(long, env = "BULKHEAD_NODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// How long past its deadline a sandbox may run before this node stops it itself (when no
    /// API replica ended it), in seconds.
    #[arg(long, env = "BULKHEAD_DEADLINE_GRACE", default_value_t = 30)]
    pub deadline_grace: u64,
    /// On SIGTERM, how long to wait (seconds) for the sandboxes here to be paused or to end
    /// before stopping anyway (they keep running; see docs/cluster.md).
    #[arg(long, env = "BULKHEAD_DRAIN_TIMEOUT", default_value_t = 300)]
    pub drain_timeout: u64,
    /// The cluster's join secret (the same on every api and node).
    #[arg(
        long = "node-token",
        env = "BULKHEAD_NODE_TOKEN",
        required = true,
        hide_env_values = true
    )]
    pub token: Option<String>,
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
    let advertise = args
        .advertise
        .unwrap_or_else(|| format!("http://{}", args.serve.listen));
    run_as(
        args.serve,
        Some(Replica {
            token: args.token,
            name,
            advertise,
        }),
    )
    .await
}

pub async fn run_node_command(cmd: NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd.cmd {
        Some(NodeCmd::Drain(args)) => drain(args).await,
        None => run_node(cmd.run).await,
    }
}

/// `bulkhead node drain`: asks through the store; with --wait, follows it there.
async fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let store = bulkhead_store::Store::open(&args.database_url).await?;
    if !store.set_node_drain(&args.node_id, !args.cancel).await? {
        anyhow::bail!(
            "no node {:?} is registered in this database; `bulkhead node` registers it at its start",
            args.node_id
        );
    }
    if args.cancel {
        eprintln!("Node {} takes sandboxes again.", args.node_id);
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "Node {} is draining: no new sandboxes; the API replicas pause what runs there.",
        args.node_id
    );
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let timeout = std::time::Duration::from_secs(args.timeout);
    let drained = bulkhead_server::wait_until_empty(&store, &args.node_id, timeout, |running| {
        eprintln!("  {running} sandbox(es) still running on {}", args.node_id)
    })
    .await;
    match drained {
        bulkhead_server::Drained::Empty => {
            eprintln!("Node {} is drained: nothing runs there.", args.node_id);
            Ok(ExitCode::SUCCESS)
        }
        bulkhead_server::Drained::TimedOut { running } => {
            eprintln!(
                "Gave up after {} s: {running} sandbox(es) still run on {} (ones that cannot be paused end at their timeout).",
                args.timeout, args.node_id
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn run_node(args: NodeArgs) -> anyhow::Result<ExitCode> {
    // The parser requires both when no subcommand is given.
    let (Some(node_id), Some(token)) = (args.node_id.clone(), args.token.clone()) else {
        anyhow::bail!("`bulkhead node` needs --node-id and --node-token (or BULKHEAD_NODE_TOKEN)");
    };
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
                node_id: node_id.clone(),
                advertise: advertise.clone(),
                token,
                deadline_grace: std::time::Duration::from_secs(args.deadline_grace),
            },
        )
        .await?;
    let listener = node.bind().await?;
    eprintln!(
        "Node {} serving bulkhead.node.v1 on http://{} (advertised as {advertise})",
        node_id,
        listener.local_addr()?
    );
    // SIGTERM drains first (no new sandboxes, what runs is paused by the API replicas); a
    // second signal stops at once.
    let drainer = node.drainer();
    let timeout = std::time::Duration::from_secs(args.drain_timeout);
    let stop = async move {
        shutdown_signal().await;
        eprintln!("Draining (a second signal stops at once)…");
        tokio::select! {
            drained = drainer.drain(timeout) => match drained {
                bulkhead_server::Drained::Empty => eprintln!("Drained."),
                bulkhead_server::Drained::TimedOut { running } => eprintln!(
                    "Drain timed out with {running} sandbox(es) running; they keep running."
                ),
            },
            () = shutdown_signal() => eprintln!("Stopping without waiting."),
        }
    };
    let served = node.serve(listener, stop).await;
    node.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "bulkhead".into())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct NodeCli {
        #[command(flatten)]
        node: NodeCommand,
    }

    #[derive(Parser)]
    struct ApiCli {
        #[command(flatten)]
        api: ApiArgs,
    }

    #[test]
    fn the_roles_take_serve_s_flags_and_name_what_a_cluster_needs() {
        let n = NodeCli::try_parse_from([
            "node",
            "--node-id",
            "n1",
            "--node-token",
            "s3cret",
            "--listen",
            "10.0.0.11:7001",
            "--database-url",
            "postgres://db/bulkhead",
        ])
        .unwrap()
        .node
        .run;
        assert_eq!(n.node_id.as_deref(), Some("n1"));
        assert_eq!(n.token.as_deref(), Some("s3cret"));
        assert_eq!(
            n.advertise, None,
            "defaults to http:// and --listen at run time"
        );
        let c = n.serve.config();
        assert_eq!(c.database_url.as_deref(), Some("postgres://db/bulkhead"));
        assert_eq!(c.listen.to_string(), "10.0.0.11:7001");
        // A node without a name or a token is refused by the parser, naming the flag.
        if std::env::var_os("BULKHEAD_NODE_TOKEN").is_none() {
            let e = NodeCli::try_parse_from(["node", "--node-id", "n1"])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("--node-token"), "{e}");
        }
        if std::env::var_os("BULKHEAD_NODE_ID").is_none() {
            let e = NodeCli::try_parse_from(["node", "--node-token", "t"])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("--node-id"), "{e}");
        }
        // `node drain` needs none of a running node's flags.
        let d = NodeCli::try_parse_from([
            "node",
            "drain",
            "n2",
            "--database-url",
            "postgres://db/bulkhead",
            "--wait",
        ])
        .unwrap()
        .node;
        match d.cmd {
            Some(NodeCmd::Drain(d)) => assert_eq!(
                (d.node_id.as_str(), d.wait, d.cancel, d.timeout),
                ("n2", true, false, 600)
            ),
            other => panic!("expected drain, got {other:?}"),
        }
        let e = NodeCli::try_parse_from(["node", "drain", "n2", "--cancel", "--wait"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--cancel") || e.contains("--wait"), "{e}");
        let a = ApiCli::try_parse_from(["api", "--node-token", "s3cret", "--replica-id", "r1"])
            .unwrap()
            .api;
        assert_eq!(
            (a.token.as_str(), a.replica_id.as_deref()),
            ("s3cret", Some("r1"))
        );
    }
}
