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
    /// How long past its deadline a sandbox may run before this node stops it itself (when no
    /// API replica ended it), in seconds.
    #[arg(long, env = "BULKHEAD_DEADLINE_GRACE", default_value_t = 30)]
    pub deadline_grace: u64,
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
                deadline_grace: std::time::Duration::from_secs(args.deadline_grace),
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct NodeCli {
        #[command(flatten)]
        node: NodeArgs,
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
        .node;
        assert_eq!(n.node_id, "n1");
        assert_eq!(n.token, "s3cret");
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
        let a = ApiCli::try_parse_from(["api", "--node-token", "s3cret", "--replica-id", "r1"])
            .unwrap()
            .api;
        assert_eq!(
            (a.token.as_str(), a.replica_id.as_deref()),
            ("s3cret", Some("r1"))
        );
    }
}
