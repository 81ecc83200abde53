//! Row types of teams and metered usage (see the `teams` and `usage_records` tables).

/// The team that keys and sandboxes made before teams existed belong to.
pub const DEFAULT_TEAM: &str = "default";

/// A team's limits; `None` is "no team limit" (the server's own limits still apply).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamQuotas {
    /// Sandboxes running at once (paused ones hold no CPU or memory and do not count).
    pub max_sandboxes: Option<i64>,
    /// vCPUs of one sandbox.
    pub max_vcpus: Option<i64>,
    /// Memory limit of one sandbox, MiB.
    pub max_memory_mb: Option<i64>,
    /// Longest TTL a sandbox may be given, seconds.
    pub max_timeout_secs: Option<i64>,
    /// Creates per second, in thousandths (token bucket refill rate).
    pub create_rate_milli: Option<i64>,
    /// Creates that may come at once (token bucket size); default: the rate rounded up.
    pub create_burst: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamRow {
    pub id: String,
    /// Unique; the CLI accepts it wherever it accepts the id.
    pub name: String,
    pub created_at: i64,
    /// Balance in millionths of a credit; `None`: the team has no balance.
    pub credits_micro: Option<i64>,
    pub quotas: TeamQuotas,
}

/// One metering interval of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub sandbox_id: String,
    pub team_id: String,
    pub key_id: String,
    /// Unix ms, half-open `[start_ms, end_ms)`.
    pub start_ms: i64,
    pub end_ms: i64,
    /// `running` or `paused`.
    pub state: String,
    pub vcpu_ms: i64,
    pub memory_mib_ms: i64,
    pub storage_mib_ms: i64,
    pub cost_micro: i64,
}

/// Which usage to sum: intervals that overlap `[from_ms, to_ms)` and match every given id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFilter {
    pub team_id: Option<String>,
    pub key_id: Option<String>,
    pub sandbox_id: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
}

/// Usage summed per sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSum {
    pub sandbox_id: String,
    pub team_id: String,
    pub key_id: String,
    /// First and last metered instant in the range.
    pub start_ms: i64,
    pub end_ms: i64,
    pub running_ms: i64,
    pub paused_ms: i64,
    pub vcpu_ms: i64,
    pub memory_mib_ms: i64,
    pub storage_mib_ms: i64,
    pub cost_micro: i64,
}
