//! Errors of engine operations. Each says which operation failed (create, kill, metrics, …) and
//! keeps its cause typed in `#[source]`; the API maps each variant to one E2B status and code
//! and puts only the top-level message in a response (the chain goes to the log).

use bulkhead_envd::protocol::{AGENT_PROTOCOL_VERSION, AgentInfo, MIN_AGENT_PROTOCOL_VERSION};

use crate::node::agent_client::AgentClientError;
use crate::node::checkpoints::CheckpointError;
use crate::node::driver::DriverError;
use crate::sandbox::lifecycle::{Operation, Refusal};

/// Why a sandbox's network link could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("This server has no egress proxy")]
    NoProxy,
    #[error("The sandbox driver could not open a network link")]
    Link(#[source] DriverError),
    #[error("The egress proxy refused the link or policy")]
    Proxy(#[source] bulkhead_egress::EgressError),
}

#[derive(Debug, thiserror::Error)]
/// Why a sandbox's file changes cannot be listed.
pub enum ChangesError {
    #[error(
        "The file changes of sandbox {0} cannot be listed while it is being paused or resumed: try again in a moment"
    )]
    Paused(String),
    #[error("This server's sandbox driver cannot list file changes")]
    Unsupported,
    #[error("Snapshot '{0}' not found: list snapshots, or list changes without `since`")]
    SnapshotNotFound(String),
}

