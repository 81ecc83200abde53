use std::process::ExitCode;

use clap::Subcommand;

use crate::DataArgs;

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
            for k in store.list_api_keys().await? {
                println!(
                    "{:<18} {:<12} {:<20} {:<25} {}",
                    k.id,
                    k.prefix,
                    k.name,
                    fmt_ms(k.created_at),
                    k.revoked_at.map(fmt_ms).unwrap_or_else(|| "-".into())
                );
            }
        }
        KeysCmd::Revoke { id } => {
            if store.revoke_api_key(&id).await? {
                eprintln!("Revoked {id}");
            } else {
                eprintln!("No active key matches {id:?}; see `bulkhead keys list`");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn fmt_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}
