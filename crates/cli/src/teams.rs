//! `bulkhead teams` and `bulkhead usage`: operator commands on the store (like `keys`), so
//! they work while the server runs; the server reads a team's row at each create.

use std::process::ExitCode;

use bulkhead_engine::teams::{QuotaUpdate, format_credits, parse_credits};
use bulkhead_engine::{Admin, Team, UsageFilter};
use clap::Subcommand;

use bulkhead_cli::args::DataArgs;

#[derive(Subcommand)]
pub enum TeamsCmd {
    /// Create a team (then `bulkhead keys create --team NAME`).
    Create {
        name: String,
        /// Start with this balance (credits); without it the team has no balance and is
        /// never refused for credits.
        #[arg(long)]
        credits: Option<String>,
    },
    /// List teams with their balance and quotas.
    List,
    /// Add credits to a team's balance (`+10`, `2.5`), or take some away (`-1`); `none`
    /// removes the balance (the team is metered but never refused for credits).
    Credit {
        team: String,
        #[arg(allow_hyphen_values = true)]
        amount: String,
    },
    /// Set a team's quotas; `none` removes one.
    SetQuota {
        team: String,
        /// Sandboxes running at once.
        #[arg(long)]
        max_sandboxes: Option<String>,
        /// vCPUs of one sandbox.
        #[arg(long)]
        max_vcpus: Option<String>,
        /// Memory limit of one sandbox, MiB.
        #[arg(long)]
        max_memory_mb: Option<String>,
        /// Longest sandbox timeout, seconds.
        #[arg(long)]
        max_timeout: Option<String>,
        /// Creates per second (token bucket refill rate, e.g. 0.5 or 10).
        #[arg(long)]
        creates_per_second: Option<String>,
        /// Creates that may come at once (token bucket size; default: the rate rounded up).
        #[arg(long)]
        create_burst: Option<String>,
    },
}

/// `none` → remove, a whole number → set.
fn int_opt(flag: &str, v: &Option<String>) -> anyhow::Result<Option<Option<i64>>> {
    match v.as_deref() {
        None => Ok(None),
        Some("none") => Ok(Some(None)),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Some(Some(n))),
            _ => anyhow::bail!("--{flag} {s:?}: give a whole number ≥ 0, or `none` to remove it"),
        },
    }
}

fn rate_opt(v: &Option<String>) -> anyhow::Result<Option<Option<i64>>> {
    match v.as_deref() {
        None => Ok(None),
        Some("none") => Ok(Some(None)),
        Some(s) => match s.parse::<f64>() {
            Ok(r) if r > 0.0 && r.is_finite() => Ok(Some(Some((r * 1000.0).round() as i64))),
            _ => anyhow::bail!(
                "--creates-per-second {s:?}: give a positive number (e.g. 0.5 or 10), or `none`"
            ),
        },
    }
}

