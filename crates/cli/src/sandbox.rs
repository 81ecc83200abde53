use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;

use crate::args::ClientArgs;
use crate::client::{SandboxRef, run_command};

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
    fn network(&self) -> serde_json::Value {
        serde_json::json!({ "allowOut": self.allow_out, "denyOut": self.deny_out })
    }

    /// Sets `allow_internet_access` on `body` when the flag was given.
    fn apply_internet(&self, body: &mut serde_json::Value) {
        if let Some(a) = self.allow_internet {
            body["allow_internet_access"] = a.into();
        }
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
            let mut body = serde_json::json!({ "templateID": template, "timeout": timeout });
            net.apply_internet(&mut body);
            if !net.allow_out.is_empty() || !net.deny_out.is_empty() {
                body["network"] = net.network();
            }
            let (_, _, b) = client
                .api(http::Method::POST, "/v2/sandboxes", Some(body))
                .await?;
            let v: serde_json::Value = serde_json::from_slice(&b)?;
            println!("{}", v["sandboxID"].as_str().unwrap_or_default());
        }
        SandboxCmd::Ls => {
            let (_, _, b) = client
                .api(http::Method::GET, "/v2/sandboxes?state=running", None)
                .await?;
            let v: Vec<serde_json::Value> = serde_json::from_slice(&b)?;
            println!(
                "{:<22} {:<22} {:<26} END",
                "SANDBOX ID", "TEMPLATE", "STARTED"
            );
            for s in v {
                println!(
                    "{:<22} {:<22} {:<26} {}",
                    s["sandboxID"].as_str().unwrap_or_default(),
                    s["templateID"].as_str().unwrap_or_default(),
                    s["startedAt"].as_str().unwrap_or_default(),
                    s["endAt"].as_str().unwrap_or_default()
                );
            }
        }
        SandboxCmd::Exec { id, command } => {
            let (_, _, b) = client
                .api(http::Method::GET, &format!("/sandboxes/{id}"), None)
                .await?;
            let v: serde_json::Value = serde_json::from_slice(&b)?;
            let sb = SandboxRef {
                id,
                access_token: v["envdAccessToken"].as_str().map(str::to_owned),
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
            let mut body = net.network();
            net.apply_internet(&mut body);
            client
                .api(
                    http::Method::PUT,
                    &format!("/sandboxes/{id}/network"),
                    Some(body),
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
            let v: Vec<serde_json::Value> = serde_json::from_slice(&b)?;
            println!(
                "{:<25} {:<5} {:<6} {:<32} {:<16} {:>5} {:>10} {:>10} RULE",
                "TIME", "PROTO", "ACTION", "HOST", "IP", "PORT", "BYTES OUT", "BYTES IN"
            );
            for e in v {
                println!(
                    "{:<25} {:<5} {:<6} {:<32} {:<16} {:>5} {:>10} {:>10} {}",
                    e["timestamp"].as_str().unwrap_or_default(),
                    e["protocol"].as_str().unwrap_or_default(),
                    if e["allowed"].as_bool().unwrap_or(false) {
                        "allow"
                    } else {
                        "deny"
                    },
                    e["host"].as_str().unwrap_or("-"),
                    e["ip"].as_str().unwrap_or("-"),
                    e["port"].as_i64().unwrap_or_default(),
                    e["bytesOut"].as_i64().unwrap_or_default(),
                    e["bytesIn"].as_i64().unwrap_or_default(),
                    e["rule"].as_str().unwrap_or_default(),
                );
            }
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
