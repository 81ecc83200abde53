//! Wire types of the envd API (the in-sandbox daemon E2B's SDKs talk to), shared by the agent
//! (server side) and the CLI (client side).
//!
//! - [`process`] and [`filesystem`]: the messages of the `process.Process` and
//!   `filesystem.Filesystem` Connect services and their proto3 JSON mapping, **generated at build
//!   time** from the contract checked in as `proto/process/process.proto` and
//!   `proto/filesystem/filesystem.proto` (E2B's envd protos, as the official SDKs use them).
//! - [`connect`]: Connect protocol framing (envelopes, end-of-stream), error codes and their
//!   HTTP status mapping, and the JSON codec entry points. Written by hand: it is small, and the
//!   agent needs control over streaming, keepalives and deadlines.
//! - [`rest`]: the plain-HTTP routes (`/files`, `/init`, `/metrics`), signed file URLs, the
//!   routing/auth headers, and the routes only the host may call.
//! - [`protocol`]: the host↔agent protocol version (`AgentInfo`, the oldest supported agent).
//!
//! # Code generation
//!
//! `build.rs` compiles the .proto files with [`protox`](https://docs.rs/protox) (pure Rust, so
//! neither developers nor CI need `protoc`), generates the structs with
//! [`prost-build`](https://docs.rs/prost-build) and their serde impls with
//! [`pbjson-build`](https://docs.rs/pbjson-build). These are the maintained, widely used
//! toolchain for protobuf in Rust (prost is what tonic and OpenTelemetry use) and leave the
//! Connect framing to us; `connectrpc` + `buffa` would bring a second HTTP stack and are pre-1.0.
//! All four crates are pinned exactly in `Cargo.toml`, because a new version may change the
//! generated code and with it the wire; `tests/it/wire_json.rs` pins the JSON byte for byte.

pub mod connect;
pub mod filesystem;
pub mod process;
pub mod protocol;
pub mod rest;
mod timestamp;

/// Well-known protobuf types the envd protos use, generated like the messages.
pub mod google {
    /// `google.protobuf`.
    pub mod protobuf {
        include!(concat!(env!("OUT_DIR"), "/google.protobuf.rs"));
    }
}

pub use connect::{Code, ConnectError};
pub use google::protobuf::Timestamp;

/// envd version reported to the SDKs, which gate features on it: 0.6.4 is the highest version
/// whose gated features (recursive watch, stdin, CloseStdin, octet-stream uploads, metadata,
/// `include_entry`, `allow_network_mounts`) all exist here; later ones may gate what does not.
pub const ENVD_VERSION: &str = "0.6.4";
