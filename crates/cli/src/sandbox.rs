use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;

use crate::ClientArgs;
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

pub async fn run(args: ClientArgs, cmd: SandboxCmd) -> anyhow::Result<ExitCode> {
    let client = args.client()?;
    match cmd {
        SandboxCmd::Create { template, timeout } => {
            let body = serde_json::json!({ "templateID": template, "timeout": timeout });
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
        SandboxCmd::Kill { id } => {
            client
                .api(http::Method::DELETE, &format!("/sandboxes/{id}"), None)
                .await?;
            eprintln!("Killed {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
