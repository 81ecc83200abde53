//! Why a server (any role) could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::ConfigError;
use crate::network::NetworkSetupError;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "bulkhead serve must run as root (it creates namespaces, mounts and cgroups); try: sudo bulkhead serve"
    )]
    NotRoot,
    #[error("cannot create data dir {}", path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(bulkhead_store::StoreError),
    #[error(transparent)]
    Key(bulkhead_engine::keys::KeyError),
    #[error("cannot find the bulkhead executable")]
    Executable(#[source] std::io::Error),
    #[error(
        "the sandbox agent binary is missing at {}: build it with `cargo build -p bulkhead-agent` (same profile as bulkhead)",
        .0.display()
    )]
    AgentMissing(PathBuf),
    #[error(transparent)]
    Network(#[from] NetworkSetupError),
    #[error("cannot initialise the jail driver")]
    Driver(#[source] bulkhead_jail::JailError),
    #[error("cannot initialise the microvm driver")]
    Microvm(#[source] bulkhead_microvm::MicrovmError),
    /// Registering a template failed (the engine's error says why).
    #[error(transparent)]
    Template(bulkhead_engine::EngineError),
    /// Re-adopting the previous run's sandboxes failed.
    #[error(transparent)]
    Recover(bulkhead_engine::EngineError),
    #[error("cannot listen on {addr} (is another server running?)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("server failed")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Why a cluster role cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "a cluster needs a shared database: pass --database-url postgres://… (the same on every api and node)"
    )]
    NoSharedStore,
    #[error("BULKHEAD_NODE_TOKEN is empty: set the same join secret on every api and node")]
    NoToken,
    #[error(
        "a node keeps its template cache in <data-dir>/images (paths on the wire are relative to the data dir): drop --image-cache"
    )]
    ImageCacheOutside,
    #[error("the paths a replica hands its nodes could not be mapped")]
    Paths(#[source] bulkhead_node::remote::PathMapError),
    #[error("registering this node in the store failed")]
    Register(#[source] bulkhead_store::StoreError),
    #[error(transparent)]
    Replica(#[from] bulkhead_engine::cluster::ReplicaError),
}
