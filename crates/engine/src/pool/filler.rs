//! The warm-pool filler: keeps each template's pool at the size its demand asks for (the
//! policy is `pool_policy`), one start at a time and yielding to bursts of creates so refills
//! do not take the CPU running sandboxes need; stops surplus members when demand falls, and
//! every member on shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::pool::policy::PoolLimits;
use crate::types::TemplateInfo;

/// How long a template whose start failed is left alone before the next try.
const START_FAILURE_BACKOFF: Duration = Duration::from_secs(2);
/// How often an idle filler looks again (demand decays with time, not only with events).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// The filler's memory between passes.
#[derive(Default)]
struct FillerState {
    /// Per template: when its last start failed, and when a member was last stopped.
    failed_at: HashMap<String, Instant>,
    shrunk_at: HashMap<String, Instant>,
}

impl Engine {
    pub(crate) async fn pool_filler(self: Arc<Self>) {
        let mut st = FillerState::default();
        loop {
            let mut worked = false;
            // One member per template per pass: templates are served in turn.
            for t in self.templates() {
                if self.shutdown.is_cancelled() {
                    return;
                }
                match self.pool_step(&t, &mut st).await {
                    Step::Done => return,
                    Step::Worked => worked = true,
                    Step::Idle => {}
                }
            }
            if !worked {
                tokio::select! {
                    _ = self.pools.wakeup.notified() => {}
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                    _ = self.shutdown.cancelled() => return,
                }
            }
        }
    }

    /// Grow or shrink `t`'s pool by at most one member.
    async fn pool_step(&self, t: &TemplateInfo, st: &mut FillerState) -> Step {
        let now = Instant::now();
        let have = self.pool_len(&t.id);
        let target = self.pool_target(&t.id, now);
        if crate::pool::policy::should_shrink(
            have,
            target,
            st.shrunk_at.get(&t.id).map(|at| now - *at),
        ) {
            st.shrunk_at.insert(t.id.clone(), now);
            // The newest member goes: the oldest are claimed first and keep rotating.
            for h in self.node.pool_take_surplus(&t.id, 1).await {
                let _ = self.node.stop(&h).await;
            }
            return Step::Idle;
        }
        if have >= target {
            return Step::Idle;
        }
        if st
            .failed_at
            .get(&t.id)
            .is_some_and(|at| now - *at < START_FAILURE_BACKOFF)
        {
            return Step::Idle;
        }
        self.wait_for_quiet().await;
        if self.shutdown.is_cancelled() {
            return Step::Done;
        }
        // An empty pool means demand is ahead of the filler: full priority then.
        let member = if have > 0 {
            self.new_background_pool_member(t).await
        } else {
            self.new_pool_member(t).await
        };
        match member {
            Ok(h) if !crate::template::registry::is_pooled_tree(self, t) => {
                // The template was rebuilt while this member started from its old tree.
                let _ = self.node.stop(&h).await;
                Step::Worked
            }
            Ok(h) if self.shutdown.is_cancelled() => {
                // Started while shutting down: nobody will claim it.
                let _ = self.node.stop(&h).await;
                Step::Done
            }
            Ok(h) => {
                self.node.pool_put(&t.id, h).await;
                Step::Worked
            }
            Err(e) => {
                tracing::warn!(template = %t.id, error = %e, "warm pool: starting a sandbox failed");
                st.failed_at.insert(t.id.clone(), now);
                Step::Idle
            }
        }
    }

    /// Let a burst of creates pass before a refill start (bounded, see `pool_policy`).
    async fn wait_for_quiet(&self) {
        let t0 = Instant::now();
        while !crate::pool::policy::refill_may_start(self.admission.in_flight(), t0.elapsed()) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// The size `template`'s pool should have now.
    pub(crate) fn pool_target(&self, template: &str, now: Instant) -> usize {
        let limits: PoolLimits = self.cfg.pools.limits(template);
        let level = self
            .pools
            .demand
            .lock()
            .expect("demand lock")
            .entry(template.to_string())
            .or_default()
            .level(now);
        crate::pool::policy::target_size(limits, level)
    }

    /// Stop background work and warm-pool members. Running sandboxes keep running so the next
    /// server start re-adopts them.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let filler = self.pools.filler.lock().expect("filler lock").take();
        if let Some(f) = filler {
            // Lets a start in flight finish and stop its sandbox (bounded by the driver's own
            // start timeout).
            let _ = f.await;
        }
        for h in self.node.pool_drain(None).await {
            let _ = self.node.stop(&h).await;
        }
    }

    pub fn pool_len(&self, template: &str) -> usize {
        self.node.pool_stock().get(template).copied().unwrap_or(0)
    }
}

/// Count one create of `template` toward its pool's demand (the filler is woken when the
/// create is done, so refills do not compete with it).
pub(crate) fn record_pool_demand(engine: &Engine, template: &str) {
    engine
        .pools
        .demand
        .lock()
        .expect("demand lock")
        .entry(template.to_string())
        .or_default()
        .record(Instant::now());
}

/// What one filler step did.
enum Step {
    /// Started a member (look again at once).
    Worked,
    /// Nothing to start now (at target, backing off, or shrunk by one).
    Idle,
    /// Shutting down.
    Done,
}
