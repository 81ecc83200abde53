//! Tenancy: a sandbox belongs to its creator's team, and only keys of that team see or touch
//! it (E2B: team-scoped); a create is admitted by its team's credits, quotas and create rate.

use crate::sandbox::lifecycle::SandboxState;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::telemetry;
use crate::tenancy::quota::{self, Ask, QuotaError, TokenBucket};
use crate::tenancy::state::CreateSlot;
use crate::types::Caller;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// The team's sandboxes running now (paused ones hold no CPU or memory).
    pub(crate) fn team_running(&self, team: &str) -> i64 {
        self.live
            .lock()
            .values()
            .filter(|l| l.meter.team_id == team)
            .filter(|l| !matches!(l.state, SandboxState::Paused | SandboxState::Resuming))
            .count() as i64
    }

    async fn admit_team_inner(
        &self,
        caller: &Caller,
        ask: Ask,
        rate_limited: bool,
    ) -> Result<CreateSlot> {
        let team = &caller.team_id;
        // Read at each create: `bulkhead teams` changes apply to the next one.
        let Some(row) = self.store.get_team(team).await? else {
            return Ok(self.tenants.start_create(team));
        };
        if let Some(b) = row.credits_micro
            && b <= 0
        {
            return Err(QuotaError::credits(&row.name, b).into());
        }
        let slot = self.tenants.start_create(team);
        // This create is counted in `creating` already.
        let running = self.team_running(team) + self.tenants.creating(team) - 1;
        quota::check_create(&row.name, &row.quotas, running, ask)?;
        if rate_limited && let Some(rate) = row.quotas.create_rate_milli {
            let burst = quota::burst_of(&row.quotas);
            let now = now_ms();
            let mut buckets = self.tenants.buckets.lock().expect("buckets lock");
            let bucket = buckets
                .entry(team.clone())
                .or_insert_with(|| TokenBucket::full(burst, now));
            if !bucket.take(rate, burst, now) {
                return Err(QuotaError::rate(&row.name, rate).into());
            }
        }
        Ok(slot)
    }
}

/// A TTL change (set timeout, refresh, connect) checked against the team's longest.
pub(crate) async fn check_team_timeout(engine: &Engine, caller: &Caller, secs: u64) -> Result<()> {
    if let Some(row) = engine.store.get_team(&caller.team_id).await? {
        let r = quota::check_timeout(&row.name, &row.quotas, secs);
        if let Err(q) = &r {
            telemetry::refused(q.limit);
        }
        r?;
    }
    Ok(())
}

/// Refuses, as not found, a sandbox of another team: to other tenants it does not exist.
/// A sandbox this server does not know passes, for the verb to answer its own 404.
pub(crate) async fn authorize(engine: &Engine, caller: &Caller, id: &str) -> Result<()> {
    let id = ids::normalize_sandbox_id(id);
    let live = engine.live.lock().get(id).map(|l| l.meter.team_id.clone());
    let team = match live {
        Some(t) => Some(t),
        None => engine.store.get_sandbox(id).await?.map(|r| r.team_id),
    };
    match team {
        Some(t) if t != caller.team_id => Err(EngineError::SandboxNotFound(id.to_string())),
        _ => Ok(()),
    }
}

/// Admits a new running sandbox of the caller's team (a create, a fork, a resume): its
/// credits, its quotas, then (for creates) its create rate, in that order so a refused
/// request never spends a token. The slot counts it as running until it is tracked.
pub(crate) async fn admit_team(
    engine: &Engine,
    caller: &Caller,
    ask: Ask,
    rate_limited: bool,
) -> Result<CreateSlot> {
    let r = engine.admit_team_inner(caller, ask, rate_limited).await;
    if let Err(EngineError::Quota(q)) = &r {
        telemetry::refused(q.limit);
        tracing::info!(team = %caller.team_id, limit = q.limit.label(), "team limit refused a request");
    }
    r
}

/// A resume (or connect) of a paused sandbox starts it running again: admitted like a
/// create (credits, quotas), but not rate limited. A running one only has its TTL checked.
pub(crate) async fn admit_resume(
    engine: &Engine,
    caller: &Caller,
    id: &str,
    req: &crate::types::ResumeRequest,
) -> Result<()> {
    let id = ids::normalize_sandbox_id(id);
    let paused = engine
        .live
        .lock()
        .get(id)
        .filter(|l| l.state == SandboxState::Paused)
        .map(|l| (l.meter.vcpus, l.meter.memory_mb));
    let secs = req.timeout.unwrap_or(engine.cfg.default_timeout.as_secs());
    match paused {
        Some((vcpus, memory_mb)) => {
            let ask = Ask {
                vcpus,
                memory_mb,
                timeout_secs: secs,
            };
            admit_team(engine, caller, ask, false).await.map(drop)
        }
        None => match req.timeout {
            Some(s) => check_team_timeout(engine, caller, s).await,
            None => Ok(()),
        },
    }
}
