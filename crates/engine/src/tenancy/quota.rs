//! Team quotas and the create rate limit: which limit a request breaks (pure checks over a
//! team's row and counts) and the token bucket of creates. Leaf module; times are passed in
//! (unix ms) so tests run on a fake clock.

use bulkhead_store::TeamQuotas;

/// A limit a team can hit. The label is the Prometheus `limit` label of refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Credits,
    CreateRate,
    MaxSandboxes,
    MaxVcpus,
    MaxMemory,
    MaxTimeout,
    /// Template builds of the team running at once.
    ConcurrentBuilds,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Credits => "credits",
            Limit::CreateRate => "create_rate",
            Limit::MaxSandboxes => "max_sandboxes",
            Limit::MaxVcpus => "max_vcpus",
            Limit::MaxMemory => "max_memory_mb",
            Limit::MaxTimeout => "max_timeout",
            Limit::ConcurrentBuilds => "concurrent_builds",
        }
    }
}

/// A refused request: which limit, of which team, and the sentence to show (it says how to
/// raise the limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QuotaError {
    pub limit: Limit,
    pub team: String,
    pub message: String,
}

impl QuotaError {
    fn new(limit: Limit, team: &str, message: String) -> Self {
        Self {
            limit,
            team: team.to_owned(),
            message,
        }
    }

    pub(crate) fn credits(team: &str, balance_micro: i64) -> Self {
        Self::new(
            Limit::Credits,
            team,
            format!(
                "Team {team} has no credits left (balance {}): sandboxes cannot be created or resumed until the operator adds some with `bulkhead teams credit {team} +N`",
                format_credits(balance_micro)
            ),
        )
    }

    pub(crate) fn rate(team: &str, rate_milli: i64) -> Self {
        Self::new(
            Limit::CreateRate,
            team,
            format!(
                "Team {team} creates sandboxes faster than its limit of {} per second: retry in a moment, or ask the operator to raise it with `bulkhead teams set-quota {team} --creates-per-second N`",
                rate_milli as f64 / 1000.0
            ),
        )
    }
}

/// Credits as a decimal (balances are kept in millionths).
pub fn format_credits(micro: i64) -> String {
    let sign = if micro < 0 { "-" } else { "" };
    let m = micro.unsigned_abs();
    format!("{sign}{}.{:06}", m / 1_000_000, m % 1_000_000)
}

/// What a create (or resume) asks of its team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub vcpus: i64,
    pub memory_mb: i64,
    pub timeout_secs: u64,
}

/// Checks a new running sandbox against the team's quotas, `running` being how many of the
/// team's sandboxes run now.
pub fn check_create(team: &str, q: &TeamQuotas, running: i64, ask: Ask) -> Result<(), QuotaError> {
    if let Some(max) = q.max_vcpus
        && ask.vcpus > max
    {
        return Err(QuotaError::new(
            Limit::MaxVcpus,
            team,
            format!(
                "The template needs {} vCPUs but team {team} may use at most {max} per sandbox: use a smaller template, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-vcpus {}`",
                ask.vcpus, ask.vcpus
            ),
        ));
    }
    if let Some(max) = q.max_memory_mb
        && ask.memory_mb > max
    {
        return Err(QuotaError::new(
            Limit::MaxMemory,
            team,
            format!(
                "The template needs {} MiB of memory but team {team} may use at most {max} MiB per sandbox: use a smaller template, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-memory-mb {}`",
                ask.memory_mb, ask.memory_mb
            ),
        ));
    }
    check_timeout(team, q, ask.timeout_secs)?;
    if let Some(max) = q.max_sandboxes
        && running >= max
    {
        return Err(QuotaError::new(
            Limit::MaxSandboxes,
            team,
            format!(
                "Team {team} already runs {running} sandboxes, its limit is {max}: kill or pause one, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-sandboxes N`"
            ),
        ));
    }
    Ok(())
}

