use std::process::ExitCode;

use clap::Subcommand;

use crate::args::DataArgs;

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a key and print it (shown once; only its hash is stored).
    Create {
        #[arg(long, default_value = "cli")]
        name: String,
    },
    /// List keys (id, prefix, name, created, revoked).
    List,
    /// Revoke a key by id or prefix.
    Revoke { id: String },
}

pub async fn run(data: DataArgs, cmd: KeysCmd) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    match cmd {
        KeysCmd::Create { name } => {
            let (row, key) = bulkhead_engine::keys::create(&store, &name).await?;
            eprintln!(
                "Created key {} ({}). It is shown only once:",
                row.id, row.name
            );
            println!("{key}");
        }
        KeysCmd::List => {
            println!(
                "{:<18} {:<12} {:<20} {:<25} REVOKED",
                "ID", "PREFIX", "NAME", "CREATED"
            );
            for k in bulkhead_engine::keys::list(&store).await? {
                println!(
                    "{:<18} {:<12} {:<20} {:<25} {}",
                    k.id,
                    k.prefix,
                    k.name,
                    fmt_dt(k.created_at),
                    k.revoked_at.map(fmt_dt).unwrap_or_else(|| "-".into())
                );
            }
        }
        KeysCmd::Revoke { id } => {
            if bulkhead_engine::keys::revoke(&store, &id).await? {
                eprintln!("Revoked {id}");
            } else {
                eprintln!("No active key matches {id:?}; see `bulkhead keys list`");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fmt_dt(d: chrono::DateTime<chrono::Utc>) -> String {
    d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
