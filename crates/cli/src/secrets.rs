//! `bulkhead secrets`: manage the write-only secrets the egress proxy injects into requests
//! (`${e2b.secrets.NAME}` in `network.rules` header values), through the REST API.

use std::io::Read;
use std::process::ExitCode;

use clap::Subcommand;

use bulkhead_cli::args::ClientArgs;

#[derive(Subcommand)]
pub enum SecretsCmd {
    /// Create a secret. The value is read from stdin unless --value is given (a value on the
    /// command line may end up in shell history and `ps`).
    Create {
        name: String,
        #[arg(long)]
        value: Option<String>,
        /// Metadata `KEY=VALUE`; repeatable.
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
    },
    /// Store a new value for a secret (by id or name); the value is read like `create`.
    Update {
        secret: String,
        #[arg(long)]
        value: Option<String>,
    },
    /// List secrets (never their values).
    Ls,
    /// Delete a secret (by id or name).
    Rm { secret: String },
}

fn read_value(value: Option<String>) -> anyhow::Result<String> {
    if let Some(v) = value {
        return Ok(v);
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    // A trailing newline from `echo` or a file is not part of a token.
    let v = s.strip_suffix('\n').unwrap_or(&s);
    let v = v.strip_suffix('\r').unwrap_or(v);
    anyhow::ensure!(
        !v.is_empty(),
        "empty secret value: pass it on stdin or with --value"
    );
    Ok(v.to_string())
}

fn print_secret(v: &serde_json::Value) {
    println!(
        "{}  {}  version {}",
        v["secretID"].as_str().unwrap_or_default(),
        v["name"].as_str().unwrap_or_default(),
        v["currentVersion"].as_i64().unwrap_or_default()
    );
}

pub async fn run(args: ClientArgs, cmd: SecretsCmd) -> anyhow::Result<ExitCode> {
    let client = args.client()?;
    match cmd {
        SecretsCmd::Create {
            name,
            value,
            metadata,
        } => {
            let mut md = serde_json::Map::new();
            for kv in metadata {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("metadata {kv:?} is not KEY=VALUE"))?;
                md.insert(k.to_string(), v.into());
            }
            let body =
                serde_json::json!({ "name": name, "value": read_value(value)?, "metadata": md });
            let (_, _, b) = client
                .api(http::Method::POST, "/secrets", Some(body))
                .await?;
            print_secret(&serde_json::from_slice(&b)?);
            eprintln!("Use it in header rules as ${{e2b.secrets.{name}}}");
        }
        SecretsCmd::Update { secret, value } => {
            let body = serde_json::json!({ "value": read_value(value)? });
            let (_, _, b) = client
                .api(
                    http::Method::POST,
                    &format!("/secrets/{secret}"),
                    Some(body),
                )
                .await?;
            print_secret(&serde_json::from_slice(&b)?);
        }
        SecretsCmd::Ls => {
            let mut next: Option<String> = None;
            println!(
                "{:<28} {:<32} {:>7} UPDATED",
                "SECRET ID", "NAME", "VERSION"
            );
            loop {
                let path = match &next {
                    Some(t) => format!("/secrets?limit=100&nextToken={t}"),
                    None => "/secrets?limit=100".to_string(),
                };
                let (_, headers, b) = client.api(http::Method::GET, &path, None).await?;
                let v: Vec<serde_json::Value> = serde_json::from_slice(&b)?;
                for s in v {
                    println!(
                        "{:<28} {:<32} {:>7} {}",
                        s["secretID"].as_str().unwrap_or_default(),
                        s["name"].as_str().unwrap_or_default(),
                        s["currentVersion"].as_i64().unwrap_or_default(),
                        s["updatedAt"].as_str().unwrap_or_default()
                    );
                }
                next = headers
                    .get("x-next-token")
                    .and_then(|t| t.to_str().ok())
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned);
                if next.is_none() {
                    break;
                }
            }
        }
        SecretsCmd::Rm { secret } => {
            client
                .api(http::Method::DELETE, &format!("/secrets/{secret}"), None)
                .await?;
            eprintln!("Deleted {secret}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