/// Checks a template build's sandbox (its `cpu_count` and `memory_mb`) against the team's
/// per-sandbox quotas: a build sandbox is a sandbox of the team, so it gets no more than the
/// team's own sandboxes may.
pub fn check_build(
    team: &str,
    q: &TeamQuotas,
    vcpus: i64,
    memory_mb: i64,
) -> Result<(), QuotaError> {
    if let Some(max) = q.max_vcpus
        && vcpus > max
    {
        return Err(QuotaError::new(
            Limit::MaxVcpus,
            team,
            format!(
                "The build asks for {vcpus} vCPUs but team {team} may use at most {max} per sandbox: build with cpu_count={max} or less, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-vcpus {vcpus}`"
            ),
        ));
    }
    if let Some(max) = q.max_memory_mb
        && memory_mb > max
    {
        return Err(QuotaError::new(
            Limit::MaxMemory,
            team,
            format!(
                "The build asks for {memory_mb} MiB of memory but team {team} may use at most {max} MiB per sandbox: build with memory_mb={max} or less, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-memory-mb {memory_mb}`"
            ),
        ));
    }
    Ok(())
}

/// Checks one more running build of a team against the server's per-team limit.
pub fn check_concurrent_builds(team: &str, running: usize, max: usize) -> Result<(), QuotaError> {
    if running >= max {
        return Err(QuotaError::new(
            Limit::ConcurrentBuilds,
            team,
            format!(
                "Team {team} already runs {running} template builds, the server's limit per team is {max}: wait for one to finish and retry (the operator sets it with `bulkhead serve --max-builds-per-team N`)"
            ),
        ));
    }
    Ok(())
}

/// Checks a TTL (at create, or a later timeout change) against the team's longest.
pub fn check_timeout(team: &str, q: &TeamQuotas, secs: u64) -> Result<(), QuotaError> {
    match q.max_timeout_secs {
        Some(max) if secs > max.max(0) as u64 => Err(QuotaError::new(
            Limit::MaxTimeout,
            team,
            format!(
                "A timeout of {secs} s is longer than team {team}'s limit of {max} s: ask for less, or ask the operator to raise it with `bulkhead teams set-quota {team} --max-timeout {secs}`"
            ),
        )),
        _ => Ok(()),
    }
}

