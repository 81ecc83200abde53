//! The engine: the one API that owns sandbox logic. REST, Connect, MCP and the CLI translate
//! into calls on [`Engine`]; none of them holds sandbox state of its own.
//!
//! Lifecycle of a sandbox: a warm pool per template keeps started, anonymous sandboxes; create
//! claims one (or starts one cold when the pool is empty), gives it an identity through the
//! agent's `/init`, records it in the store and arms its TTL. A watcher task per sandbox
//! notices its death; a reaper kills sandboxes whose `end_at` passed. Which operation may run
//! in which state is decided by [`lifecycle::transition`] alone.
//!
//! Layout: leaf modules hold shared state and types (`config`, `types`, `clock`, `validate`,
//! `live`, `lifecycle`, `error`, `quota`, `metering`, `tenants`, `teams`); [`engine`](crate::Engine) holds the `Engine` value; each verb
//! module adds its own `impl Engine` block and imports only leaves.

mod admission;
pub mod agent_client;
mod build_admission;
mod checkpoints;
mod clock;
mod config;
mod disk_usage;
pub mod driver;
mod engine;
mod error;
mod gold;
mod guarded;
pub mod ids;
mod image_gc;
pub mod keys;
pub mod lifecycle;
mod live;
pub mod metering;
pub mod network;
mod pool_policy;
pub mod quota;
pub mod teams;
mod tenants;
#[cfg(feature = "testing")]
pub mod testing;
mod types;
mod validate;
pub mod volume_fs;
pub mod volume_storage;
mod volume_types;

// Verbs: each an `impl Engine` block.
mod changes;
mod connect;
mod create;
mod filler;
mod fork;
mod kill;
mod meter;
mod network_ops;
mod pause;
mod pool_source;
mod reaper;
mod recovery;
mod restore;
mod resume;
mod sandboxes;
mod secrets;
mod signed_urls;
mod snapshots;
mod team_keys;
pub mod telemetry;
mod template_builder;
pub mod template_builds;
mod template_exec;
mod template_image;
pub mod template_spec;
mod template_types;
mod templates;
mod tenancy;
mod timeout;
mod usage;
mod volume_content;
mod volumes;

pub use admission::AdmissionLimits;
pub use bulkhead_store::{UsageFilter, VolumeRow};
pub use checkpoints::CheckpointError;
pub use config::{
    BuildLimits, CheckpointPools, DEFAULT_SANDBOX_DISK_MB, EngineConfig, MIN_SANDBOX_DISK_MB,
};
pub use engine::Engine;
pub use error::{ChangesError, EngineError, NetworkError};
pub use fork::{DEFAULT_FORK_TIMEOUT_SECS, MAX_FORKS};
pub use image_gc::ImageGcError;
pub use lifecycle::{Operation, Refusal, SandboxState};
pub use metering::{ExhaustedAction, MeteringConfig, Prices, UsageReport};
pub use network::{NetworkRule, NetworkTransform, SandboxNetwork};
pub use pool_policy::{PoolConfig, PoolLimits};
pub use pool_source::{KERNELS_MANIFEST, PoolSource, PoolSourceError};
pub use quota::{Limit, QuotaError};
pub use types::{
    ApiKey, Caller, CreateGeneration, CreateRequest, EgressEvent, LifecyclePolicy, ListPage,
    ListRequest, OnTimeout, ResumeRequest, SandboxInfo, SecretInfo, SecretPage, SnapshotInfo,
    SnapshotPage, TemplateInfo, TemplateRuntime, TemplateStatus, Usage,
};
pub use volume_content::ContentAuth;
pub use volume_types::{MountRequest, VolumeError, VolumeInfo, validate_mounts, validate_name};
