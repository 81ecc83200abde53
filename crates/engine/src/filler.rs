//! The warm-pool filler: keeps `pool_size` started, anonymous sandboxes per template, and stops them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use crate::driver::DriverHandle;
use crate::engine::Engine;

impl Engine {
    pub(crate) async fn pool_filler(self: Arc<Self>) {
        loop {
            for t in self.templates() {
                loop {
                    if self.shutdown.is_cancelled() {
                        return;
                    }
                    let have = self
                        .pools
                        .lock()
                        .expect("pool lock")
                        .get(&t.id)
                        .map_or(0, |q| q.len());
                    if have >= self.cfg.pool_size {
                        break;
                    }
                    match self.start_pool_member(&t.spec(), have).await {
                        Ok(h) if self.shutdown.is_cancelled() => {
                            // Started while shutting down: nobody will claim it.
                            let _ = self.driver.stop(&h).await;
                            return;
                        }
                        Ok(h) => self
                            .pools
                            .lock()
                            .expect("pool lock")
                            .entry(t.id.clone())
                            .or_default()
                            .push_back(h),
                        Err(e) => {
                            tracing::warn!(template = %t.id, error = %e, "warm pool: starting a sandbox failed");
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            break;
                        }
                    }
                }
            }
            tokio::select! {
                _ = self.pool_wakeup.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Start one pool member; `have`: how many the pool holds now. While it holds some, nobody
    /// waits for this one: it starts at background CPU priority and never competes with the
    /// sandboxes in use (a just-claimed sandbox's first command above all). An empty pool means
    /// demand is ahead of the filler: full priority then.
    async fn start_pool_member(
        &self,
        spec: &crate::driver::SandboxSpec,
        have: usize,
    ) -> Result<DriverHandle, crate::driver::DriverError> {
        if have > 0 {
            self.driver.start_warm(spec).await
        } else {
            self.driver.start(spec).await
        }
    }

    /// Stop background work and warm-pool members. Running sandboxes keep running so the next
    /// server start re-adopts them.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let filler = self.filler.lock().expect("filler lock").take();
        if let Some(f) = filler {
            // Lets a start in flight finish and stop its sandbox (bounded by the driver's own
            // start timeout).
            let _ = f.await;
        }
        let pooled: Vec<DriverHandle> = self
            .pools
            .lock()
            .expect("pool lock")
            .drain()
            .flat_map(|(_, q)| q)
            .collect();
        for h in pooled {
            let _ = self.driver.stop(&h).await;
        }
    }

    pub fn pool_len(&self, template: &str) -> usize {
        self.pools
            .lock()
            .expect("pool lock")
            .get(template)
            .map_or(0, |q| q.len())
    }
}
