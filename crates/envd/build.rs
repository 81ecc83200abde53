//! Generates the envd message types and their proto3 JSON mapping from `proto/`.
//!
//! 1. `protox` (a pure-Rust protobuf compiler, so builds need no `protoc`) parses the .proto
//!    files into a descriptor set; `google/protobuf/timestamp.proto` comes built in.
//! 2. `prost-build` turns the descriptors into Rust structs, enums and oneofs.
//! 3. `pbjson-build` writes serde impls following the proto3 JSON mapping for them.
//!
//! Options and why (the wire must match what E2B's envd and SDKs send byte for byte):
//! - `bytes(".")`: `bytes` fields are `bytes::Bytes`, so process output is not copied.
//! - `btree_map(".")`: maps are `BTreeMap`, so JSON objects come out with sorted keys.
//! - `emit_fields()`: plain (non-`optional`) fields are written even at their default value,
//!   as envd does (`"pid":0`, `"exited":false`, `"metadata":{}`); `optional` fields and
//!   messages are still left out when unset.
//! - `ignore_unknown_fields()`, `ignore_unknown_enum_variants()`: a newer SDK's additions are
//!   ignored instead of failing the call (unknown enum values read as `*_UNSPECIFIED`).
//! - `google.protobuf.Timestamp` is compiled here instead of taken from `pbjson-types`, whose
//!   JSON form ends in `+00:00`; ours ends in `Z` as the proto3 mapping requires (see
//!   `src/timestamp.rs`).

use std::path::PathBuf;

const PROTOS: &[&str] = &["process/process.proto", "filesystem/filesystem.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }

    let descriptors = protox::compile(PROTOS, ["proto"])?;

    prost_build::Config::new()
        .out_dir(&out_dir)
        .bytes(["."])
        .btree_map(["."])
        .compile_well_known_types()
        // The `filesystem` member carries a whole event; the others are empty. Boxing it would
        // cost an allocation per event for no gain: values are short-lived.
        .enum_attribute(
            ".filesystem.WatchDirResponse.event",
            "#[allow(clippy::large_enum_variant)]",
        )
        .compile_fds(descriptors.clone())?;

    let encoded = prost::Message::encode_to_vec(&descriptors);
    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&encoded)?
        .btree_map(["."])
        .emit_fields()
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
