//! The node half of the engine: what runs where the sandboxes are — the isolation driver, warm
//! pools of started sandboxes, checkpoints on disk, the egress network and the calls to each
//! sandbox's agent. The control plane ([`crate::Engine`]: auth, tenancy, quotas, the store, the
//! template registry, the lifecycle) reaches it only through the [`Node`] trait, whose arguments
//! and results are plain data (ids, specs, handles, reports: what a `.proto` message would
//! carry), and the byte streams of the data path through [`AgentPath`]. `bulkhead serve` wires
//! one [`LocalNode`] in process; a cluster puts the network under the same two traits.

pub mod agent_client;
pub(crate) mod checkpoints;
pub(crate) mod disk_usage;
pub mod driver;
pub(crate) mod guarded;
mod link;
mod local;
pub mod network;
mod pools;
mod tally;

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;

use crate::error::NetworkError;
use agent_client::AgentClientError;
use driver::{
    AgentStream, Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, DriverError,
    DriverHandle, FileChange, ResourceUsage, RestoreOptions, SandboxSpec,
};
pub use local::LocalNode;
pub use tally::Allocation;

/// How a call to a sandbox's agent failed: the node could not reach it, or it answered badly.
#[derive(Debug, thiserror::Error)]
pub enum AgentCallError {
    #[error(transparent)]
    Reach(DriverError),
    #[error(transparent)]
    Call(AgentClientError),
}

/// The control plane's view of a node. Every method names its sandbox by its [`DriverHandle`]
/// (plain data the store keeps) or its id; nothing crosses that holds a lock or a descriptor.
#[async_trait]
pub trait Node: Send + Sync + 'static {
    /// Its driver's name (`jail`, `microvm`, `fake`).
    fn driver_name(&self) -> String;
    fn capabilities(&self) -> Capabilities;
    /// It runs an egress proxy (sandboxes on it may have network access).
    fn has_egress(&self) -> bool;
    /// What a memory checkpoint written on it depends on (computed once; see
    /// `Driver::checkpoint_key`).
    fn checkpoint_key(&self) -> Option<String>;
    /// Did this node make `handle` (may it adopt, reach or stop it)?
    fn owns(&self, handle: &DriverHandle) -> bool;

    // Sandboxes.
    /// Start a sandbox; `warm` for a pool member (lower CPU priority until claimed).
    async fn start(&self, spec: &SandboxSpec, warm: bool) -> Result<DriverHandle, DriverError>;
    /// A warm sandbox is handed out: give it the normal CPU priority.
    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError>;
    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError>;
    /// Resolves when the sandbox has died.
    async fn wait(&self, handle: &DriverHandle);
    /// Take a sandbox a previous server left running back (see `Driver::adopt`).
    async fn adopt(&self, handle: &DriverHandle) -> bool;
    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError>;
    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError>;
    /// Stop every sandbox on the node that is not in `keep`; how many were stopped.
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError>;

    // The agent's internal routes.
    /// `POST /init`: give the agent its identity; `auth` is a token a restored agent still asks for.
    async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
        auth: Option<&str>,
    ) -> Result<AgentInfo, AgentCallError>;
    /// What the agent says about itself (its protocol version).
    async fn agent_info(&self, handle: &DriverHandle) -> Result<AgentInfo, AgentCallError>;
    /// Does the sandbox's agent still accept connections?
    async fn reachable(&self, handle: &DriverHandle) -> bool;

    // Checkpoints: directories on the node's disk that the engine names (see `checkpoints`).
    /// Write a complete checkpoint of `handle` into `dir`, fresh (a leftover is replaced), with
    /// the completion marker last; on failure nothing of it is left.
    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError>;
    /// The complete checkpoint in `dir`, if it is one: marked complete, or written whole by the
    /// driver before its caller could mark it (which marks it now).
    async fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo>;
    /// Delete a checkpoint directory, or a directory of them (idempotent). By default on this
    /// machine's disk, where a node in process keeps them.
    async fn remove_checkpoint(&self, dir: &Path) {
        let dir = dir.to_path_buf();
        let _ = tokio::task::spawn_blocking(move || checkpoints::remove(&dir)).await;
    }
    /// Copy the complete checkpoint in `from` to a fresh `to` (a snapshot of a paused sandbox),
    /// on the node that holds it. By default on this machine's disk.
    async fn copy_checkpoint(&self, from: &Path, to: &Path) -> Result<CheckpointInfo, DriverError> {
        let (from, to) = (from.to_path_buf(), to.to_path_buf());
        tokio::task::spawn_blocking(move || checkpoints::copy(&from, &to))
            .await
            .map_err(|e| DriverError::io("copying a checkpoint", std::io::Error::other(e)))?
            .map_err(checkpoints::into_driver_error)
    }
    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError>;
    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError>;
    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError>;

    // The egress network.
    /// Give a sandbox a link served by the node's egress proxy under `policy`.
    async fn attach_network(
        &self,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError>;
    /// Replace an attached sandbox's policy (new connections at once).
    async fn set_network_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError>;
    /// Remove a sandbox's link; idempotent.
    async fn detach_network(&self, sandbox_id: &str);
    /// Write out the egress decisions recorded so far (before the audit trail is read).
    async fn flush_audit(&self);

    // Warm pools (started, anonymous sandboxes per template).
    /// The oldest member of `template`'s pool, taken out of it.
    async fn pool_take(&self, template: &str) -> Option<DriverHandle>;
    async fn pool_put(&self, template: &str, handle: DriverHandle);
    /// Up to `n` of `template`'s members, newest first, taken out (to stop a surplus).
    async fn pool_take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle>;
    /// Every member of every pool, taken out (at shutdown, or when a template goes).
    async fn pool_drain(&self, template: Option<&str>) -> Vec<DriverHandle>;
    /// Members per template.
    fn pool_stock(&self) -> BTreeMap<String, usize>;
    /// Every pool member, left in place (recovery keeps them).
    async fn pool_members(&self) -> Vec<DriverHandle>;
}

/// The data path: byte streams to a sandbox's agent (envd traffic, build commands). Kept apart
/// from [`Node`] because a stream is not data: over a network it is a proxied connection.
#[async_trait]
pub trait AgentPath: Send + Sync + 'static {
    async fn open(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError>;
}
