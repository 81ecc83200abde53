//! The engine's errors across the wire: `NetworkError` and `AgentCallError` ↔ the `NodeError`
//! detail (the driver's `DriverError` converts in node-proto; these types live in the engine,
//! which node-proto does not depend on). What comes back is the error the node saw: the same
//! variant, fields, message and chain of causes, so the engine's answers do not depend on where
//! the sandbox runs.
//!
//! Where the wire cannot carry a cause typed (hyper's, serde's and the egress proxy's errors are
//! sent as their messages, as node.proto says), it comes back as a
//! [`RemoteCause`](bulkhead_node_proto::convert::RemoteCause) chain with the same messages; the
//! exceptions are listed in [`egress`] and [`agent`].

pub mod agent;
pub mod egress;
mod fault;
mod network;

pub use agent::{agent_call_detail, agent_call_error};
pub use fault::DetailError;
pub use network::{driver_error, network_detail, network_error};