/// A token bucket: `burst` tokens, refilled at `rate_milli / 1000` per second; a create takes
/// one. Kept per team in memory (a restart refills it, which only ever lets a burst through).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    last_ms: i64,
}

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn full(burst: f64, now_ms: i64) -> Self {
        Self {
            tokens: burst,
            last_ms: now_ms,
        }
    }

    /// Takes a token if there is one at `now_ms`.
    pub fn take(&mut self, rate_milli: i64, burst: f64, now_ms: i64) -> bool {
        let elapsed = (now_ms - self.last_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate_milli.max(0) as f64 / 1000.0).min(burst);
        self.last_ms = self.last_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The bucket size of a team: its `create_burst`, else the rate rounded up (at least 1).
pub fn burst_of(q: &TeamQuotas) -> f64 {
    match (q.create_burst, q.create_rate_milli) {
        (Some(b), _) => b.max(1) as f64,
        (None, Some(r)) => ((r as f64 / 1000.0).ceil()).max(1.0),
        (None, None) => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_get_no_more_than_the_teams_sandboxes() {
        let q = TeamQuotas {
            max_vcpus: Some(1),
            max_memory_mb: Some(256),
            ..Default::default()
        };
        assert!(check_build("b", &q, 1, 256).is_ok());
        let e = check_build("b", &q, 64, 256).unwrap_err();
        assert_eq!(e.limit, Limit::MaxVcpus);
        assert!(e.message.contains("cpu_count=1"), "{}", e.message);
        let e = check_build("b", &q, 1, 65536).unwrap_err();
        assert_eq!(e.limit, Limit::MaxMemory);
        // No quotas: anything the build request's own bounds allow.
        assert!(check_build("b", &TeamQuotas::default(), 64, 65536).is_ok());
    }

    #[test]
    fn concurrent_builds_stop_at_the_limit() {
        assert!(check_concurrent_builds("b", 1, 2).is_ok());
        let e = check_concurrent_builds("b", 2, 2).unwrap_err();
        assert_eq!(e.limit, Limit::ConcurrentBuilds);
        assert_eq!(e.limit.label(), "concurrent_builds");
    }

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        // 2 per second, burst 3, on a fake clock.
        let mut b = TokenBucket::full(3.0, 0);
        assert!(b.take(2000, 3.0, 0));
        assert!(b.take(2000, 3.0, 0));
        assert!(b.take(2000, 3.0, 0));
        assert!(!b.take(2000, 3.0, 0), "burst spent");
        assert!(!b.take(2000, 3.0, 400), "0.8 tokens after 400 ms");
        assert!(b.take(2000, 3.0, 500), "1 token after 500 ms");
        assert!(!b.take(2000, 3.0, 500));
        // A long pause refills only up to the burst.
        for _ in 0..3 {
            assert!(b.take(2000, 3.0, 60_000));
        }
        assert!(!b.take(2000, 3.0, 60_000));
        // A clock that steps back neither refills nor panics.
        assert!(!b.take(2000, 3.0, 59_000));
    }

    #[test]
    fn slow_rates_refill_slowly() {
        // 0.5 per second (one every 2 s), default burst ceil(0.5) = 1.
        let q = TeamQuotas {
            create_rate_milli: Some(500),
            ..Default::default()
        };
        let burst = burst_of(&q);
        assert_eq!(burst, 1.0);
        let mut b = TokenBucket::full(burst, 1_000);
        assert!(b.take(500, burst, 1_000));
        assert!(!b.take(500, burst, 2_999));
        assert!(b.take(500, burst, 3_000));
    }

    #[test]
    fn create_checks_name_the_limit_and_how_to_raise_it() {
        let q = TeamQuotas {
            max_sandboxes: Some(2),
            max_vcpus: Some(1),
            max_memory_mb: Some(256),
            max_timeout_secs: Some(60),
            ..Default::default()
        };
        let ok = Ask {
            vcpus: 1,
            memory_mb: 256,
            timeout_secs: 60,
        };
        check_create("t1", &q, 1, ok).unwrap();
        let e = check_create("t1", &q, 2, ok).unwrap_err();
        assert_eq!(e.limit, Limit::MaxSandboxes);
        assert!(e.message.contains("limit is 2"), "{e}");
        assert!(
            e.message
                .contains("bulkhead teams set-quota t1 --max-sandboxes")
        );
        let e = check_create("t1", &q, 0, Ask { vcpus: 2, ..ok }).unwrap_err();
        assert_eq!(e.limit, Limit::MaxVcpus);
        assert!(e.message.contains("--max-vcpus 2"), "{e}");
        let e = check_create(
            "t1",
            &q,
            0,
            Ask {
                memory_mb: 512,
                ..ok
            },
        )
        .unwrap_err();
        assert_eq!(e.limit, Limit::MaxMemory);
        let e = check_create(
            "t1",
            &q,
            0,
            Ask {
                timeout_secs: 61,
                ..ok
            },
        )
        .unwrap_err();
        assert_eq!(e.limit, Limit::MaxTimeout);
        assert!(e.message.contains("--max-timeout 61"), "{e}");
        // No quotas: anything goes.
        check_create("t1", &TeamQuotas::default(), 1000, Ask { vcpus: 64, ..ok }).unwrap();
    }

    #[test]
    fn credits_format_as_decimals() {
        assert_eq!(format_credits(0), "0.000000");
        assert_eq!(format_credits(1_500_000), "1.500000");
        assert_eq!(format_credits(-42), "-0.000042");
    }
}
