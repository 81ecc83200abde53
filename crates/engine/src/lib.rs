//! The engine: the one API that owns sandbox logic. REST, Connect, MCP and the CLI translate
//! into calls on [`Engine`]; none of them holds sandbox state of its own.
//!
//! Lifecycle of a sandbox: a warm pool per template keeps started, anonymous sandboxes; create
//! claims one (or starts one cold when the pool is empty), gives it an identity through the
//! agent's `/init`, records it in the store and arms its TTL. A watcher task per sandbox
//! notices its death; a reaper kills sandboxes whose `end_at` passed. Which operation may run
//! in which state is decided by [`lifecycle::transition`] alone.
//!
//! Layout: folders say what they hold — `sandbox/` (the verbs and the state machine), `pool/`,
//! `template/`, `volume/`, `tenancy/`, `background/` and `node/` (driver, checkpoints, network,
//! agent streams), and `cluster` (node reports, health, placement). Leaf modules at
//! the top hold shared types (`config`, `types`, `clock`, `validate`, `error`, `ids`,
//! `telemetry`); [`engine`](crate::Engine) holds the `Engine` value.

mod background;
mod clock;
pub mod cluster;
mod config;
mod engine;
mod error;
pub mod ids;
mod node;
mod pool;
mod sandbox;
pub mod telemetry;
mod template;
mod tenancy;
#[cfg(feature = "testing")]
pub mod testing;
mod types;
mod validate;
mod volume;

// Public modules, by the names front ends know them under.
pub use node::{agent_client, driver, network};
pub use sandbox::lifecycle;
pub use template::{builds as template_builds, spec as template_spec};
pub use tenancy::{keys, metering, quota, teams};
pub use volume::{fs as volume_fs, storage as volume_storage};

pub use background::image_gc::ImageGcError;
pub use config::{
    BuildLimits, CheckpointPools, CheckpointPoolsError, DEFAULT_SANDBOX_DISK_MB, EngineConfig,
    MIN_SANDBOX_DISK_MB,
};
pub use engine::Engine;
pub use error::{ChangesError, EngineError, IdempotencyError, NetworkError};
pub use lifecycle::{Operation, Refusal, SandboxState};
pub use metering::{ExhaustedAction, MeteringConfig, Prices, UsageFilter, UsageReport};
pub use network::{NetworkRule, NetworkTransform, SandboxNetwork};
pub use node::checkpoints::CheckpointError;
pub use node::{AgentCallError, AgentPath, Allocation, LocalNode, Node};
pub use pool::policy::{PoolConfig, PoolLimits};
pub use pool::source::{KERNELS_MANIFEST, PoolSource, PoolSourceError};
pub use quota::{Limit, QuotaError};
pub use sandbox::admission::AdmissionLimits;
pub use sandbox::evacuate::Evacuated;
pub use sandbox::fork::{DEFAULT_FORK_TIMEOUT_SECS, MAX_FORKS};
pub use tenancy::admin::Admin;
pub use tenancy::teams::{Team, TeamLimits};
pub use types::{
    ApiKey, Caller, CreateGeneration, CreateRequest, EgressEvent, LifecyclePolicy, ListPage,
    ListRequest, OnTimeout, ResumeRequest, SandboxInfo, SecretInfo, SecretPage, SnapshotInfo,
    SnapshotPage, TemplateInfo, TemplateRuntime, TemplateStatus, Usage,
};
pub use volume::content::ContentAuth;
pub use volume::types::{
    MountRequest, VolumeAccess, VolumeError, VolumeInfo, validate_mounts, validate_name,
};
