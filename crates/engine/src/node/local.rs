//! The node in process: [`LocalNode`] drives this machine's isolation driver and holds its
//! pools and network links. `bulkhead serve` hands it to the engine as its one [`Node`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;

use crate::error::NetworkError;
use crate::node::driver::{
    AgentStream, Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, Driver,
    DriverError, DriverHandle, FileChange, ResourceUsage, RestoreOptions, SandboxSpec,
};
use crate::node::link::Links;
use crate::node::network::{EgressControl, StoreAuditSink};
use crate::node::pools::Pools;
use crate::node::tally::{Allocation, Tally};
use crate::node::{AgentCallError, AgentPath, Node};
use crate::node::{agent_client, checkpoints};

pub struct LocalNode {
    driver: Arc<dyn Driver>,
    pools: Pools,
    links: Links,
    tally: Tally,
}

impl LocalNode {
    pub fn new(driver: Arc<dyn Driver>) -> Arc<Self> {
        Arc::new(Self {
            driver,
            pools: Pools::default(),
            links: Links::default(),
            tally: Tally::default(),
        })
    }

    /// Install the egress proxy (once, before the engine recovers). `audit` is flushed before
    /// the audit trail is read.
    pub fn set_egress(&self, egress: Arc<dyn EgressControl>, audit: Option<Arc<StoreAuditSink>>) {
        self.links.install(egress, audit);
    }

    /// What the sandboxes it started or restored were promised (those re-adopted after a
    /// restart are not counted: their handles do not say).
    pub fn allocated(&self) -> Allocation {
        self.tally.total()
    }
}

#[async_trait]
impl Node for LocalNode {
    fn driver_name(&self) -> String {
        self.driver.name().to_string()
    }

    fn capabilities(&self) -> Capabilities {
        self.driver.capabilities()
    }

    fn has_egress(&self) -> bool {
        self.links.has_egress()
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.driver.checkpoint_key()
    }

    fn owns(&self, handle: &DriverHandle) -> bool {
        self.driver.owns(handle)
    }

    async fn start(&self, spec: &SandboxSpec, warm: bool) -> Result<DriverHandle, DriverError> {
        let h = if warm {
            self.driver.start_warm(spec).await
        } else {
            self.driver.start(spec).await
        }?;
        self.tally.started(&h, spec, warm);
        Ok(h)
    }

    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.driver.claimed(handle).await?;
        self.tally.claimed(handle);
        Ok(())
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let r = self.driver.stop(handle).await;
        if r.is_ok() {
            self.tally.gone(handle);
        }
        r
    }

    async fn wait(&self, handle: &DriverHandle) {
        self.driver.wait(handle).await;
        self.tally.gone(handle);
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        self.driver.adopt(handle).await
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.driver.usage(handle).await
    }

    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.driver.thaw(handle).await
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        self.driver.reclaim_orphans(keep).await
    }

    async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
        auth: Option<&str>,
    ) -> Result<AgentInfo, AgentCallError> {
        let stream = self
            .driver
            .connect(handle)
            .await
            .map_err(AgentCallError::Reach)?;
        let body = agent_client::request(stream, http::Method::POST, "/init", Some(init), auth)
            .await
            .map_err(AgentCallError::Call)?;
        Ok(agent_client::info_from_init(&body))
    }

    async fn agent_info(&self, handle: &DriverHandle) -> Result<AgentInfo, AgentCallError> {
        let stream = self
            .driver
            .connect(handle)
            .await
            .map_err(AgentCallError::Reach)?;
        agent_client::agent_info(stream)
            .await
            .map_err(AgentCallError::Call)
    }

    async fn reachable(&self, handle: &DriverHandle) -> bool {
        self.driver.connect(handle).await.is_ok()
    }

    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        checkpoints::prepare(dir).map_err(checkpoints::into_driver_error)?;
        let written = match self.driver.checkpoint(handle, dir, opts).await {
            Ok(info) => checkpoints::mark_complete(&info)
                .map(|()| info)
                .map_err(checkpoints::into_driver_error),
            Err(e) => Err(e),
        };
        if written.is_err() {
            checkpoints::remove(dir);
        }
        written
    }

    async fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        // Marked complete, by this node's driver (another driver's image is not one it restores).
        if let Some(info) = checkpoints::completed(dir).filter(|i| i.driver == self.driver.name()) {
            return Some(info);
        }
        // The driver finished but its caller stopped before marking it: complete it now.
        let info = self.driver.checkpoint_info(dir)?;
        checkpoints::mark_complete(&info).ok()?;
        Some(info)
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        let h = self.driver.restore(spec, dir, opts).await?;
        self.tally.started(&h, spec, false);
        Ok(h)
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        self.driver.changes(of, since).await
    }

    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        self.driver.export_changes(handle, dest).await
    }

    async fn attach_network(
        &self,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        self.links
            .attach(self.driver.as_ref(), sandbox_id, handle, policy)
            .await
    }

    async fn set_network_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        self.links.set_policy(sandbox_id, policy)
    }

    async fn detach_network(&self, sandbox_id: &str) {
        self.links.detach(sandbox_id)
    }

    async fn flush_audit(&self) {
        self.links.flush_audit().await
    }

    async fn pool_take(&self, template: &str) -> Option<DriverHandle> {
        self.pools.take(template)
    }

    async fn pool_put(&self, template: &str, handle: DriverHandle) {
        self.pools.put(template, handle)
    }

    async fn pool_take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle> {
        self.pools.take_surplus(template, n)
    }

    async fn pool_drain(&self, template: Option<&str>) -> Vec<DriverHandle> {
        self.pools.drain(template)
    }

    fn pool_stock(&self) -> BTreeMap<String, usize> {
        self.pools.stock()
    }

    async fn pool_members(&self) -> Vec<DriverHandle> {
        self.pools.members()
    }
}

#[async_trait]
impl AgentPath for LocalNode {
    async fn open(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        self.driver.connect(handle).await
    }
}
