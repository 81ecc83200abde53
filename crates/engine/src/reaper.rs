//! The reaper: ends sandboxes whose TTL passed and prunes old records and audit events.

use std::sync::Arc;

use crate::clock::now_ms;
use crate::engine::Engine;

impl Engine {
    /// Start the reaper and the warm-pool filler.
    pub fn start_background(self: &Arc<Self>) {
        let engine = Arc::clone(self);
        tokio::spawn(async move { engine.reaper().await });
        let engine = Arc::clone(self);
        let filler = tokio::spawn(async move { engine.pool_filler().await });
        *self.filler.lock().expect("filler lock") = Some(filler);
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
            let expired: Vec<String> = self
                .live
                .lock()
                .iter()
                .filter(|(_, l)| l.end_at_ms <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                self.finish(&id, "timeout").await;
            }
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
