//! An API replica's part among several (`bulkhead api`; see `cluster::replicas` in the engine):
//! its heartbeat into the `replicas` table, and every second the round that gives up what
//! other replicas took from it and takes over the sandboxes of silent replicas.
//!
//! The two run apart so that a long take-over (each adopted sandbox's agent is asked for its
//! version) never delays a heartbeat past the 5 s after which the others would take this
//! replica's sandboxes; the round only runs while the last heartbeat is recent.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bulkhead_engine::Engine;
use bulkhead_engine::cluster::replicas::{BEAT, DEAD_AFTER};
use bulkhead_engine::cluster::{Beat, Membership};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// This replica's membership, shared by its heartbeat and the server's clean stop.
#[derive(Clone)]
pub(crate) struct Replica {
    membership: Arc<Mutex<Membership>>,
    /// Unix ms of the last accepted heartbeat (0: none yet).
    last_beat: Arc<AtomicI64>,
}

impl Replica {
    /// Registers (the first beat) before the engine starts, so that the sandboxes this id
    /// owned are not taken while it recovers them.
    pub(crate) async fn register(
        mut membership: Membership,
    ) -> Result<Self, bulkhead_engine::cluster::ReplicaError> {
        let beat = membership.beat(now_ms()).await?;
        tracing::info!(replica = %membership.id(), epoch = beat.epoch(), "API replica registered");
        Ok(Replica {
            membership: Arc::new(Mutex::new(membership)),
            last_beat: Arc::new(AtomicI64::new(now_ms())),
        })
    }

    /// Starts the heartbeat and the take-over round.
    pub(crate) fn start(&self, engine: Arc<Engine>) -> Vec<JoinHandle<()>> {
        let beats = {
            let me = self.clone();
            tokio::spawn(async move { me.heartbeat_loop().await })
        };
        let rounds = {
            let me = self.clone();
            tokio::spawn(async move { me.takeover_loop(engine).await })
        };
        vec![beats, rounds]
    }

    /// A clean stop: the other replicas take this one's sandboxes at once.
    pub(crate) async fn retire(&self) {
        self.membership.lock().await.retire().await;
    }

    async fn heartbeat_loop(self) {
        let mut tick = tokio::time::interval(BEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut membership = self.membership.lock().await;
            match membership.beat(now_ms()).await {
                Ok(Beat::Registered { epoch, previous }) => {
                    tracing::warn!(replica = %membership.id(), epoch, ?previous, "API replica registered again; giving up the sandboxes others took meanwhile");
                    self.last_beat.store(now_ms(), Ordering::Relaxed);
                }
                Ok(Beat::Reported { .. }) => self.last_beat.store(now_ms(), Ordering::Relaxed),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "API replica heartbeat failed; retrying"
                ),
            }
        }
    }

    async fn takeover_loop(self, engine: Arc<Engine>) {
        let mut tick = tokio::time::interval(BEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let quiet_ms = now_ms() - self.last_beat.load(Ordering::Relaxed);
            if quiet_ms > DEAD_AFTER.as_millis() as i64 {
                // Cut off from the store: others may be taking this replica's sandboxes; it
                // takes nothing until its heartbeat is back (and then gives those up).
                continue;
            }
            if let Err(e) = engine.release_taken().await {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "checking which sandboxes this replica still drives failed; retrying"
                );
            }
            match engine.take_over(None).await {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(sandboxes = n, "took over sandboxes of silent API replicas")
                }
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "taking over sandboxes of silent API replicas failed; retrying"
                ),
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
