//! Metrics: a sandbox's resource usage with the CPU share computed since the previous sample,
//! sampled every [`crate::config::EngineConfig::metrics_interval`] into a bounded series per
//! sandbox (E2B keeps one sample per 5 s and `get_metrics(start, end)` returns the range).

use std::collections::VecDeque;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::clock::{ms_to_dt, now_ms};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::{Operation, SandboxState};
use crate::types::{Caller, Usage};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Appends to a series, dropping the oldest sample past [`MAX_SAMPLES`].
fn push_sample(samples: &mut VecDeque<Usage>, usage: Usage) {
    if samples.len() >= MAX_SAMPLES {
        samples.pop_front();
    }
    samples.push_back(usage);
}

/// Samples kept per sandbox: one hour at E2B's 5 s interval (about 50 KiB); older ones drop.
pub(crate) const MAX_SAMPLES: usize = 720;

impl Engine {
    /// A fresh sample of the sandbox's usage, also appended to its series.
    pub async fn usage(&self, caller: &Caller, id: &str) -> Result<Usage> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        self.sample(id).await
    }

    /// Every running sandbox is sampled every interval: the live set and the driver answer it;
    /// the store is read only for a limit the driver does not report.
    async fn sample(&self, id: &str) -> Result<Usage> {
        let (id, _) = self.enter(id, Operation::Metrics)?;
        let handle = self.handle(id)?;
        let u = self
            .node
            .usage(&handle)
            .await
            .map_err(EngineError::driver(Operation::Metrics))?;
        let row = if u.mem_limit_bytes == 0 || u.disk_total_bytes == 0 {
            self.store.get_sandbox(id).await?
        } else {
            None
        };
        let now = now_ms();
        let mut live = self.live.lock();
        let Some(l) = live.get_mut(id) else {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        };
        let (prev_ns, prev_ms) = l.last_cpu;
        let wall_ns = ((now - prev_ms).max(1) as f64) * 1e6;
        let pct =
            (u.cpu_usage_ns.saturating_sub(prev_ns) as f64 / wall_ns / l.cpu_count.max(1) as f64
                * 100.0)
                .clamp(0.0, 100.0);
        let mb = |f: fn(&bulkhead_store::SandboxRow) -> i64| {
            row.as_ref().map_or(0, |r| f(r).max(0) as u64 * 1024 * 1024)
        };
        let usage = Usage {
            timestamp: ms_to_dt(now),
            cpu_count: l.cpu_count,
            cpu_used_pct: (pct * 100.0).round() / 100.0,
            mem_used: u.mem_used_bytes,
            mem_total: if u.mem_limit_bytes > 0 {
                u.mem_limit_bytes
            } else {
                mb(|r| r.memory_mb)
            },
            mem_cache: u.mem_cache_bytes,
            disk_used: u.disk_used_bytes,
            disk_total: if u.disk_total_bytes > 0 {
                u.disk_total_bytes
            } else {
                mb(|r| r.disk_size_mb)
            },
        };
        l.last_cpu = (u.cpu_usage_ns, now);
        push_sample(&mut l.samples, usage.clone());
        Ok(usage)
    }

    /// The sandbox's samples from `start` to `end` (Unix seconds, both inclusive; open when
    /// absent), oldest first. A sandbox younger than one interval gets a fresh sample, so the
    /// series is never empty for a running sandbox asked without bounds.
    pub async fn usage_series(
        &self,
        caller: &Caller,
        id: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<Vec<Usage>> {
        if let (Some(s), Some(e)) = (start, end)
            && s > e
        {
            return Err(EngineError::BadRequest(format!(
                "Invalid time range for metrics: start ({s}) is after end ({e})"
            )));
        }
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let row = self.running_row(id, Operation::Metrics).await?;
        let empty = self
            .live
            .lock()
            .get(&row.id)
            .is_none_or(|l| l.samples.is_empty());
        if empty {
            self.usage(caller, &row.id).await?;
        }
        let in_range = |t: &DateTime<Utc>| {
            let secs = t.timestamp();
            start.is_none_or(|s| secs >= s) && end.is_none_or(|e| secs <= e)
        };
        Ok(self.live.lock().get(&row.id).map_or_else(Vec::new, |l| {
            l.samples
                .iter()
                .filter(|u| in_range(&u.timestamp))
                .cloned()
                .collect()
        }))
    }

    /// Usage of several sandboxes (the batch metrics call): those not running are left out,
    /// and other failures are logged rather than failing the whole batch.
    pub async fn usage_many(&self, caller: &Caller, ids: &[&str]) -> Vec<(String, Usage)> {
        let mut out = Vec::new();
        for id in ids {
            match self.usage(caller, id).await {
                Ok(u) => out.push((id.to_string(), u)),
                Err(EngineError::SandboxNotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = &e as &dyn std::error::Error, "batch metrics: leaving a sandbox out");
                }
            }
        }
        out
    }

    /// Samples every running sandbox each interval, for the metrics series.
    pub(crate) async fn sampler(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.metrics_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => return,
            }
            let running: Vec<String> = self
                .live
                .lock()
                .iter()
                .filter(|(_, l)| l.state == SandboxState::Running && l.handle.is_some())
                .map(|(id, _)| id.clone())
                .collect();
            for id in running {
                // A sandbox that stopped or paused meanwhile is simply skipped.
                if let Err(e) = self.sample(&id).await {
                    tracing::debug!(sandbox = %id, error = &e as &dyn std::error::Error, "metrics sample skipped");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_keeps_the_newest_samples() {
        let mut samples = VecDeque::new();
        for i in 0..MAX_SAMPLES + 10 {
            let u = Usage {
                timestamp: ms_to_dt(i as i64 * 5000),
                cpu_count: 1,
                cpu_used_pct: 0.0,
                mem_used: 0,
                mem_total: 0,
                mem_cache: 0,
                disk_used: 0,
                disk_total: 0,
            };
            push_sample(&mut samples, u);
        }
        assert_eq!(samples.len(), MAX_SAMPLES);
        assert_eq!(samples[0].timestamp, ms_to_dt(10 * 5000));
    }
}