/// Why a create carrying an `Idempotency-Key` was refused (see `sandbox::idempotency`). Kept
/// here rather than beside the verb so that module can return [`EngineError`] without an
/// import loop.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    #[error(
        "Invalid Idempotency-Key header: {reason}; use 1 to 255 visible ASCII characters (letters, digits and punctuation, no spaces), e.g. a UUID"
    )]
    InvalidKey { reason: String },
    #[error(
        "Idempotency-Key '{key}' was used with a different request: resend the original request unchanged to get its sandbox, or use a new key for a new request"
    )]
    Mismatch { key: String },
    #[error(
        "A create with Idempotency-Key '{key}' is still in progress after {waited_secs} s: retry with the same key later to get its sandbox"
    )]
    InProgress { key: String, waited_secs: u64 },
    #[error(
        "Idempotency-Key '{key}' already created sandbox {sandbox_id}, which has ended (killed, timed out or removed): use a new key to create another sandbox"
    )]
    Ended { key: String, sandbox_id: String },
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("Sandbox {0} not found: it may have timed out or been killed; create a new one")]
    SandboxNotFound(String),
    #[error("Template '{0}' not found: build it with `bulkhead template build {0}` or use 'base'")]
    TemplateNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("Sandbox capacity exhausted: kill unused sandboxes or raise the server's limit")]
    Capacity,
    /// More creates are running or waiting than the server admits (`--max-concurrent-creates`
    /// plus `--max-queued-creates`).
    #[error(
        "Too many sandbox creates at once ({limit} running or waiting): retry in a moment, or ask the operator to raise --max-queued-creates"
    )]
    TooManyCreates { limit: usize },
    /// The isolation driver failed while running `op`.
    #[error(
        "Could not {op} the sandbox: the sandbox driver failed; try again, and if it keeps failing ask the operator to check the server log"
    )]
    Driver {
        op: Operation,
        #[source]
        source: DriverError,
    },
    /// The agent inside the sandbox did not answer as expected while running `op`.
    #[error(
        "Could not {op} the sandbox: its agent did not answer as expected; try again or create a new sandbox"
    )]
    Agent {
        op: Operation,
        #[source]
        source: AgentClientError,
    },
    /// The sandbox's agent speaks a protocol older than this server can drive.
    #[error(
        "Sandbox {id} runs an agent too old for this server (agent protocol {agent_protocol}, build {agent_build}; this server needs at least {min_protocol} and speaks {current_protocol}): it is kept and can still be listed and killed, but cannot {op}; kill it and create a new sandbox"
    )]
    AgentTooOld {
        id: String,
        op: Operation,
        agent_protocol: u32,
        agent_build: String,
        min_protocol: u32,
        current_protocol: u32,
    },
    #[error("Secret {0} not found: list secrets with GET /secrets or `bulkhead secrets ls`")]
    SecretNotFound(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error(transparent)]
    TemplateBuild(crate::template::types::TemplateBuildError),
    /// The network link or policy of a sandbox could not be set while running `op`.
    #[error(
        "Could not {op} the sandbox: its network link could not be set up; try again, and if it keeps failing ask the operator to check the egress proxy"
    )]
    Network {
        op: Operation,
        #[source]
        source: NetworkError,
    },
    #[error("Cannot {op} sandbox {id}: {reason}")]
    Refused {
        id: String,
        op: Operation,
        reason: Refusal,
    },
    #[error("This server cannot {0} sandboxes yet: upgrade Bulkhead or create a new sandbox")]
    Unsupported(Operation),
    /// Driver leftovers could not be cleaned up after a restart.
    #[error(
        "Could not clean up sandboxes left over from the previous server run: check the server log and the host"
    )]
    Recover(#[source] DriverError),
    /// The driver could not checkpoint a running sandbox; it keeps running with its state.
    #[error(
        "Could not {op} sandbox {id}, which keeps running with its state: try again, and if it keeps failing ask the operator to check the server log. Taking its checkpoint failed: {source}"
    )]
    CheckpointFailed {
        id: String,
        op: Operation,
        #[source]
        source: DriverError,
    },
    /// The driver could not restore a paused sandbox; it stays paused and resumable.
    #[error(
        "Could not resume sandbox {id}: restoring its checkpoint failed; it stays paused and can be resumed again (connect with memory false boots it afresh on its saved files); if it keeps failing ask the operator to check the server log"
    )]
    RestoreFailed {
        id: String,
        #[source]
        source: DriverError,
    },
    /// A checkpoint directory could not be prepared, completed or copied during `op`.
    #[error("Could not {op} the sandbox: its checkpoint could not be stored")]
    Checkpoint {
        op: Operation,
        #[source]
        source: CheckpointError,
    },
    #[error(
        "Snapshot '{0}' not found: list snapshots with GET /snapshots (Sandbox.list_snapshots())"
    )]
    SnapshotNotFound(String),
    /// The sandbox driver lacks the capability `op` needs.
    #[error(
        "This server's sandbox driver ({driver}) cannot {op} sandboxes: ask the operator to enable checkpoints (build CRIU with `scripts/criu.sh` and start `bulkhead serve --criu <path>` or set BULKHEAD_CRIU)"
    )]
    NotCapable { driver: String, op: Operation },
    #[error(
        "The server's database failed: try again, and if it keeps failing ask the operator to check the database"
    )]
    Store(#[from] bulkhead_store::StoreError),
    /// A volume verb or a create's `volumeMounts` failed.
    #[error(transparent)]
    Volume(#[from] crate::volume::types::VolumeError),
    /// Listing a sandbox's file changes failed.
    #[error(transparent)]
    Changes(#[from] ChangesError),
    /// A volume content operation failed.
    #[error(transparent)]
    VolumeFs(#[from] crate::volume::fs::VolumeFsError),
    /// A team limit (credits, create rate, a quota) refused the request.
    #[error(transparent)]
    Quota(#[from] crate::tenancy::quota::QuotaError),
    /// A create's `Idempotency-Key` was invalid, reused with another request, still in use, or
    /// its sandbox has ended.
    #[error(transparent)]
    Idempotency(#[from] IdempotencyError),
}

impl EngineError {
    /// The sandbox's processes have exited (its death may not be recorded yet): to a client it
    /// is gone, as a killed one.
    pub fn sandbox_exited(&self) -> bool {
        matches!(
            self,
            EngineError::Driver {
                source: DriverError::NotRunning,
                ..
            }
        )
    }

    /// The error for a refused operation: an ended sandbox is simply not found (the 404 every
    /// SDK expects); anything else names the operation, the sandbox and why.
    pub(crate) fn refused(id: &str, op: Operation, reason: Refusal) -> Self {
        match reason {
            Refusal::Ended => EngineError::SandboxNotFound(id.to_string()),
            reason => EngineError::Refused {
                id: id.to_string(),
                op,
                reason,
            },
        }
    }

    /// A driver failure during `op`.
    pub(crate) fn driver(op: Operation) -> impl FnOnce(DriverError) -> Self {
        move |source| EngineError::Driver { op, source }
    }

    /// An agent failure during `op`.
    pub(crate) fn agent(op: Operation) -> impl FnOnce(AgentClientError) -> Self {
        move |source| EngineError::Agent { op, source }
    }

    /// A network failure during `op`.
    pub(crate) fn network(op: Operation) -> impl FnOnce(NetworkError) -> Self {
        move |source| EngineError::Network { op, source }
    }

    /// A sandbox whose agent is too old for `op`.
    pub(crate) fn agent_too_old(id: &str, op: Operation, agent: &AgentInfo) -> Self {
        EngineError::AgentTooOld {
            id: id.to_string(),
            op,
            agent_protocol: agent.protocol_version,
            agent_build: agent.agent_build.clone(),
            min_protocol: MIN_AGENT_PROTOCOL_VERSION,
            current_protocol: AGENT_PROTOCOL_VERSION,
        }
    }

    /// The operation that failed, for errors that carry one.
    pub fn operation(&self) -> Option<Operation> {
        match self {
            EngineError::Driver { op, .. }
            | EngineError::Agent { op, .. }
            | EngineError::AgentTooOld { op, .. }
            | EngineError::Network { op, .. }
            | EngineError::Refused { op, .. }
            | EngineError::CheckpointFailed { op, .. }
            | EngineError::Checkpoint { op, .. }
            | EngineError::NotCapable { op, .. }
            | EngineError::Unsupported(op) => Some(*op),
            EngineError::RestoreFailed { .. } => Some(Operation::Resume),
            _ => None,
        }
    }
}
