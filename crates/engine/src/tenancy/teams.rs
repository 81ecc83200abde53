//! Teams (E2B's model): API keys belong to one, and sandboxes, volumes, usage, credits and
//! quotas attach to it. These functions work on the store directly, so `bulkhead teams` can
//! manage a server's teams while it runs; the engine reads a team's row at each create, so a
//! change applies to the next create.

use bulkhead_store::{Store, StoreError, TeamQuotas, TeamRow};

use crate::clock::now_ms;
use crate::ids::random_hex;

pub use crate::tenancy::quota::format_credits;
/// The team of keys made without one (and of everything made before teams existed).
pub const DEFAULT_TEAM: &str = bulkhead_store::DEFAULT_TEAM;

#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    #[error(
        "Team {0:?} not found: list teams with `bulkhead teams list`, or create it with `bulkhead teams create {0}`"
    )]
    NotFound(String),
    #[error("Team name {0:?} is not valid: use 1 to 64 letters, digits, '-', '_' or '.'")]
    InvalidName(String),
    #[error(
        "Credits {0:?} are not a number: give an amount like 10, +2.5 or -1 (credits, up to 6 decimals)"
    )]
    BadCredits(String),
    #[error("Team {0:?} already exists: see `bulkhead teams list`")]
    Exists(String),
    #[error("Team storage failed")]
    Store(#[source] StoreError),
}

impl From<StoreError> for TeamError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict { what } => TeamError::Exists(what),
            e => TeamError::Store(e),
        }
    }
}

type Result<T, E = TeamError> = std::result::Result<T, E>;

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Parses an amount of credits (`10`, `+2.5`, `-1`) into millionths.
pub fn parse_credits(s: &str) -> Result<i64> {
    let bad = || TeamError::BadCredits(s.to_owned());
    let t = s.trim();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'+') => (false, &t[1..]),
        Some(b'-') => (true, &t[1..]),
        _ => (false, t),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() || frac.len() > 6 {
        return Err(bad());
    }
    let digits = |d: &str| d.is_empty() || d.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !digits(frac) {
        return Err(bad());
    }
    let whole: i64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    let frac: i64 = format!("{frac:0<6}").parse().map_err(|_| bad())?;
    let micro = whole
        .checked_mul(1_000_000)
        .and_then(|w| w.checked_add(frac))
        .ok_or_else(bad)?;
    Ok(if neg { -micro } else { micro })
}

/// A team as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team {
    pub id: String,
    /// Unique; accepted wherever the id is.
    pub name: String,
    /// Unix ms.
    pub created_at: i64,
    /// Balance in millionths of a credit; `None`: the team has no balance.
    pub credits_micro: Option<i64>,
    pub quotas: TeamLimits,
}

/// A team's limits; `None` is "no team limit" (the server's own limits still apply).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamLimits {
    /// Sandboxes running at once.
    pub max_sandboxes: Option<i64>,
    /// vCPUs of one sandbox.
    pub max_vcpus: Option<i64>,
    /// Memory limit of one sandbox, MiB.
    pub max_memory_mb: Option<i64>,
    /// Longest TTL a sandbox may be given, seconds.
    pub max_timeout_secs: Option<i64>,
    /// Creates per second, in thousandths.
    pub create_rate_milli: Option<i64>,
    /// Creates that may come at once.
    pub create_burst: Option<i64>,
}

impl From<TeamRow> for Team {
    fn from(r: TeamRow) -> Self {
        let q = r.quotas;
        Team {
            id: r.id,
            name: r.name,
            created_at: r.created_at,
            credits_micro: r.credits_micro,
            quotas: TeamLimits {
                max_sandboxes: q.max_sandboxes,
                max_vcpus: q.max_vcpus,
                max_memory_mb: q.max_memory_mb,
                max_timeout_secs: q.max_timeout_secs,
                create_rate_milli: q.create_rate_milli,
                create_burst: q.create_burst,
            },
        }
    }
}

