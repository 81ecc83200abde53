//! Metrics: a sandbox's resource usage with the CPU share computed since the previous sample.

use crate::clock::{ms_to_dt, now_ms};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::lifecycle::Operation;
use crate::types::{Caller, Usage};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    pub async fn usage(&self, _caller: &Caller, id: &str) -> Result<Usage> {
        let row = self.running_row(id, Operation::Metrics).await?;
        let handle = self.handle(&row.id)?;
        let u = self
            .driver
            .usage(&handle)
            .await
            .map_err(EngineError::driver(Operation::Metrics))?;
        let now = now_ms();
        let mut pct = 0.0;
        if let Some(l) = self.live.lock().get_mut(&row.id) {
            let (prev_ns, prev_ms) = l.last_cpu;
            let wall_ns = ((now - prev_ms).max(1) as f64) * 1e6;
            pct = (u.cpu_usage_ns.saturating_sub(prev_ns) as f64
                / wall_ns
                / l.cpu_count.max(1) as f64
                * 100.0)
                .clamp(0.0, 100.0);
            l.last_cpu = (u.cpu_usage_ns, now);
        }
        Ok(Usage {
            timestamp: ms_to_dt(now),
            cpu_count: row.cpu_count,
            cpu_used_pct: (pct * 100.0).round() / 100.0,
            mem_used: u.mem_used_bytes,
            mem_total: if u.mem_limit_bytes > 0 {
                u.mem_limit_bytes
            } else {
                row.memory_mb as u64 * 1024 * 1024
            },
            mem_cache: u.mem_cache_bytes,
            disk_used: u.disk_used_bytes,
            disk_total: if u.disk_total_bytes > 0 {
                u.disk_total_bytes
            } else {
                row.disk_size_mb as u64 * 1024 * 1024
            },
        })
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
}
