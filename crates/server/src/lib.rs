//! The server as a library: [`ServerConfig`] is the one validated configuration that
//! `bulkhead serve` (and later `bulkhead mcp --stdio` and a web console) build from flags and
//! environment; [`Server::prepare`] opens the store and seeds the first API key,
//! [`Prepared::start`] wires the egress proxy, the jail driver and the engine around the
//! templates the front end built, and [`Server::shutdown`] stops them in the right order.
//!
//! Template building stays with the front end (it owns the progress display); the library
//! takes the built root filesystems and sizes each template from the configuration.

mod cluster;
mod config;
mod drain;
mod error;
mod limits;
mod listener;
mod network;
mod node_side;
mod probe;
mod replica;
mod server;

pub use cluster::{NodeDaemon, NodeSettings};
pub use config::{
    ConfigError, DriverKind, NetworkConfig, NetworkDefault, ServerConfig, TemplateSize,
    default_pools,
};
pub use drain::{Drained, Drainer, wait_until_empty};
pub use error::{ClusterError, StartError};
pub use limits::{ConnectionLimits, LimitsError, Resolved as ResolvedLimits};
pub use listener::serve;
pub use network::NetworkSetupError;
pub use probe::Vouch;
pub use server::{BuiltTemplate, KeyBootstrap, Prepared, Server};