/// Creates a team named `name` (its id is generated), with an optional balance.
pub async fn create(store: &Store, name: &str, credits_micro: Option<i64>) -> Result<Team> {
    if !valid_name(name) {
        return Err(TeamError::InvalidName(name.to_owned()));
    }
    if store.get_team(name).await?.is_some() {
        return Err(TeamError::Exists(name.to_owned()));
    }
    let row = TeamRow {
        id: format!("team_{}", random_hex(8)),
        name: name.to_owned(),
        created_at: now_ms(),
        credits_micro,
        quotas: TeamQuotas::default(),
    };
    store.insert_team(&row).await?;
    Ok(row.into())
}

pub async fn list(store: &Store) -> Result<Vec<Team>> {
    Ok(store
        .list_teams()
        .await?
        .into_iter()
        .map(Team::from)
        .collect())
}

/// The team with this id or name.
pub async fn get(store: &Store, id_or_name: &str) -> Result<Team> {
    row(store, id_or_name).await.map(Team::from)
}

async fn row(store: &Store, id_or_name: &str) -> Result<TeamRow> {
    store
        .get_team(id_or_name)
        .await?
        .ok_or_else(|| TeamError::NotFound(id_or_name.to_owned()))
}

/// Adds credits (negative: takes them away); a team without a balance gets one. Returns the
/// new balance in millionths.
pub async fn credit(store: &Store, id_or_name: &str, delta_micro: i64) -> Result<i64> {
    let team = get(store, id_or_name).await?;
    store
        .add_team_credits(&team.id, delta_micro)
        .await?
        .ok_or_else(|| TeamError::NotFound(id_or_name.to_owned()))
}

/// Removes the team's balance: it is metered but never refused for credits.
pub async fn clear_credits(store: &Store, id_or_name: &str) -> Result<()> {
    let team = get(store, id_or_name).await?;
    store.clear_team_credits(&team.id).await?;
    Ok(())
}

/// Changes some quotas: `Some(Some(n))` sets one, `Some(None)` removes it, `None` keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaUpdate {
    pub max_sandboxes: Option<Option<i64>>,
    pub max_vcpus: Option<Option<i64>>,
    pub max_memory_mb: Option<Option<i64>>,
    pub max_timeout_secs: Option<Option<i64>>,
    pub create_rate_milli: Option<Option<i64>>,
    pub create_burst: Option<Option<i64>>,
}

pub async fn set_quotas(store: &Store, id_or_name: &str, u: &QuotaUpdate) -> Result<Team> {
    let mut team = row(store, id_or_name).await?;
    let q = &mut team.quotas;
    for (slot, new) in [
        (&mut q.max_sandboxes, u.max_sandboxes),
        (&mut q.max_vcpus, u.max_vcpus),
        (&mut q.max_memory_mb, u.max_memory_mb),
        (&mut q.max_timeout_secs, u.max_timeout_secs),
        (&mut q.create_rate_milli, u.create_rate_milli),
        (&mut q.create_burst, u.create_burst),
    ] {
        if let Some(v) = new {
            *slot = v;
        }
    }
    store.set_team_quotas(&team.id, &team.quotas).await?;
    Ok(team.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_parse_to_millionths() {
        assert_eq!(parse_credits("10").unwrap(), 10_000_000);
        assert_eq!(parse_credits("+2.5").unwrap(), 2_500_000);
        assert_eq!(parse_credits("-0.000001").unwrap(), -1);
        assert_eq!(parse_credits(".5").unwrap(), 500_000);
        for bad in ["", "+", "1.2345678", "abc", "1e3", "--1", "1.2.3"] {
            assert!(parse_credits(bad).is_err(), "{bad}");
        }
        assert_eq!(format_credits(parse_credits("+2.5").unwrap()), "2.500000");
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("acme-prod_1.x"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name(&"a".repeat(65)));
    }
}
