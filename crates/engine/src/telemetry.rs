//! What the engine reports to Prometheus (through the `metrics` facade: without an installed
//! recorder every call is a no-op, so tests and embedders pay nothing). Counters and
//! histograms are recorded where things happen; the levels (sandboxes by state, pool sizes,
//! creates in flight) are read at scrape time by [`Engine::gauges`], so they can never drift
//! from the truth.

use std::time::Duration;

use crate::engine::Engine;
use crate::error::EngineError;

/// Metric names, shared with the exporter (which sets the histogram buckets by name).
pub mod names {
    pub const CREATES: &str = "bulkhead_sandbox_creates_total";
    pub const CREATE_SECONDS: &str = "bulkhead_sandbox_create_seconds";
    pub const POOL_CLAIMS: &str = "bulkhead_pool_claims_total";
    pub const STOPS: &str = "bulkhead_sandbox_stops_total";
    pub const SANDBOXES: &str = "bulkhead_sandboxes";
    pub const POOL_MEMBERS: &str = "bulkhead_pool_members";
    pub const CREATES_IN_FLIGHT: &str = "bulkhead_creates_in_flight";
    pub const REFUSALS: &str = "bulkhead_quota_refusals_total";
}

/// A team limit refused a request: which limit (`credits`, `create_rate`, `max_sandboxes`,
/// ...). Never labelled by team: tenants come and go, series should not.
pub(crate) fn refused(limit: crate::tenancy::quota::Limit) {
    metrics::counter!(names::REFUSALS, "limit" => limit.label()).increment(1);
}

/// A create ended: its outcome (`ok` or the error's kind) and, when it succeeded, how long the
/// caller waited (admission queue included).
pub(crate) fn create_done(template: &str, result: Result<(), &EngineError>, took: Duration) {
    let outcome = match result {
        Ok(()) => "ok",
        Err(e) => error_kind(e),
    };
    metrics::counter!(names::CREATES, "template" => template.to_owned(), "outcome" => outcome)
        .increment(1);
    if result.is_ok() {
        metrics::histogram!(names::CREATE_SECONDS, "template" => template.to_owned())
            .record(took.as_secs_f64());
    }
}

/// A create took a warm pool member (`hit`) or had to start one itself (`miss`).
pub(crate) fn pool_claim(template: &str, hit: bool) {
    let result = if hit { "hit" } else { "miss" };
    metrics::counter!(names::POOL_CLAIMS, "template" => template.to_owned(), "result" => result)
        .increment(1);
}

/// A sandbox ended, and why: one of the engine's own few reasons (`killed`, `timeout`,
/// `exited`, ...), never caller input.
pub(crate) fn stopped(reason: &str) {
    metrics::counter!(names::STOPS, "reason" => reason.to_owned()).increment(1);
}

/// A short, stable label for an error (never its message: that could name sandboxes).
pub(crate) fn error_kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::TooManyCreates { .. } => "too_many_creates",
        EngineError::Capacity => "capacity",
        EngineError::TemplateNotFound(_) | EngineError::SnapshotNotFound(_) => "not_found",
        EngineError::BadRequest(_) => "bad_request",
        EngineError::Driver { .. } => "driver",
        EngineError::Agent { .. } | EngineError::AgentTooOld { .. } => "agent",
        EngineError::Network { .. } => "network",
        EngineError::Store(_) => "store",
        EngineError::Volume(_) | EngineError::VolumeFs(_) => "volume",
        EngineError::Quota(_) => "quota",
        EngineError::Idempotency(_) => "idempotency",
        EngineError::RestoreFailed { .. } | EngineError::Checkpoint { .. } => "checkpoint",
        _ => "other",
    }
}

/// The levels `/metrics` shows, read when it is scraped.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// (state, template, count) of every sandbox that is not dead, from the store.
    pub sandboxes: Vec<(String, String, i64)>,
    /// (template, warm members).
    pub pools: Vec<(String, usize)>,
    pub creates_in_flight: usize,
}

impl Engine {
    /// The current levels, for a scrape.
    pub async fn gauges(&self) -> Result<Gauges, EngineError> {
        let sandboxes = self.store.count_sandboxes_by_state().await?;
        let mut pools: Vec<(String, usize)> = self
            .templates()
            .iter()
            .map(|t| (t.id.clone(), self.pool_len(&t.id)))
            .collect();
        pools.sort();
        Ok(Gauges {
            sandboxes,
            pools,
            creates_in_flight: self.admission.in_flight(),
        })
    }
}
