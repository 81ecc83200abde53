//! [`RemoteNode`]: the engine's `Node` and `AgentPath` against one node reached over HTTP, so
//! `Engine::with_node(store, remote.clone(), remote, cfg)` drives sandboxes on another machine.
//!
//! - Calls: hyper's pooled HTTP/1.1 client, binary protobuf, the node's token, a deadline per
//!   call ([`RemoteConfig`]); failures come back as the exact error the node saw (its
//!   `NodeError` detail), or, without one, as an untyped `DriverError::Io` naming the node and
//!   the call ([`RemoteError`] is its cause).
//! - The per-node questions (`driver_name`, `capabilities`, `has_egress`, `checkpoint_key`) are
//!   plain sync getters in the trait: they answer from the node's `Info`, read at
//!   [`RemoteNode::connect`] and again by [`RemoteNode::refresh`] or when the node refuses a
//!   call as stale (it restarted), so from one cached `Info` per epoch. `owns` answers from the
//!   driver names the node said it owns when asked at the same time.
//! - `pool_stock` (sync too) asks nothing: it is the last `PoolStock` answer ([`refresh`]) kept
//!   up to date by this client's own `pool_put`, `pool_take`, `pool_take_surplus` and
//!   `pool_drain`; what other callers do to the node's pools shows at the next `refresh`.
//! - Paths: the engine's absolute paths become wire paths through a [`PathMap`].
//! - `wait` is a long poll, re-issued until the node says the sandbox is gone.
//! - `AgentPath::open` is an HTTP/1.1 upgrade of `GET /bulkhead.node.v1.Node/AgentStream`.
//!
//! [`refresh`]: RemoteNode::refresh

mod call;
mod client;
mod error;
mod node;
mod paths;
mod stream;

pub use client::{NodeInfo, RemoteConfig, RemoteNode};
pub use error::RemoteError;
pub use paths::{PathMap, PathMapError};
