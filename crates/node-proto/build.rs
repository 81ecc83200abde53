//! Generates the `bulkhead.node.v1` message types and their proto3 JSON mapping from `proto/`,
//! with the toolchain and options of crates/envd/build.rs (see there for the why of each):
//! `protox` compiles the .proto (no `protoc`), `prost-build` writes the structs, `pbjson-build`
//! their serde impls. Also writes the descriptor set, which the crate embeds
//! (`FILE_DESCRIPTOR_SET`) for tests and, later, reflection.
//!
//! Options as envd's: `btree_map` (sorted JSON objects), `emit_fields` (plain fields written at
//! their default, so a curl'd answer shows every field), and `ignore_unknown_fields` /
//! `ignore_unknown_enum_variants`, so a node one minor version older or newer reads what it knows
//! of a message and leaves the rest (an unknown enum value reads as `*_UNSPECIFIED`, which the
//! conversions then refuse by name).

use std::path::PathBuf;

const PROTOS: &[&str] = &["bulkhead/node/v1/node.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }

    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let encoded = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(out_dir.join("bulkhead.node.v1.fds.bin"), &encoded)?;

    prost_build::Config::new()
        .out_dir(&out_dir)
        .btree_map(["."])
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&encoded)?
        .btree_map(["."])
        .emit_fields()
        .ignore_unknown_fields()
        .ignore_unknown_enum_variants()
        .build(&[".bulkhead.node.v1"])?;
    Ok(())
}
