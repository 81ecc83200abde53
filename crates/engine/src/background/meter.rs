//! Metering: every interval (`--metering-interval`) each live sandbox's usage since its last
//! record is written to the store, with its cost drawn from its team's credits in the same
//! transaction. A crash loses at most the interval in progress; a restart continues each
//! re-adopted sandbox from its last record (so the time the server was down is counted, as the
//! sandbox ran). A team whose credits stay at or below zero past the grace has its running
//! sandboxes paused (or killed, if the operator says so).

use std::sync::Arc;

use crate::sandbox::lifecycle::SandboxState;
use bulkhead_store::UsageRow;

use crate::tenancy::metering::UsageFilter;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::disk_usage::{Measure, tree_bytes};
use crate::sandbox::metered::holds_checkpoint;
use crate::tenancy::metering::{self, ExhaustedAction, UsageReport};
use crate::types::Caller;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    pub(crate) async fn metering_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.metering.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.meter(now_ms()).await {
                tracing::error!(
                    error = &e as &dyn std::error::Error,
                    "recording usage failed; it is retried at the next interval"
                );
            }
        }
    }

    /// One metering pass at `now_ms`: records every live sandbox's usage since its last record,
    /// draws its cost, and stops the running sandboxes of teams out of credits past the grace.
    pub async fn meter(self: &Arc<Self>, now_ms: i64) -> Result<()> {
        let balances = {
            let _one = self.tenants.meter_lock.lock().await;
            self.measure_checkpoints().await;
            let segments: Vec<(UsageRow, f64)> = {
                let live = self.live.lock();
                live.iter()
                    .filter(|(_, l)| l.state != SandboxState::Starting)
                    .filter_map(|(id, l)| {
                        let paused = holds_checkpoint(l.state);
                        let bytes = l.meter.paused_bytes.unwrap_or(0);
                        metering::segment(
                            id,
                            &l.meter,
                            paused,
                            bytes,
                            now_ms,
                            &self.cfg.metering.prices,
                        )
                    })
                    .collect()
            };
            if segments.is_empty() {
                return Ok(());
            }
            let rows: Vec<UsageRow> = segments.iter().map(|(r, _)| r.clone()).collect();
            let balances = self.store.record_usage(&rows).await?;
            let mut live = self.live.lock();
            for (row, carry) in segments {
                if let Some(l) = live.get_mut(&row.sandbox_id) {
                    l.meter.since_ms = row.end_ms;
                    l.meter.carry = carry;
                }
            }
            balances
        };
        let grace = self.cfg.metering.grace;
        let due: Vec<String> = {
            let mut ex = self.tenants.exhaustion.lock().expect("exhaustion lock");
            balances
                .iter()
                .filter(|(team, b)| ex.observe(team, **b, now_ms, grace))
                .map(|(team, _)| team.clone())
                .collect()
        };
        for team in due {
            self.stop_team(&team).await;
        }
        Ok(())
    }

    /// Measures the checkpoint of each paused sandbox not measured yet (once per pause), and
    /// forgets the size of those running again.
    async fn measure_checkpoints(&self) {
        let todo: Vec<(String, std::path::PathBuf)> = {
            let mut live = self.live.lock();
            let mut todo = Vec::new();
            for (id, l) in live.iter_mut() {
                if !holds_checkpoint(l.state) {
                    l.meter.paused_bytes = None;
                } else if l.meter.paused_bytes.is_none()
                    && let Some(p) = &l.extra.paused
                {
                    todo.push((id.clone(), p.dir.clone()));
                }
            }
            todo
        };
        for (id, dir) in todo {
            let bytes = tokio::task::spawn_blocking(move || tree_bytes(&dir, Measure::Allocated))
                .await
                .unwrap_or(0);
            if let Some(l) = self.live.lock().get_mut(&id) {
                l.meter.paused_bytes = Some(bytes);
            }
        }
    }

    /// After a restart: each re-adopted sandbox is metered on from its last record.
    pub(crate) async fn resume_metering(&self) -> Result<()> {
        let ids: Vec<String> = self.live.lock().keys().cloned().collect();
        self.resume_metering_of(&ids).await
    }

    /// [`Self::resume_metering`] for sandboxes `ids` only (taken over from another replica).
    pub(crate) async fn resume_metering_of(&self, ids: &[String]) -> Result<()> {
        let until = self.store.metered_until(ids).await?;
        let mut live = self.live.lock();
        for (id, end) in until {
            if let Some(l) = live.get_mut(&id) {
                l.meter.since_ms = l.meter.since_ms.max(end);
            }
        }
        Ok(())
    }

    /// Pauses (or kills) every running sandbox of a team out of credits.
    async fn stop_team(self: &Arc<Self>, team: &str) {
        let running: Vec<String> = self
            .live
            .lock()
            .iter()
            .filter(|(_, l)| l.meter.team_id == team && l.state == SandboxState::Running)
            .map(|(id, _)| id.clone())
            .collect();
        let caller = Caller {
            key_id: "credits".into(),
            team_id: team.to_owned(),
        };
        for id in running {
            match self.cfg.metering.on_exhausted {
                ExhaustedAction::Pause => {
                    tracing::warn!(sandbox = %id, team, "team is out of credits: pausing its sandbox");
                    if let Err(e) = self.pause(&caller, &id, true).await {
                        tracing::error!(sandbox = %id, team, error = &e as &dyn std::error::Error, "pausing a sandbox of a team out of credits failed; it keeps running");
                    }
                }
                ExhaustedAction::Kill => {
                    tracing::warn!(sandbox = %id, team, "team is out of credits: killing its sandbox");
                    crate::sandbox::kill::finish(self, &id, "credits exhausted").await;
                }
            }
        }
    }

    /// `GET /bulkhead/v1/usage`: the caller's team's usage, optionally of one key or sandbox,
    /// within `[from_ms, to_ms)`.
    pub async fn usage_report(
        &self,
        caller: &Caller,
        mut filter: UsageFilter,
    ) -> Result<UsageReport> {
        if let (Some(f), Some(t)) = (filter.from_ms, filter.to_ms)
            && f > t
        {
            return Err(EngineError::BadRequest(format!(
                "Invalid time range for usage: start ({f}) is after end ({t})"
            )));
        }
        filter.team_id = Some(caller.team_id.clone());
        let _one = self.tenants.meter_lock.lock().await;
        Ok(metering::report(&self.store, &filter).await?)
    }
}
