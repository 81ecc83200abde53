//! The reaper: ends (or, by their lifecycle, pauses) sandboxes whose TTL passed, deletes
//! paused sandboxes past the paused retention, and prunes old records and audit events.

use std::sync::Arc;

use crate::sandbox::lifecycle::SandboxState;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::sandbox::lifecycle::Operation;
use crate::types::OnTimeout;

/// How long a sandbox whose auto-pause failed runs on before the next try.
const AUTO_PAUSE_RETRY_MS: i64 = 60_000;

impl Engine {
    /// Start the reaper, the metrics sampler, the usage meter and the warm-pool filler.
    pub fn start_background(self: &Arc<Self>) {
        let engine = Arc::clone(self);
        tokio::spawn(async move { engine.reaper().await });
        let engine = Arc::clone(self);
        tokio::spawn(async move { engine.sampler().await });
        let engine = Arc::clone(self);
        tokio::spawn(engine.metering_loop());
        let engine = Arc::clone(self);
        let filler = tokio::spawn(async move { engine.pool_filler().await });
        *self.pools.filler.lock().expect("filler lock") = Some(filler);
    }

    /// One pass: running sandboxes past their TTL are killed, or paused when their lifecycle
    /// says so; paused ones past the retention are deleted with their checkpoint.
    pub(crate) async fn reap(self: &Arc<Self>, now: i64) {
        let retention = self.cfg.paused_retention.as_millis() as i64;
        let mut kill = Vec::new();
        let mut pause = Vec::new();
        let mut expired_paused = Vec::new();
        for (id, l) in self.live.lock().iter() {
            match l.state {
                SandboxState::Running if l.end_at_ms <= now => {
                    if l.extra.lifecycle.on_timeout == OnTimeout::Pause {
                        pause.push((id.clone(), l.extra.lifecycle.pause_memory));
                    } else {
                        kill.push(id.clone());
                    }
                }
                SandboxState::Paused
                    if l.extra
                        .paused
                        .as_ref()
                        .is_some_and(|p| p.at_ms.saturating_add(retention) <= now) =>
                {
                    expired_paused.push(id.clone());
                }
                _ => {}
            }
        }
        for id in kill {
            crate::sandbox::kill::finish(self, &id, "timeout").await;
        }
        for id in expired_paused {
            tracing::info!(sandbox = %id, "paused sandbox reached the paused retention");
            crate::sandbox::kill::finish(self, &id, "paused retention expired").await;
        }
        for (id, memory) in pause {
            // Entered here, so the next pass does not start a second pause of it.
            if self.live.enter(&id, Operation::Pause).is_err() {
                continue;
            }
            let engine = Arc::clone(self);
            tokio::spawn(async move {
                if let Err(e) =
                    crate::sandbox::pause::pause_entered(&engine, &id, memory, Operation::Pause)
                        .await
                {
                    // It keeps running; try again in a minute rather than on every pass.
                    tracing::error!(sandbox = %id, error = &e as &dyn std::error::Error, "auto-pause at the end of the TTL failed");
                    if let Some(l) = engine.live.lock().get_mut(&id) {
                        l.end_at_ms = now_ms() + AUTO_PAUSE_RETRY_MS;
                    }
                }
            });
        }
    }

    pub(crate) async fn reaper(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.reap_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_gc = now_ms();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => return,
            }
            let now = now_ms();
            self.reap(now).await;
            if now - last_gc > 60_000 {
                last_gc = now;
                let cutoff = now - self.cfg.dead_retention.as_millis() as i64;
                if let Err(e) = self.store.delete_dead_sandboxes_before(cutoff).await {
                    tracing::warn!(error = %e, "pruning dead sandbox records failed");
                }
                let cutoff = now - self.cfg.audit_retention.as_millis() as i64;
                if let Err(e) = self.store.delete_egress_events_before(cutoff).await {
                    tracing::warn!(error = %e, "pruning egress audit events failed");
                }
            }
        }
    }
}
