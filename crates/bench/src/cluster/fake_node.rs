//! [`FakeNode`]: a cluster member whose start is a fixed delay and no CPU, so that what the
//! benchmark measures is the control plane. It is the engine's own [`LocalNode`] over the fake
//! driver (`FakeDriver::start_delay`: a sleep), with two things added in front of it:
//!
//! - **E2B's node admission** ("max-starting-instances-per-node = 3"): at most
//!   `max_starting` starts run at once, and one more is refused with
//!   [`StartError::NoFreeSlot`], the capacity refusal a real node's driver answers when its
//!   slots are taken and the router moves past. While [`FakeNode::set_full`] is on, every
//!   start is refused that way (a node with no room at all).
//! - **a stopwatch**: the time spent inside each node call is added up per request id (the
//!   engine carries a create's id into every node call it makes, as it does for log lines), so
//!   the benchmark can take the node's share out of a create's latency. On a real cluster
//!   those calls run on the node's machine; what is left is the API's own work.
//!
//! A leaf: it knows the engine's traits and nothing else of the benchmark.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bulkhead_engine::driver::{
    AgentStream, Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, DriverError,
    DriverHandle, FileChange, ResourceUsage, RestoreOptions, SandboxSpec, StartError,
};
use bulkhead_engine::testing::FakeDriver;
use bulkhead_engine::{AgentCallError, AgentPath, LocalNode, NetworkError, Node};
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;

pub(crate) struct FakeNode {
    local: Arc<LocalNode>,
    max_starting: u32,
    starting: AtomicU32,
    full: AtomicBool,
    /// Starts that returned a sandbox, and starts refused for capacity.
    pub(crate) started: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// Request id → time spent inside this node's calls on its behalf.
    spent: Mutex<HashMap<String, Duration>>,
}

/// Gives a start's admission slot back when the start ends, however it ends.
struct Starting<'a>(&'a AtomicU32);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FakeNode {
    /// A node whose starts take `start` (asleep) and of which `max_starting` run at once.
    pub(crate) fn new(start: Duration, max_starting: u32) -> Arc<Self> {
        let driver = FakeDriver::default();
        *driver.start_delay.lock().expect("start delay lock") = start;
        Arc::new(FakeNode {
            local: LocalNode::new(Arc::new(driver)),
            max_starting,
            starting: AtomicU32::new(0),
            full: AtomicBool::new(false),
            started: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            spent: Mutex::new(HashMap::new()),
        })
    }

    /// Refuse every start (a full node), or take starts again.
    pub(crate) fn set_full(&self, full: bool) {
        self.full.store(full, Ordering::SeqCst);
    }

    /// The time this node spent on request `id`'s calls, forgotten once read.
    pub(crate) fn take_spent(&self, id: &str) -> Duration {
        self.spent
            .lock()
            .expect("stopwatch lock")
            .remove(id)
            .unwrap_or_default()
    }

    /// Take an admission slot, or refuse as a full real node does.
    fn admit(&self) -> Result<Starting<'_>, DriverError> {
        let max = self.max_starting;
        let admitted = !self.full.load(Ordering::SeqCst)
            && self
                .starting
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok();
        if admitted {
            Ok(Starting(&self.starting))
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            Err(StartError::NoFreeSlot { max }.into())
        }
    }

    /// Run `call`, adding its time to the current request's (if the call is made for one).
    async fn timed<T>(&self, call: impl Future<Output = T>) -> T {
        let t0 = Instant::now();
        let out = call.await;
        if let Some(id) = bulkhead_common::request_id::current() {
            *self
                .spent
                .lock()
                .expect("stopwatch lock")
                .entry(id)
                .or_default() += t0.elapsed();
        }
        out
    }
}

#[async_trait]
impl Node for FakeNode {
    fn driver_name(&self) -> String {
        self.local.driver_name()
    }

    fn capabilities(&self) -> Capabilities {
        self.local.capabilities()
    }

    fn has_egress(&self) -> bool {
        self.local.has_egress()
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.local.checkpoint_key()
    }

    fn owns(&self, handle: &DriverHandle) -> bool {
        self.local.owns(handle)
    }

    async fn start(&self, spec: &SandboxSpec, warm: bool) -> Result<DriverHandle, DriverError> {
        self.timed(async {
            let _slot = self.admit()?;
            let h = self.local.start(spec, warm).await?;
            self.started.fetch_add(1, Ordering::Relaxed);
            Ok(h)
        })
        .await
    }

    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.timed(self.local.claimed(handle)).await
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.timed(self.local.stop(handle)).await
    }

    /// Not timed: it lasts as long as the sandbox.
    async fn wait(&self, handle: &DriverHandle) {
        self.local.wait(handle).await
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        self.timed(self.local.adopt(handle)).await
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.timed(self.local.usage(handle)).await
    }

    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.timed(self.local.thaw(handle)).await
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        self.timed(self.local.reclaim_orphans(keep)).await
    }

    async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
        auth: Option<&str>,
    ) -> Result<AgentInfo, AgentCallError> {
        self.timed(self.local.init_agent(handle, init, auth)).await
    }

    async fn agent_info(&self, handle: &DriverHandle) -> Result<AgentInfo, AgentCallError> {
        self.timed(self.local.agent_info(handle)).await
    }

    async fn reachable(&self, handle: &DriverHandle) -> bool {
        self.timed(self.local.reachable(handle)).await
    }

    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        self.timed(self.local.checkpoint(handle, dir, opts)).await
    }

    async fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        self.timed(self.local.checkpoint_info(dir)).await
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        self.timed(self.local.restore(spec, dir, opts)).await
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        self.timed(self.local.changes(of, since)).await
    }

    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        self.timed(self.local.export_changes(handle, dest)).await
    }

    async fn attach_network(
        &self,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        self.timed(self.local.attach_network(sandbox_id, handle, policy))
            .await
    }

    async fn set_network_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        self.timed(self.local.set_network_policy(sandbox_id, policy))
            .await
    }

    async fn detach_network(&self, sandbox_id: &str) {
        self.timed(self.local.detach_network(sandbox_id)).await
    }

    async fn flush_audit(&self) {
        self.timed(self.local.flush_audit()).await
    }

    async fn pool_take(&self, template: &str) -> Option<DriverHandle> {
        self.timed(self.local.pool_take(template)).await
    }

    async fn pool_put(&self, template: &str, handle: DriverHandle) {
        self.timed(self.local.pool_put(template, handle)).await
    }

    async fn pool_take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle> {
        self.timed(self.local.pool_take_surplus(template, n)).await
    }

    async fn pool_drain(&self, template: Option<&str>) -> Vec<DriverHandle> {
        self.timed(self.local.pool_drain(template)).await
    }

    fn pool_stock(&self) -> BTreeMap<String, usize> {
        self.local.pool_stock()
    }

    async fn pool_members(&self) -> Vec<DriverHandle> {
        self.timed(self.local.pool_members()).await
    }
}

#[async_trait]
impl AgentPath for FakeNode {
    async fn open(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        self.timed(self.local.open(handle)).await
    }
}
