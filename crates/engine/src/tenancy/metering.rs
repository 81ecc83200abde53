//! Metering math: what one sandbox used between two instants and what that cost, and when a
//! team out of credits is due to have its sandboxes paused. Leaf module; times are passed in
//! (unix ms) so tests run on a fake clock.

use std::collections::HashMap;
use std::time::Duration;

use bulkhead_store::UsageRow;

/// Operator prices, in credits. All zero: usage is metered but nothing is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    /// Per vCPU-hour of a running sandbox.
    pub vcpu_hour: f64,
    /// Per GiB-hour of a running sandbox's memory limit.
    pub gib_hour: f64,
    /// Per GiB-hour of a paused sandbox's checkpoint on disk.
    pub paused_gib_hour: f64,
}

/// What happens to a team's running sandboxes once its credits ran out and the grace passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExhaustedAction {
    /// Paused (memory and files kept; resumable once credits are added).
    #[default]
    Pause,
    /// Killed (their state is lost).
    Kill,
}

/// Why a `--credits-exhausted` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExhaustedActionError {
    #[error("{0:?}: expected `pause` or `kill`")]
    Unknown(String),
}

impl std::str::FromStr for ExhaustedAction {
    type Err = ExhaustedActionError;
    fn from_str(s: &str) -> Result<Self, ExhaustedActionError> {
        match s {
            "pause" => Ok(Self::Pause),
            "kill" => Ok(Self::Kill),
            _ => Err(ExhaustedActionError::Unknown(s.to_owned())),
        }
    }
}

/// The metering settings (`--metering-interval`, `--price-*`, `--credits-grace`,
/// `--credits-exhausted`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeteringConfig {
    /// How often usage is written to the store (a crash loses at most this much).
    pub interval: Duration,
    pub prices: Prices,
    /// How long a team's sandboxes keep running after its balance reached zero.
    pub grace: Duration,
    pub on_exhausted: ExhaustedAction,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            prices: Prices::default(),
            grace: Duration::from_secs(60),
            on_exhausted: ExhaustedAction::Pause,
        }
    }
}

/// A sandbox's metering state, kept with it in the live set.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Meter {
    pub(crate) team_id: String,
    pub(crate) key_id: String,
    pub(crate) vcpus: i64,
    pub(crate) memory_mb: i64,
    /// Unix ms up to which its usage is recorded.
    pub(crate) since_ms: i64,
    /// Millionths of a credit owed but not yet drawn (costs are drawn in whole millionths).
    pub(crate) carry: f64,
    /// Bytes of its checkpoint while paused (measured once per pause).
    pub(crate) paused_bytes: Option<u64>,
}

const MS_PER_HOUR: f64 = 3_600_000.0;
const MIB_PER_GIB: f64 = 1024.0;

/// The usage of `m` from `m.since_ms` to `now_ms` (running, or paused holding
/// `storage_bytes`) and its cost, with the carry that remains. `None` for an empty interval.
pub(crate) fn segment(
    sandbox_id: &str,
    m: &Meter,
    paused: bool,
    storage_bytes: u64,
    now_ms: i64,
    prices: &Prices,
) -> Option<(UsageRow, f64)> {
    let ms = now_ms - m.since_ms;
    if ms <= 0 {
        return None;
    }
    let (vcpu_ms, memory_mib_ms, storage_mib_ms) = if paused {
        (
            0,
            0,
            ((storage_bytes as f64 / 1048576.0) * ms as f64).round() as i64,
        )
    } else {
        (m.vcpus * ms, m.memory_mb * ms, 0)
    };
    let credits = vcpu_ms as f64 / MS_PER_HOUR * prices.vcpu_hour
        + memory_mib_ms as f64 / MIB_PER_GIB / MS_PER_HOUR * prices.gib_hour
        + storage_mib_ms as f64 / MIB_PER_GIB / MS_PER_HOUR * prices.paused_gib_hour;
    let owed = credits * 1e6 + m.carry;
    let cost_micro = owed.floor();
    Some((
        UsageRow {
            sandbox_id: sandbox_id.to_owned(),
            team_id: m.team_id.clone(),
            key_id: m.key_id.clone(),
            start_ms: m.since_ms,
            end_ms: now_ms,
            state: if paused { "paused" } else { "running" }.to_owned(),
            vcpu_ms,
            memory_mib_ms,
            storage_mib_ms,
            cost_micro: cost_micro as i64,
        },
        owed - cost_micro,
    ))
}

