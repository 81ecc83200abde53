//! The isolation driver contract. The engine owns sandbox logic; a driver only knows how to
//! start an isolated environment running the agent, reach that agent with a byte stream,
//! observe its death and tear it down. Implementations: `jail` (namespaces) and later `microvm`.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

/// What the engine asks a driver to start. Per-request identity (sandbox id, env vars, access
/// token) is *not* here: it is applied after a warm-pool claim through the agent's `/init`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxSpec {
    /// Template id (for logs and cgroup naming only).
    pub template_id: String,
    /// Read-only root filesystem of the template on the host.
    pub rootfs: PathBuf,
    /// Number of CPUs the sandbox may use (cgroup quota = cpu_count * period).
    pub cpu_count: u32,
    /// Memory limit in MiB (memory + swap).
    pub memory_mb: u64,
    /// Maximum number of tasks (processes + threads) in the sandbox.
    pub pids_max: u64,
}

/// Driver-specific, serialisable description of a running sandbox; stored so a restarted
/// server can re-adopt it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DriverHandle {
    /// Driver name (`jail`, `microvm`).
    pub driver: String,
    /// Host pid of the sandbox's init (the agent, pid 1 inside).
    pub pid: i32,
    /// Process start time (field 22 of /proc/PID/stat) so a recycled pid is never mistaken
    /// for the sandbox after a restart.
    pub pid_start_time: u64,
    /// Per-driver slot (uid range, directories).
    pub slot: u32,
    /// Opaque driver data (paths, cgroup names).
    pub data: serde_json::Value,
}

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

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("The host cannot run {driver} sandboxes: {reason}")]
    Unsupported {
        driver: &'static str,
        reason: String,
    },
    #[error("Sandbox failed to start: {0}")]
    Start(String),
    #[error("Sandbox agent is not reachable: {0}")]
    Connect(String),
    #[error("Sandbox is not running")]
    NotRunning,
    #[error("Driver I/O error: {context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl DriverError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DriverError::Io {
            context: context.into(),
            source,
        }
    }
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Start a sandbox and return once its agent accepts connections.
    async fn start(&self, spec: &SandboxSpec) -> Result<DriverHandle, DriverError>;

    /// Kill every process of the sandbox and remove its mounts, cgroups and directories.
    /// Idempotent: stopping an already dead sandbox cleans up and returns Ok.
    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError>;

    /// Resolve when the sandbox has died (for any reason).
    async fn wait(&self, handle: &DriverHandle);

    /// Is the sandbox described by `handle` (e.g. loaded from the store after a restart) still
    /// alive? If so the driver takes ownership of it again (slot marked used).
    async fn adopt(&self, handle: &DriverHandle) -> bool;

    /// Open a new byte stream to the sandbox's agent.
    async fn connect(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError>;

    /// Current resource usage.
    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError>;

    /// Give the sandbox a network link and return the host's end of it: a TUN device created
    /// inside the sandbox's network namespace (see `bulkhead_egress::open_tun_in_netns`), which
    /// the engine hands to the egress proxy. Called after a warm-pool claim (pool members have
    /// no link) and again after a restart. Drivers without networking say `Unsupported`.
    async fn open_network(&self, _handle: &DriverHandle) -> Result<OwnedFd, DriverError> {
        Err(DriverError::Unsupported {
            driver: self.name(),
            reason: "this driver cannot give sandboxes a network link".into(),
        })
    }

    /// Called once at engine start, after adoption: stop and clean up every sandbox this driver
    /// finds on the host that is not in `keep` (warm-pool members and sandboxes whose record
    /// was lost when a previous server died). Returns how many were reclaimed.
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError>;
}
