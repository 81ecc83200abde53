//! The isolation driver contract. The engine owns sandbox logic; a driver only knows how to
//! start an isolated environment running the agent, reach that agent with a byte stream,
//! observe its death and tear it down, plus optional capabilities (freeze, checkpoint,
//! snapshot, a network link). Implementations: `bulkhead-jail` (namespaces) and later a
//! microvm driver; both depend on this crate alone, never on the engine.
//!
//! - [`driver`]: the [`Driver`] trait, the agent stream and resource usage;
//! - [`handle`]: [`SandboxSpec`] and the stored, versioned [`DriverHandle`];
//! - [`capability`]: [`Capabilities`] and the types of the optional operations;
//! - [`route`]: [`ByTemplate`], several drivers behind one (a driver per template);
//! - [`error`]: [`DriverError`] and [`StartError`];
//! - `fake` (feature `testing`): [`FakeDriver`], an in-memory driver for tests without root;
//! - `conformance` (feature `conformance`): the cases every driver must pass.

pub mod capability;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod driver;
pub mod error;
#[cfg(feature = "testing")]
pub mod fake;
pub mod handle;
pub mod route;

pub use capability::{
    Capabilities, ChangeKind, ChangeSource, CheckpointInfo, CheckpointOptions, FileChange,
    NetworkLink, Operation, RestoreOptions,
};
pub use driver::{AgentIo, AgentStream, Driver, ResourceUsage};
pub use error::{AgentExit, DriverError, StartError};
#[cfg(feature = "testing")]
pub use fake::{FakeDriver, FakeHost, FakeMemory};
pub use handle::{DRIVER_HANDLE_FORMAT, DriverHandle, SandboxSpec, VolumeMount};
pub use route::ByTemplate;