/// Since when each team's balance has been at or below zero.
#[derive(Debug, Default)]
pub(crate) struct Exhaustion {
    since: HashMap<String, i64>,
}

impl Exhaustion {
    /// Notes `team`'s balance at `now_ms`; true when its grace has passed and its running
    /// sandboxes are to be stopped now.
    pub(crate) fn observe(
        &mut self,
        team: &str,
        balance_micro: i64,
        now_ms: i64,
        grace: Duration,
    ) -> bool {
        if balance_micro > 0 {
            self.since.remove(team);
            return false;
        }
        let since = *self.since.entry(team.to_owned()).or_insert(now_ms);
        now_ms - since >= grace.as_millis() as i64
    }
}

/// What `GET /bulkhead/v1/usage` and `bulkhead usage` answer: usage summed per sandbox over
/// a time range, and the totals.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct UsageReport {
    /// The range asked for (RFC 3339; absent: unbounded). Intervals that overlap it count
    /// whole, so the sums are exact to one metering interval.
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// The team asked about (absent: every team, for the operator's CLI).
    pub team_id: Option<String>,
    /// That team's balance in credits (absent: no team asked about, or it has no balance).
    pub credits: Option<f64>,
    pub totals: UsageTotals,
    pub sandboxes: Vec<SandboxUsage>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct UsageTotals {
    pub running_seconds: f64,
    pub paused_seconds: f64,
    pub vcpu_seconds: f64,
    pub memory_gib_seconds: f64,
    pub storage_gib_seconds: f64,
    /// Credits drawn.
    pub cost: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct SandboxUsage {
    pub sandbox_id: String,
    pub team_id: String,
    /// The key that created it.
    pub key_id: String,
    /// First and last metered instants in the range.
    pub start: chrono::DateTime<chrono::Utc>,
    pub end: chrono::DateTime<chrono::Utc>,
    #[serde(flatten)]
    pub usage: UsageTotals,
}

impl UsageTotals {
    pub(crate) fn of(s: &bulkhead_store::UsageSum) -> Self {
        let gib_s = |mib_ms: i64| mib_ms as f64 / MIB_PER_GIB / 1000.0;
        Self {
            running_seconds: s.running_ms as f64 / 1000.0,
            paused_seconds: s.paused_ms as f64 / 1000.0,
            vcpu_seconds: s.vcpu_ms as f64 / 1000.0,
            memory_gib_seconds: gib_s(s.memory_mib_ms),
            storage_gib_seconds: gib_s(s.storage_mib_ms),
            cost: s.cost_micro as f64 / 1e6,
        }
    }

    pub(crate) fn add(&mut self, o: &UsageTotals) {
        self.running_seconds += o.running_seconds;
        self.paused_seconds += o.paused_seconds;
        self.vcpu_seconds += o.vcpu_seconds;
        self.memory_gib_seconds += o.memory_gib_seconds;
        self.storage_gib_seconds += o.storage_gib_seconds;
        self.cost += o.cost;
    }
}

/// Which usage a report sums: intervals that overlap `[from_ms, to_ms)` (unix ms) and match
/// every given id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageFilter {
    pub team_id: Option<String>,
    pub key_id: Option<String>,
    pub sandbox_id: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
}

impl UsageFilter {
    fn to_store(&self) -> bulkhead_store::UsageFilter {
        bulkhead_store::UsageFilter {
            team_id: self.team_id.clone(),
            key_id: self.key_id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            from_ms: self.from_ms,
            to_ms: self.to_ms,
        }
    }
}

