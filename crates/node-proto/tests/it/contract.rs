//! The contract cannot fall behind the trait: every method of the engine's `Node` trait
//! (crates/engine/src/node/mod.rs) has its RPC in `bulkhead.node.v1.Node`, and every RPC is a
//! method of the trait. Also the shape rules the .proto keeps by convention: unary
//! `<Rpc>Request` → `<Rpc>Response`, and a `CallContext context = 1` in every request.

use std::collections::BTreeSet;

use bulkhead_node_proto::{FILE_DESCRIPTOR_SET, SERVICE};
use prost::Message;
use prost_types::{FileDescriptorSet, ServiceDescriptorProto};

const TRAIT_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../engine/src/node/mod.rs");

/// Methods of the trait that one RPC answers together (they never change while a node runs).
const IN_INFO: &[&str] = &[
    "driver_name",
    "capabilities",
    "has_egress",
    "checkpoint_key",
];

/// The method names of `pub trait Node`, by a text scan: every `fn name` between the trait's
/// opening line and its closing brace at the start of a line.
fn trait_methods() -> Vec<String> {
    let source = std::fs::read_to_string(TRAIT_FILE).expect("the engine's node module is there");
    let body: Vec<&str> = source
        .lines()
        .skip_while(|l| !l.starts_with("pub trait Node:"))
        .skip(1)
        .take_while(|l| *l != "}")
        .collect();
    assert!(!body.is_empty(), "no `pub trait Node:` in {TRAIT_FILE}");
    body.iter()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("async fn ")
                .or_else(|| line.strip_prefix("fn "))?;
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
            Some(rest[..end].to_string())
        })
        .collect()
}

fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn service() -> (FileDescriptorSet, ServiceDescriptorProto) {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the embedded set decodes");
    let (package, name) = SERVICE.rsplit_once('.').unwrap();
    let service = set
        .file
        .iter()
        .filter(|f| f.package() == package)
        .flat_map(|f| f.service.iter())
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("{SERVICE} is not in the descriptor set"))
        .clone();
    (set, service)
}

#[test]
fn every_trait_method_has_its_rpc_and_every_rpc_a_method() {
    let methods = trait_methods();
    // The scan found the trait, not a fragment of it.
    assert!(
        methods.len() >= 30,
        "only {methods:?} found in {TRAIT_FILE}"
    );
    let expected: BTreeSet<String> = methods
        .iter()
        .map(|m| {
            if IN_INFO.contains(&m.as_str()) {
                "Info".to_string()
            } else {
                camel(m)
            }
        })
        .collect();
    let (_, service) = service();
    let rpcs: BTreeSet<String> = service
        .method
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    let missing: Vec<_> = expected.difference(&rpcs).collect();
    let extra: Vec<_> = rpcs.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the Node trait and {SERVICE} differ: methods without an RPC {missing:?} (add them to \
         node.proto), RPCs without a method {extra:?} (the trait lost them: deprecate, never \
         renumber)"
    );
}

#[test]
fn rpcs_are_unary_with_their_own_messages_and_a_call_context() {
    let (set, service) = service();
    let package = SERVICE.rsplit_once('.').unwrap().0;
    let message = |full: &str| {
        let name = full
            .strip_prefix(&format!(".{package}."))
            .unwrap_or_else(|| panic!("{full} is not in {package}"));
        set.file
            .iter()
            .flat_map(|f| f.message_type.iter())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("no message {name}"))
            .clone()
    };
    for m in &service.method {
        let name = m.name();
        assert!(
            !m.client_streaming() && !m.server_streaming(),
            "{name} streams"
        );
        assert_eq!(m.input_type(), format!(".{package}.{name}Request"));
        assert_eq!(m.output_type(), format!(".{package}.{name}Response"));
        let request = message(m.input_type());
        let first = request
            .field
            .iter()
            .find(|f| f.number() == 1)
            .unwrap_or_else(|| panic!("{name}Request has no field 1"));
        assert_eq!(
            (first.name(), first.type_name()),
            ("context", format!(".{package}.CallContext").as_str()),
            "{name}Request must start with `CallContext context = 1`"
        );
    }
}
