//! The node protocol `bulkhead.node.v1` on the network: what puts a network under the engine's
//! `Node` seam (crates/engine/src/node/mod.rs).
//!
//! - [`server`]: [`NodeServer`], an axum `Router` serving every RPC of the service as a Connect
//!   unary call (`POST /bulkhead.node.v1.Node/<Method>`, `application/proto` or
//!   `application/json`) over any `Arc<dyn Node>`, and the data path
//!   (`GET /bulkhead.node.v1.Node/AgentStream`, an HTTP/1.1 upgrade spliced to
//!   `AgentPath::open`'s stream). Bearer-token auth, the node's epoch, paths confined to its data
//!   directory.
//! - [`remote`]: [`RemoteNode`], the engine's `Node` and `AgentPath` against one node's base URL
//!   and token (hyper's pooled HTTP/1.1 client), so `Engine::with_node` drives a node elsewhere
//!   exactly as it drives its `LocalNode`.
//! - [`errors`]: the engine's `NetworkError` and `AgentCallError` ↔ the `NodeError` detail (the
//!   driver's errors convert in node-proto), so the engine sees the error the node saw.
//! - [`wire`]: the Connect framing both sides share: codecs, the JSON error body and its detail.
//!
//! The link carries the node's token and the agents' access tokens: run it on a private network
//! or behind a TLS-terminating proxy (this crate speaks plain HTTP).

pub mod errors;
pub mod remote;
pub mod server;
pub mod wire;

pub use remote::{NodeInfo, PathMap, RemoteConfig, RemoteError, RemoteNode};
pub use server::{NodeServer, ServerConfig};

/// The path of the data path's upgrade (`GET`, `Upgrade: bulkhead-agent`).
pub const AGENT_STREAM_PATH: &str = "/bulkhead.node.v1.Node/AgentStream";
/// The `Upgrade` protocol of the data path.
pub const AGENT_STREAM_PROTOCOL: &str = "bulkhead-agent";
/// Header of the data path naming the sandbox: its `DriverHandle` message, binary protobuf,
/// standard base64.
pub const HANDLE_HEADER: &str = "bulkhead-agent-handle";
/// Header of the data path carrying the caller's `CallContext.node_epoch` (decimal), checked as
/// a unary call's is.
pub const EPOCH_HEADER: &str = "bulkhead-node-epoch";