fn show(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

fn print_team(t: &Team) {
    let q = &t.quotas;
    println!(
        "{:<22} {:<16} {:>16} {:>8} {:>6} {:>8} {:>8} {:>9}",
        t.id,
        t.name,
        t.credits_micro
            .map_or_else(|| "-".to_owned(), format_credits),
        show(q.max_sandboxes),
        show(q.max_vcpus),
        show(q.max_memory_mb),
        show(q.max_timeout_secs),
        q.create_rate_milli
            .map_or_else(|| "-".to_owned(), |r| format!("{}", r as f64 / 1000.0)),
    );
}

pub async fn run(data: DataArgs, cmd: TeamsCmd) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(data.open_store().await?);
    match cmd {
        TeamsCmd::Create { name, credits } => {
            let credits = credits.as_deref().map(parse_credits).transpose()?;
            let t = admin.create_team(&name, credits).await?;
            eprintln!(
                "Created team {} ({}). Give it a key with `bulkhead keys create --team {}`.",
                t.name, t.id, t.name
            );
            println!("{}", t.id);
        }
        TeamsCmd::List => {
            println!(
                "{:<22} {:<16} {:>16} {:>8} {:>6} {:>8} {:>8} {:>9}",
                "ID", "NAME", "CREDITS", "MAX_SBX", "VCPUS", "MEM_MB", "TIMEOUT", "CREATES/S"
            );
            for t in admin.teams().await? {
                print_team(&t);
            }
        }
        TeamsCmd::Credit { team, amount } => {
            if amount == "none" {
                admin.clear_credits(&team).await?;
                eprintln!("Team {team} has no balance now (metered, never refused for credits).");
            } else {
                let balance = admin.credit(&team, parse_credits(&amount)?).await?;
                eprintln!("Team {team} balance: {}", format_credits(balance));
            }
        }
        TeamsCmd::SetQuota {
            team,
            max_sandboxes,
            max_vcpus,
            max_memory_mb,
            max_timeout,
            creates_per_second,
            create_burst,
        } => {
            let u = QuotaUpdate {
                max_sandboxes: int_opt("max-sandboxes", &max_sandboxes)?,
                max_vcpus: int_opt("max-vcpus", &max_vcpus)?,
                max_memory_mb: int_opt("max-memory-mb", &max_memory_mb)?,
                max_timeout_secs: int_opt("max-timeout", &max_timeout)?,
                create_rate_milli: rate_opt(&creates_per_second)?,
                create_burst: int_opt("create-burst", &create_burst)?,
            };
            let t = admin.set_quotas(&team, &u).await?;
            println!(
                "{:<22} {:<16} {:>16} {:>8} {:>6} {:>8} {:>8} {:>9}",
                "ID", "NAME", "CREDITS", "MAX_SBX", "VCPUS", "MEM_MB", "TIMEOUT", "CREATES/S"
            );
            print_team(&t);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `bulkhead usage`: metered usage from the store, any team.
#[derive(clap::Args)]
pub struct UsageArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Only this team (id or name).
    #[arg(long)]
    team: Option<String>,
    /// Only sandboxes created with this key id.
    #[arg(long)]
    key: Option<String>,
    #[arg(long)]
    sandbox: Option<String>,
    /// From (RFC 3339, e.g. 2026-11-24T00:00:00Z).
    #[arg(long)]
    start: Option<chrono::DateTime<chrono::Utc>>,
    /// Until (RFC 3339).
    #[arg(long)]
    end: Option<chrono::DateTime<chrono::Utc>>,
    /// Print the JSON of `GET /bulkhead/v1/usage` instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn usage(a: UsageArgs) -> anyhow::Result<ExitCode> {
    let admin = Admin::new(a.data.open_store().await?);
    let team_id = match &a.team {
        Some(t) => Some(admin.team(t).await?.id),
        None => None,
    };
    let filter = UsageFilter {
        team_id,
        key_id: a.key,
        sandbox_id: a.sandbox,
        from_ms: a.start.map(|t| t.timestamp_millis()),
        to_ms: a.end.map(|t| t.timestamp_millis()),
    };
    let r = admin.usage(&filter).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<22} {:<22} {:>10} {:>10} {:>12} {:>12} {:>12} {:>12}",
        "SANDBOX", "TEAM", "RUN_S", "PAUSED_S", "VCPU_S", "MEM_GIB_S", "DISK_GIB_S", "COST"
    );
    let line = |id: &str, team: &str, u: &bulkhead_engine::metering::UsageTotals| {
        println!(
            "{:<22} {:<22} {:>10.1} {:>10.1} {:>12.1} {:>12.1} {:>12.1} {:>12.6}",
            id,
            team,
            u.running_seconds,
            u.paused_seconds,
            u.vcpu_seconds,
            u.memory_gib_seconds,
            u.storage_gib_seconds,
            u.cost
        )
    };
    for s in &r.sandboxes {
        line(&s.sandbox_id, &s.team_id, &s.usage);
    }
    line("TOTAL", "", &r.totals);
    if let Some(c) = r.credits {
        println!("balance: {c:.6} credits");
    }
    Ok(ExitCode::SUCCESS)
}