/// The usage `filter` selects, summed (the operator's view: any team).
pub async fn report(
    store: &bulkhead_store::Store,
    filter: &UsageFilter,
) -> Result<UsageReport, bulkhead_store::StoreError> {
    let sums = store.sum_usage(&filter.to_store()).await?;
    let mut totals = UsageTotals::default();
    let sandboxes = sums
        .iter()
        .map(|s| {
            let usage = UsageTotals::of(s);
            totals.add(&usage);
            SandboxUsage {
                sandbox_id: s.sandbox_id.clone(),
                team_id: s.team_id.clone(),
                key_id: s.key_id.clone(),
                start: crate::clock::ms_to_dt(s.start_ms),
                end: crate::clock::ms_to_dt(s.end_ms),
                usage,
            }
        })
        .collect();
    let credits = match &filter.team_id {
        Some(t) => store
            .get_team(t)
            .await?
            .and_then(|t| t.credits_micro)
            .map(|c| c as f64 / 1e6),
        None => None,
    };
    Ok(UsageReport {
        from: filter.from_ms.map(crate::clock::ms_to_dt),
        to: filter.to_ms.map(crate::clock::ms_to_dt),
        team_id: filter.team_id.clone(),
        credits,
        totals,
        sandboxes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhausted_action_parses_and_says_what_it_expects() {
        assert_eq!("kill".parse(), Ok(ExhaustedAction::Kill));
        assert_eq!(
            "stop".parse::<ExhaustedAction>().unwrap_err().to_string(),
            r#""stop": expected `pause` or `kill`"#
        );
    }

    fn meter(since_ms: i64) -> Meter {
        Meter {
            team_id: "t".into(),
            key_id: "k".into(),
            vcpus: 2,
            memory_mb: 512,
            since_ms,
            carry: 0.0,
            paused_bytes: None,
        }
    }

    #[test]
    fn a_running_interval_counts_vcpu_and_memory_time() {
        let prices = Prices {
            vcpu_hour: 0.036,
            gib_hour: 0.0036,
            paused_gib_hour: 1.0,
        };
        // 15 s at 2 vCPUs and 512 MiB, on a fake clock.
        let (row, carry) = segment("s", &meter(1_000), false, 0, 16_000, &prices).unwrap();
        assert_eq!(
            (row.start_ms, row.end_ms, row.state.as_str()),
            (1_000, 16_000, "running")
        );
        assert_eq!(row.vcpu_ms, 30_000);
        assert_eq!(row.memory_mib_ms, 512 * 15_000);
        assert_eq!(row.storage_mib_ms, 0);
        // 30 vCPU-s × 0.036/3600 = 0.0003; 7.5 GiB-s × 0.0036/3600 = 0.0000075.
        assert_eq!(row.cost_micro, 307);
        assert!((carry - 0.5).abs() < 1e-6, "{carry}");
        assert!(segment("s", &meter(16_000), false, 0, 16_000, &prices).is_none());
    }

    #[test]
    fn fractions_of_a_millionth_carry_over_so_nothing_is_lost() {
        let prices = Prices {
            vcpu_hour: 0.0001,
            ..Default::default()
        };
        let mut m = meter(0);
        let mut total = 0;
        // 240 intervals of 15 s = 1 hour at 2 vCPUs: 0.0002 credits = 200 millionths.
        for i in 1..=240 {
            let (row, carry) = segment("s", &m, false, 0, i * 15_000, &prices).unwrap();
            total += row.cost_micro;
            m.since_ms = row.end_ms;
            m.carry = carry;
        }
        assert_eq!(total, 200);
    }

    #[test]
    fn a_paused_interval_counts_only_storage() {
        let prices = Prices {
            vcpu_hour: 1.0,
            gib_hour: 1.0,
            paused_gib_hour: 3.6,
        };
        // 1 GiB for 10 s: 10 GiB-s × 3.6/3600 = 0.01 credits.
        let (row, _) = segment("s", &meter(0), true, 1 << 30, 10_000, &prices).unwrap();
        assert_eq!((row.vcpu_ms, row.memory_mib_ms), (0, 0));
        assert_eq!(row.storage_mib_ms, 1024 * 10_000);
        assert_eq!(row.state, "paused");
        assert_eq!(row.cost_micro, 10_000);
    }

    #[test]
    fn exhaustion_waits_for_the_grace_and_resets_on_top_up() {
        let grace = Duration::from_secs(30);
        let mut e = Exhaustion::default();
        assert!(!e.observe("t", 5, 0, grace));
        assert!(!e.observe("t", 0, 1_000, grace), "grace starts");
        assert!(!e.observe("t", -3, 30_999, grace));
        assert!(e.observe("t", -3, 31_000, grace), "grace over");
        assert!(!e.observe("t", 10, 32_000, grace), "topped up");
        assert!(!e.observe("t", 0, 33_000, grace), "a new grace");
        assert!(e.observe("u", 0, 0, Duration::ZERO), "no grace");
    }
}
