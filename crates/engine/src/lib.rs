//! The engine: the one API that owns sandbox logic. REST, Connect, MCP and the CLI translate
//! into calls on [`Engine`]; none of them holds sandbox state of its own.
//!
//! Lifecycle of a sandbox: a warm pool per template keeps started, anonymous sandboxes; create
//! claims one (or starts one cold when the pool is empty), gives it an identity through the
//! agent's `/init` (env vars, access token), records it in the store and arms its TTL. A watcher
//! task per sandbox notices its death; a reaper kills sandboxes whose `end_at` passed.

pub mod agent_client;
pub mod driver;
mod engine;
mod error;
pub mod ids;
pub mod keys;
pub mod lifecycle;
pub mod network;
#[cfg(feature = "testing")]
pub mod testing;

pub use engine::{
    CreateRequest, Engine, EngineConfig, ListPage, ListRequest, SandboxInfo, SecretInfo,
    SecretPage, TemplateInfo, Usage,
};
pub use error::EngineError;
pub use lifecycle::{Operation, Refusal, SandboxState};
pub use network::{NetworkRule, NetworkTransform, SandboxNetwork};
