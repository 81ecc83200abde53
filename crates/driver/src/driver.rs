//! The [`Driver`] trait: start an isolated environment running the agent, reach that agent
//! with a byte stream, observe its death, tear it down; plus the optional capabilities.

use std::os::fd::OwnedFd;
use std::path::Path;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::capability::{
    Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, FileChange, Operation,
    RestoreOptions,
};
use crate::error::DriverError;
use crate::handle::{DriverHandle, SandboxSpec};

/// A bidirectional byte stream to the agent inside a sandbox (HTTP/1.1 is spoken over it).
pub trait AgentIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AgentIo for T {}
pub type AgentStream = Box<dyn AgentIo>;

/// Resource usage read from the sandbox's cgroup and overlay.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ResourceUsage {
    /// Cumulative CPU time in nanoseconds.
    pub cpu_usage_ns: u64,
    pub mem_used_bytes: u64,
    pub mem_cache_bytes: u64,
    pub mem_limit_bytes: u64,
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
    pub pids_current: u64,
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Did this driver make `handle` (so that it may adopt, reach or stop it)? By name; a
    /// driver made of several ([`crate::ByTemplate`]) answers for each of them.
    fn owns(&self, handle: &DriverHandle) -> bool {
        handle.driver == self.name()
    }

    /// What this driver can do beyond the required methods. The default claims nothing.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Start a sandbox and return once its agent accepts connections.
    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError>;

    /// Start a sandbox for a warm pool: like [`Driver::start`], but it may run at a lower CPU
    /// priority until [`Driver::claimed`], so that filling a pool does not slow down the
    /// sandboxes in use. The default is a plain start.
    async fn start_warm(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        self.start(spec).await
    }

    /// A sandbox started by [`Driver::start_warm`] is handed out: give it the normal CPU
    /// priority. The default does nothing.
    async fn claimed(&self, _handle: &DriverHandle) -> Result<(), DriverError> {
        Ok(())
    }

    /// Kill every process of the sandbox and remove its mounts, cgroups and directories.
    /// Idempotent: stopping an already dead sandbox cleans up and returns Ok. Works on a
    /// frozen sandbox too.
    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError>;

    /// Resolve when the sandbox has died (for any reason).
    async fn wait(&self, handle: &DriverHandle);

    /// Is the sandbox described by `handle` (e.g. loaded from the store after a restart) still
    /// alive? If so the driver takes ownership of it again (slot marked used). A handle whose
    /// pid start time does not match, whose process is gone, or whose format this build cannot
    /// read ([`DriverHandle::is_readable`]) is refused. So is a sandbox whose pause the driver
    /// completed (its checkpoint is whole) but did not get to tear down: the driver stops it, and
    /// it is paused. An unfinished pause is undone (the sandbox gets back what it had moved).
    async fn adopt(&self, handle: &DriverHandle) -> bool;

    /// Open a new byte stream to the sandbox's agent.
    async fn connect(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError>;

    /// Current resource usage.
    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError>;

    /// Called once at engine start, after adoption: stop and clean up every sandbox this driver
    /// finds on the host that is not in `keep` (warm-pool members and sandboxes whose record
    /// was lost when a previous server died). Returns how many were reclaimed.
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError>;

    /// Give the sandbox a network link and return the host's end of it, of the kind
    /// [`Capabilities::network`] names (the jail: a TUN device created inside the sandbox's
    /// network namespace; the microvm: its NIC bridged to a packet socket; both from
    /// `bulkhead_host::link`), which the engine hands to the egress proxy. This descriptor is
    /// the whole interface between a driver and the proxy: no driver depends on it. Called
    /// after a warm-pool claim (pool members have no link) and again after a restart. Closing
    /// the host's end removes the link.
    async fn open_network(&self, _handle: &DriverHandle) -> Result<OwnedFd, DriverError> {
        Err(DriverError::unsupported(
            self.name(),
            Operation::OpenNetwork,
        ))
    }

    /// Stop every process of the sandbox where it is, without it noticing; memory stays
    /// allocated. Freezing a frozen sandbox is a no-op. Connections may still be opened to a
    /// frozen agent; it answers once thawed.
    async fn freeze(&self, _handle: &DriverHandle) -> Result<(), DriverError> {
        Err(DriverError::unsupported(self.name(), Operation::Freeze))
    }

    /// Let a frozen sandbox go on. Thawing a running sandbox is a no-op.
    async fn thaw(&self, _handle: &DriverHandle) -> Result<(), DriverError> {
        Err(DriverError::unsupported(self.name(), Operation::Thaw))
    }

    /// Write the sandbox's memory, process state and filesystem changes into `dir` (empty or
    /// absent). With `leave_running: false` the sandbox has ended when this returns (the
    /// handle is dead; `stop` still cleans up idempotently); otherwise it runs on as before.
    async fn checkpoint(
        &self,
        _handle: &DriverHandle,
        _dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        let op = if opts.leave_running {
            Operation::Snapshot
        } else {
            Operation::Checkpoint
        };
        Err(DriverError::unsupported(self.name(), op))
    }

    /// Is `dir` a complete checkpoint this driver wrote (and can restore)? For recovery: a
    /// server that died right after the driver finished a pause has no record of it but the
    /// checkpoint itself. Default: the driver keeps no such record.
    fn checkpoint_info(&self, _dir: &Path) -> Option<CheckpointInfo> {
        None
    }

    /// What a memory checkpoint written now depends on besides its template: the agent build the
    /// driver runs, the checkpoint tool and its version, the image format. A checkpoint kept for
    /// reuse (a heavy template's warm pool checkpoint) stays valid while this is unchanged.
    /// `None`: the driver cannot say, and such checkpoints are not reused across server starts.
    fn checkpoint_key(&self) -> Option<String> {
        None
    }

    /// Start a new sandbox from a checkpoint in `dir`, with the resources `spec` grants (its
    /// template must be the one checkpointed). The image is left in place, so one snapshot can
    /// be restored many times (fork). Returns once the agent accepts connections.
    async fn restore(
        &self,
        _spec: &SandboxSpec,
        _dir: &Path,
        _opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        Err(DriverError::unsupported(self.name(), Operation::Restore))
    }

    /// Files created, modified and deleted in the sandbox (or checkpoint) against its template,
    /// or against the checkpoint in `since` when given, sorted by path.
    async fn changes(
        &self,
        _of: &ChangeSource,
        _since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        Err(DriverError::unsupported(self.name(), Operation::Changes))
    }

    /// End the sandbox and move its filesystem changes against its template to `dest` (which
    /// must not exist) as an overlay upper directory — whiteouts (character devices 0/0) for
    /// deletions, opaque directories marked with `user.overlay.opaque` or
    /// `trusted.overlay.opaque` — with owners as seen inside the sandbox (root is uid 0). Template
    /// builds stack this on the template's tree to make the next layer.
    async fn export_changes(
        &self,
        _handle: &DriverHandle,
        _dest: &Path,
    ) -> Result<(), DriverError> {
        Err(DriverError::unsupported(
            self.name(),
            Operation::ExportChanges,
        ))
    }
}
