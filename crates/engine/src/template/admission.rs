//! Template builds count against their team: a build sandbox gets no more CPU or memory than
//! the team's own sandboxes may (`TeamQuotas`), and a team runs at most
//! `BuildLimits::max_builds_per_team` builds at once. Without this, a team limited to one small
//! sandbox could start any number of 64-vCPU, 64 GiB build sandboxes.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::telemetry;
use crate::template::types::{BuildRecord, BuildStatus, TemplateBuildError};
use crate::tenancy::quota::{self, QuotaError};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// A build's CPU and memory against its team's per-sandbox quotas (read at each call:
    /// `bulkhead teams set-quota` applies to the next build).
    pub(crate) async fn check_build_quotas(
        &self,
        team_id: &str,
        cpu_count: u32,
        memory_mb: u64,
    ) -> Result<()> {
        let Some(row) = self.store.get_team(team_id).await? else {
            return Ok(());
        };
        let r = quota::check_build(&row.name, &row.quotas, cpu_count.into(), memory_mb as i64);
        refused(r).map_err(Into::into)
    }

    /// Moves a waiting build to building if its team's quotas still allow its size and the team
    /// runs fewer builds than the limit. The count and the change happen under the builds lock,
    /// so two starts cannot both take a team's last place.
    pub(crate) async fn admit_build(&self, record: &BuildRecord) -> Result<()> {
        // One read of the team's row for both checks.
        let team_name = match self.store.get_team(&record.team_id).await? {
            Some(row) => {
                refused(quota::check_build(
                    &row.name,
                    &row.quotas,
                    record.cpu_count.into(),
                    record.memory_mb as i64,
                ))?;
                row.name
            }
            None => record.team_id.clone(),
        };
        let builds = self.builds.builds.lock().expect("builds");
        let running = builds
            .values()
            .filter(|b| b.team_id == record.team_id && b.build_id != record.build_id)
            .filter(|b| b.state.lock().expect("build state").status == BuildStatus::Building)
            .count();
        refused(quota::check_concurrent_builds(
            &team_name,
            running,
            self.cfg.build_limits.max_builds_per_team,
        ))?;
        let mut s = record.state.lock().expect("build state");
        if s.status != BuildStatus::Waiting {
            return Err(TemplateBuildError::Invalid(format!(
                "build {} was already started; request a new build",
                record.build_id
            ))
            .into());
        }
        s.status = BuildStatus::Building;
        Ok(())
    }
}

/// Counts a refusal in the metrics (as team-quota refusals of creates are).
fn refused(r: std::result::Result<(), QuotaError>) -> std::result::Result<(), QuotaError> {
    if let Err(q) = &r {
        telemetry::refused(q.limit);
        tracing::info!(team = %q.team, limit = q.limit.label(), "team limit refused a template build");
    }
    r
}
