//! Wire types of the envd API (the in-sandbox daemon E2B's SDKs talk to), shared by the agent
//! (server side) and the CLI (client side).
//!
//! - [`process`] and [`filesystem`]: the messages of the `process.Process` and
//!   `filesystem.Filesystem` Connect services, with proto3 JSON (de)serialization. The contract
//!   they implement is checked in as `proto/process/process.proto` and
//!   `proto/filesystem/filesystem.proto`; `tests/proto_contract.rs` parses those files and checks
//!   every field's JSON name against these types.
//! - [`connect`]: Connect protocol framing (envelopes, end-of-stream), error codes and their
//!   HTTP status mapping.
//! - [`rest`]: the plain-HTTP routes (`/files`, `/init`, `/metrics`), signed file URLs and the
//!   routing/auth headers.
//! - [`protocol`]: the host↔agent protocol version (`AgentInfo`, the oldest supported agent).
//! - [`json`]: the proto3 JSON mapping helpers the message types are built from.

pub mod connect;
pub mod filesystem;
pub mod json;
pub mod process;
pub mod protocol;
pub mod rest;

pub use connect::{Code, ConnectError};

/// envd version reported to the SDKs, which gate features on it: 0.6.4 is the highest version
/// whose gated features (recursive watch, stdin, CloseStdin, octet-stream uploads, metadata,
/// `include_entry`, `allow_network_mounts`) all exist here; later ones may gate what does not.
pub const ENVD_VERSION: &str = "0.6.4";
