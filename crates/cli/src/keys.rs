use std::process::ExitCode;

use clap::Subcommand;

use bulkhead_cli::args::DataArgs;

#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a key and print it (shown once; only its hash is stored).
    Create {
        #[arg(long, default_value = "cli")]
        name: String,
        /// The team (id or name) the key belongs to; its sandboxes are the team's.
        #[arg(long, default_value = bulkhead_engine::teams::DEFAULT_TEAM)]
        team: String,
    },
    /// List keys (id, prefix, name, team, created, last used, revoked).
    List,
    /// Revoke a key by id or prefix.
    Revoke { id: String },
}

pub async fn run(data: DataArgs, cmd: KeysCmd) -> anyhow::Result<ExitCode> {
    let admin = bulkhead_engine::Admin::new(data.open_store().await?);
    match cmd {
        KeysCmd::Create { name, team } => {
            let (row, key) = admin.create_key(&name, &team).await?;
            eprintln!(
                "Created key {} ({}) in team {}. It is shown only once:",
                row.id, row.name, row.team_id
            );
            println!("{key}");
        }
        KeysCmd::List => {
            let names: std::collections::HashMap<String, String> = admin
                .teams()
                .await?
                .into_iter()
                .map(|t| (t.id, t.name))
                .collect();
            println!(
                "{:<18} {:<12} {:<20} {:<16} {:<21} {:<21} REVOKED",
                "ID", "PREFIX", "NAME", "TEAM", "CREATED", "LAST USED"
            );
            for k in admin.keys().await? {
                println!(
                    "{:<18} {:<12} {:<20} {:<16} {:<21} {:<21} {}",
                    k.id,
                    k.prefix,
                    k.name,
                    names.get(&k.team_id).unwrap_or(&k.team_id),
                    fmt_dt(k.created_at),
                    k.last_used_at.map(fmt_dt).unwrap_or_else(|| "-".into()),
                    k.revoked_at.map(fmt_dt).unwrap_or_else(|| "-".into())
                );
            }
        }
        KeysCmd::Revoke { id } => {
            if admin.revoke_key(&id).await? {
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
