//! The node protocol `bulkhead.node.v1`: the contract between Bulkhead's control plane (the API
//! replicas' engine) and a `bulkhead node` daemon, where sandboxes run.
//!
//! - [`v1`]: the messages of `proto/bulkhead/node/v1/node.proto` and their proto3 JSON mapping,
//!   **generated at build time** (build.rs: protox, prost, pbjson, as crates/envd does). The
//!   .proto's header comment is the contract's documentation: transport, stale calls, the error
//!   model, paths.
//! - [`convert`]: `From`/`TryFrom` between those messages and the Rust types of
//!   `bulkhead-driver` and `bulkhead-envd` (and, with the `egress` feature, `bulkhead-egress`),
//!   with [`ConvertError`] for what a message cannot mean.
//! - [`paths`]: host paths on the wire are relative to the node's data directory; the checks
//!   and [`DataDir`], which resolves and confines them.
//!
//! The service itself is not generated (prost has no server or client here): the Connect
//! framing is crates/envd's, and the server and client come with the node daemon.

pub mod convert;
pub mod paths;

pub use convert::ConvertError;
pub use paths::DataDir;

/// The messages of `bulkhead.node.v1`, generated from `proto/bulkhead/node/v1/node.proto`.
///
/// prost's layout: enum-typed fields are `i32` on the struct (read them with the generated
/// getter, or through [`crate::convert`], which refuses unknown values); a `oneof` is an
/// `Option<Enum>` in a module named after its message; nested messages and enums live in that
/// module too (`node_error::Code`, `driver_fault::Kind`).
#[allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/bulkhead.node.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/bulkhead.node.v1.serde.rs"));
}

/// Fully qualified name of the service (the first part of every Connect path).
pub const SERVICE: &str = "bulkhead.node.v1.Node";

/// The revision of `bulkhead.node.v1` this build speaks, announced in `InfoResponse`: bumped when
/// an RPC or a field a caller must not use with older nodes is added (docs/versioning.md).
pub const PROTOCOL_VERSION: u32 = 1;

/// The compiled `FileDescriptorSet` of the .proto (binary protobuf): what the service offers, for
/// tests and reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/bulkhead.node.v1.fds.bin"));
