//! `bulkhead sandbox`: create, list, run commands in and kill sandboxes on a running server,
//! speaking E2B's REST API with the server's own wire types (`bulkhead_api::wire`).

use std::io::Write;
use std::process::ExitCode;

use bulkhead_api::wire;
use clap::Subcommand;

use bulkhead_cli::args::ClientArgs;
use bulkhead_cli::client::{SandboxRef, run_command};

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Create a sandbox and print its id.
    Create {
        #[arg(long, default_value = "base")]
        template: String,
        /// Time to live in seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        #[command(flatten)]
        net: NetFlags,
    },
    /// Replace a sandbox's network policy (PUT semantics: flags not given are cleared).
    Network {
        id: String,
        #[command(flatten)]
        net: NetFlags,
    },
    /// Show a sandbox's egress audit trail (allowed and denied connections, bytes).
    #[command(alias = "audit")]
    NetworkEvents {
        id: String,
        /// How many of the newest events.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the files created, modified and deleted in a sandbox since it started (or since
    /// a snapshot), from its overlay's upper layer.
    Changes {
        id: String,
        /// Only changes since this snapshot.
        #[arg(long)]
        since: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// List running sandboxes.
    Ls,
    /// Run a command in a sandbox and stream its output; exits with the command's exit code.
    Exec {
        id: String,
        /// Command line, run with `/bin/bash -l -c`.
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Kill a sandbox.
    Kill { id: String },
}

/// Network policy flags shared by `create` and `network`.
#[derive(clap::Args)]
pub struct NetFlags {
    /// Allow internet access (default: the server's `--network-default`).
    #[arg(long)]
    allow_internet: Option<bool>,
    /// Allowed destination (domain, `*.domain`, IP or CIDR); repeatable.
    #[arg(long = "allow-out", value_name = "DEST")]
    allow_out: Vec<String>,
    /// Denied destination (IP or CIDR); repeatable.
    #[arg(long = "deny-out", value_name = "DEST")]
    deny_out: Vec<String>,
}

impl NetFlags {
    /// E2B's `SandboxNetworkConfig` body (`allowOut`/`denyOut`).
    fn network(&self) -> wire::NetworkConfig {
        wire::NetworkConfig {
            allow_out: Some(self.allow_out.clone()),
            deny_out: Some(self.deny_out.clone()),
            ..wire::NetworkConfig::default()
        }
    }

    /// Whether any destination flag was given.
    fn has_destinations(&self) -> bool {
        !self.allow_out.is_empty() || !self.deny_out.is_empty()
    }
}

pub async fn run(args: ClientArgs, cmd: SandboxCmd) -> anyhow::Result<ExitCode> {
    let client = args.client()?;
    match cmd {
        SandboxCmd::Create {
            template,
            timeout,
            net,
        } => {
            let body = wire::NewSandbox {
                template_id: template,
                timeout: Some(i64::try_from(timeout)?),
                allow_internet_access: net.allow_internet,
                network: net.has_destinations().then(|| net.network()),
                ..wire::NewSandbox::default()
            };
            let (_, _, b) = client
                .api(
                    http::Method::POST,
                    "/v2/sandboxes",
                    Some(serde_json::to_value(body)?),
                )
                .await?;
            let created: wire::Sandbox = serde_json::from_slice(&b)?;
            println!("{}", created.sandbox_id);
        }
        SandboxCmd::Ls => {
            let (_, _, b) = client
                .api(http::Method::GET, "/v2/sandboxes?state=running", None)
                .await?;
            let listed: Vec<wire::SandboxDetail> = serde_json::from_slice(&b)?;
            println!(
                "{:<22} {:<22} {:<26} END",
                "SANDBOX ID", "TEMPLATE", "STARTED"
            );
            for s in listed {
                println!(
                    "{:<22} {:<22} {:<26} {}",
                    s.sandbox_id, s.template_id, s.started_at, s.end_at
                );
            }
        }
        SandboxCmd::Exec { id, command } => {
            let (_, _, b) = client
                .api(http::Method::GET, &format!("/sandboxes/{id}"), None)
                .await?;
            let detail: wire::SandboxDetail = serde_json::from_slice(&b)?;
            let sb = SandboxRef {
                id,
                access_token: detail.envd_access_token,
            };
            let args = vec!["-l".to_string(), "-c".to_string(), command.join(" ")];
            let code = run_command(&client, &sb, "/bin/bash", &args, None, |is_err, data| {
                if is_err {
                    let _ = std::io::stderr().write_all(data);
                } else {
                    let _ = std::io::stdout().write_all(data);
                    let _ = std::io::stdout().flush();
                }
            })
            .await?;
            return Ok(ExitCode::from(code.clamp(0, 255) as u8));
        }
        SandboxCmd::Network { id, net } => {
            let body = wire::NetworkConfig {
                allow_internet_access: net.allow_internet,
                ..net.network()
            };
            client
                .api(
                    http::Method::PUT,
                    &format!("/sandboxes/{id}/network"),
                    Some(serde_json::to_value(body)?),
                )
                .await?;
            eprintln!("Network policy of {id} replaced");
        }
        SandboxCmd::NetworkEvents { id, limit, json } => {
            let (_, _, b) = client
                .api(
                    http::Method::GET,
                    &format!("/sandboxes/{id}/network/events?limit={limit}"),
                    None,
                )
                .await?;
            if json {
                println!("{}", String::from_utf8_lossy(&b));
                return Ok(ExitCode::SUCCESS);
            }
            let events: Vec<wire::EgressEvent> = serde_json::from_slice(&b)?;
            println!(
                "{:<25} {:<5} {:<6} {:<32} {:<16} {:>5} {:>10} {:>10} RULE",
                "TIME", "PROTO", "ACTION", "HOST", "IP", "PORT", "BYTES OUT", "BYTES IN"
            );
            for e in events {
                println!(
                    "{:<25} {:<5} {:<6} {:<32} {:<16} {:>5} {:>10} {:>10} {}",
                    e.timestamp,
                    e.protocol,
                    if e.allowed { "allow" } else { "deny" },
                    e.host.as_deref().unwrap_or("-"),
                    e.ip.as_deref().unwrap_or("-"),
                    e.port,
                    e.bytes_out,
                    e.bytes_in,
                    e.rule,
                );
            }
        }
        SandboxCmd::Changes { id, since, json } => {
            let query = since
                .map(|s| format!("?since={}", urlencoding::encode(&s)))
                .unwrap_or_default();
            let (_, _, b) = client
                .api(
                    http::Method::GET,
                    &format!("/sandboxes/{id}/changes{query}"),
                    None,
                )
                .await?;
            if json {
                println!("{}", String::from_utf8_lossy(&b));
                return Ok(ExitCode::SUCCESS);
            }
            let changes: Vec<bulkhead_api::Change> = serde_json::from_slice(&b)?;
            print!("{}", changes_table(&changes));
        }
        SandboxCmd::Kill { id } => {
            client
                .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await?;
            eprintln!("Killed {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `KIND TYPE SIZE MTIME PATH`, one change a line.
fn changes_table(changes: &[bulkhead_api::Change]) -> String {
    let mut out = format!(
        "{:<9} {:<8} {:>12} {:<25} PATH\n",
        "KIND", "TYPE", "SIZE", "MTIME"
    );
    for c in changes {
        out.push_str(&format!(
            "{:<9} {:<8} {:>12} {:<25} {}\n",
            c.kind,
            c.file_type,
            c.size,
            c.mtime.as_deref().unwrap_or("-"),
            c.path
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_table_lists_one_change_a_line() {
        let c: Vec<bulkhead_api::Change> = serde_json::from_value(serde_json::json!([
            {"path": "/etc/issue", "kind": "deleted", "type": "file", "size": 0},
            {"path": "/home/user/a.py", "kind": "created", "type": "file", "size": 12,
             "mtime": "2026-01-01T00:00:00Z"}
        ]))
        .unwrap();
        let t = changes_table(&c);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("deleted") && lines[1].ends_with("/etc/issue"));
        assert!(lines[2].contains("2026-01-01T00:00:00Z") && lines[2].ends_with("/home/user/a.py"));
    }

    #[test]
    fn create_body_is_the_e2b_shape() {
        let net = NetFlags {
            allow_internet: None,
            allow_out: vec!["example.com".into()],
            deny_out: Vec::new(),
        };
        let body = wire::NewSandbox {
            template_id: "base".into(),
            timeout: Some(300),
            allow_internet_access: Some(false),
            network: net.has_destinations().then(|| net.network()),
            ..wire::NewSandbox::default()
        };
        assert_eq!(
            serde_json::to_value(body).unwrap(),
            serde_json::json!({
                "templateID": "base",
                "timeout": 300,
                "allow_internet_access": false,
                "network": { "allowOut": ["example.com"], "denyOut": [] }
            })
        );
    }
}
