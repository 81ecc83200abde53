//! Keeps the checked-in `.proto` contract and the Rust wire types in step.
//!
//! The `.proto` files under `proto/` are parsed with a small line-based parser; then, for every
//! message, every field is fed to the Rust type under its lowerCamelCase JSON name (and under its
//! original snake_case name, which proto3 JSON parsers must also accept) and must come back out
//! under the lowerCamelCase name with the same canonical value. A fully populated sample of each
//! message must round-trip exactly, so the types produce no field the contract lacks. Every
//! message and enum of the contract must have a Rust type, and vice versa.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bulkhead_envd::{filesystem as fs, process as pr};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// A minimal proto3 parser: enough for the contract files (one declaration per line).

#[derive(Debug, Clone)]
enum FieldType {
    Scalar(String),
    Named(String),
    Map(String, Box<FieldType>),
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    number: u32,
    ty: FieldType,
    repeated: bool,
    oneof: Option<String>,
}

#[derive(Debug, Default)]
struct Schema {
    /// Full message name → (scope for type resolution, fields).
    messages: BTreeMap<String, Vec<Field>>,
    /// Full enum name → values (name, number).
    enums: BTreeMap<String, Vec<(String, i32)>>,
}

#[derive(Debug)]
enum Scope {
    Message(String),
    Enum(String),
    Oneof(String),
    Service,
}

const SCALARS: &[&str] = &[
    "string", "bytes", "bool", "int32", "sint32", "uint32", "int64", "sint64", "uint64", "double",
    "float", "fixed32", "fixed64", "sfixed32", "sfixed64",
];

fn parse_type(text: &str) -> FieldType {
    if let Some(inner) = text.strip_prefix("map<").and_then(|t| t.strip_suffix('>')) {
        let (k, v) = inner.split_once(',').expect("map has two type arguments");
        return FieldType::Map(k.trim().to_owned(), Box::new(parse_type(v.trim())));
    }
    if SCALARS.contains(&text) {
        FieldType::Scalar(text.to_owned())
    } else {
        FieldType::Named(text.to_owned())
    }
}

fn parse_proto(text: &str, schema: &mut Schema) {
    let mut package = String::new();
    let mut stack: Vec<Scope> = Vec::new();
    let current_message = |stack: &[Scope]| -> Option<String> {
        stack.iter().rev().find_map(|s| match s {
            Scope::Message(m) => Some(m.clone()),
            _ => None,
        })
    };
    for (lineno, raw) in text.lines().enumerate() {
        let line = raw.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let ctx = || format!("line {}: {raw:?}", lineno + 1);
        if let Some(rest) = line.strip_prefix("package ") {
            package = rest.trim_end_matches(';').trim().to_owned();
            continue;
        }
        if line.starts_with("syntax ") || line.starts_with("import ") || line.starts_with("option ")
        {
            continue;
        }
        if line == "}" {
            stack
                .pop()
                .unwrap_or_else(|| panic!("unbalanced brace at {}", ctx()));
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "message" | "enum" => {
                let name = words[1].trim_end_matches('{').trim_end_matches("{}");
                let parent = current_message(&stack).unwrap_or_else(|| package.clone());
                let full = format!("{parent}.{name}");
                let empty = line.ends_with("{}");
                if words[0] == "message" {
                    schema.messages.entry(full.clone()).or_default();
                    if !empty {
                        stack.push(Scope::Message(full));
                    }
                } else {
                    schema.enums.entry(full.clone()).or_default();
                    assert!(!empty, "empty enum at {}", ctx());
                    stack.push(Scope::Enum(full));
                }
            }
            "oneof" => stack.push(Scope::Oneof(words[1].to_owned())),
            "service" => stack.push(Scope::Service),
            "rpc" => {}
            _ => match stack.last() {
                Some(Scope::Enum(e)) => {
                    let (name, number) = line
                        .trim_end_matches(';')
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad enum value at {}", ctx()));
                    let e = e.clone();
                    schema.enums.get_mut(&e).unwrap().push((
                        name.trim().to_owned(),
                        number
                            .trim()
                            .parse()
                            .unwrap_or_else(|_| panic!("bad number at {}", ctx())),
                    ));
                }
                Some(Scope::Message(_) | Scope::Oneof(_)) => {
                    let oneof = match stack.last() {
                        Some(Scope::Oneof(o)) => Some(o.clone()),
                        _ => None,
                    };
                    let message = current_message(&stack).unwrap();
                    let (decl, number) = line
                        .trim_end_matches(';')
                        .rsplit_once('=')
                        .unwrap_or_else(|| panic!("bad field at {}", ctx()));
                    let number: u32 = number
                        .trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("bad number at {}", ctx()));
                    let mut decl = decl.trim();
                    let mut repeated = false;
                    if let Some(rest) = decl.strip_prefix("repeated ") {
                        repeated = true;
                        decl = rest;
                    } else if let Some(rest) = decl.strip_prefix("optional ") {
                        decl = rest;
                    }
                    let (ty, name) = decl
                        .rsplit_once(' ')
                        .unwrap_or_else(|| panic!("bad field declaration at {}", ctx()));
                    schema.messages.get_mut(&message).unwrap().push(Field {
                        name: name.trim().to_owned(),
                        number,
                        ty: parse_type(ty.trim()),
                        repeated,
                        oneof,
                    });
                }
                _ => panic!("unexpected declaration at {}", ctx()),
            },
        }
    }
    assert!(stack.is_empty(), "unclosed scope at end of file: {stack:?}");
}

fn load_schema() -> Schema {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let mut schema = Schema::default();
    for file in ["process/process.proto", "filesystem/filesystem.proto"] {
        let text = std::fs::read_to_string(root.join(file)).expect("contract file exists");
        parse_proto(&text, &mut schema);
    }
    schema
}

/// Resolves a type name used inside `message` the way protoc does: innermost scope first.
fn resolve(schema: &Schema, message: &str, name: &str) -> String {
    if name == "google.protobuf.Timestamp" {
        return name.to_owned();
    }
    let mut scope = message.to_owned();
    loop {
        let candidate = format!("{scope}.{name}");
        if schema.messages.contains_key(&candidate) || schema.enums.contains_key(&candidate) {
            return candidate;
        }
        match scope.rsplit_once('.') {
            Some((parent, _)) => scope = parent.to_owned(),
            None => panic!("cannot resolve type {name} used in {message}"),
        }
    }
}

fn lower_camel(name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Sample values in canonical proto3 JSON form (what a serializer must produce).

fn scalar_sample(ty: &str) -> Value {
    match ty {
        "string" => json!("s"),
        "bytes" => json!("aGk="),
        "bool" => json!(true),
        "uint32" | "fixed32" => json!(7),
        "int32" | "sint32" | "sfixed32" => json!(-3),
        "int64" | "sint64" | "sfixed64" => json!("-1234567890123"),
        "uint64" | "fixed64" => json!("1234567890123"),
        "double" | "float" => json!(1.5),
        other => panic!("no sample for scalar {other}"),
    }
}

fn value_sample(schema: &Schema, message: &str, ty: &FieldType, depth: usize) -> Value {
    match ty {
        FieldType::Scalar(s) => scalar_sample(s),
        FieldType::Map(k, v) => {
            assert_eq!(k, "string", "only string map keys are sampled");
            json!({ "k": value_sample(schema, message, v, depth) })
        }
        FieldType::Named(name) => {
            let full = resolve(schema, message, name);
            if full == "google.protobuf.Timestamp" {
                json!("2024-01-02T03:04:05.500Z")
            } else if let Some(values) = schema.enums.get(&full) {
                let (name, _) = values
                    .iter()
                    .find(|(_, n)| *n != 0)
                    .expect("enum has a non-zero value");
                json!(name)
            } else {
                message_sample(schema, &full, depth + 1)
            }
        }
    }
}

fn field_sample(schema: &Schema, message: &str, field: &Field, depth: usize) -> Value {
    let v = value_sample(schema, message, &field.ty, depth);
    if field.repeated { json!([v]) } else { v }
}

/// Every plain field set, plus the first member of every oneof.
fn message_sample(schema: &Schema, message: &str, depth: usize) -> Value {
    assert!(depth < 8, "message nesting too deep at {message}");
    let mut seen_oneofs = BTreeSet::new();
    let mut obj = serde_json::Map::new();
    for field in &schema.messages[message] {
        if let Some(o) = &field.oneof
            && !seen_oneofs.insert(o.clone())
        {
            continue;
        }
        obj.insert(
            lower_camel(&field.name),
            field_sample(schema, message, field, depth),
        );
    }
    Value::Object(obj)
}

// ---------------------------------------------------------------------------------------------
// Registry of Rust types by full proto name.

type RoundTrip = fn(Value) -> Result<Value, String>;

fn rt<T: Serialize + DeserializeOwned>(v: Value) -> Result<Value, String> {
    let t: T = serde_json::from_value(v).map_err(|e| e.to_string())?;
    serde_json::to_value(&t).map_err(|e| e.to_string())
}

fn registry() -> BTreeMap<&'static str, RoundTrip> {
    let entries: Vec<(&'static str, RoundTrip)> = vec![
        ("process.PTY", rt::<pr::Pty>),
        ("process.PTY.Size", rt::<pr::pty::Size>),
        ("process.ProcessConfig", rt::<pr::ProcessConfig>),
        ("process.ListRequest", rt::<pr::ListRequest>),
        ("process.ProcessInfo", rt::<pr::ProcessInfo>),
        ("process.ListResponse", rt::<pr::ListResponse>),
        ("process.StartRequest", rt::<pr::StartRequest>),
        ("process.UpdateRequest", rt::<pr::UpdateRequest>),
        ("process.UpdateResponse", rt::<pr::UpdateResponse>),
        ("process.ProcessEvent", rt::<pr::ProcessEvent>),
        (
            "process.ProcessEvent.StartEvent",
            rt::<pr::process_event::StartEvent>,
        ),
        (
            "process.ProcessEvent.DataEvent",
            rt::<pr::process_event::DataEvent>,
        ),
        (
            "process.ProcessEvent.EndEvent",
            rt::<pr::process_event::EndEvent>,
        ),
        (
            "process.ProcessEvent.KeepAlive",
            rt::<pr::process_event::KeepAlive>,
        ),
        ("process.StartResponse", rt::<pr::StartResponse>),
        ("process.ConnectResponse", rt::<pr::ConnectResponse>),
        ("process.SendInputRequest", rt::<pr::SendInputRequest>),
        ("process.SendInputResponse", rt::<pr::SendInputResponse>),
        ("process.ProcessInput", rt::<pr::ProcessInput>),
        ("process.StreamInputRequest", rt::<pr::StreamInputRequest>),
        (
            "process.StreamInputRequest.StartEvent",
            rt::<pr::stream_input_request::StartEvent>,
        ),
        (
            "process.StreamInputRequest.DataEvent",
            rt::<pr::stream_input_request::DataEvent>,
        ),
        (
            "process.StreamInputRequest.KeepAlive",
            rt::<pr::stream_input_request::KeepAlive>,
        ),
        ("process.StreamInputResponse", rt::<pr::StreamInputResponse>),
        ("process.Signal", rt::<pr::Signal>),
        ("process.SendSignalRequest", rt::<pr::SendSignalRequest>),
        ("process.SendSignalResponse", rt::<pr::SendSignalResponse>),
        ("process.CloseStdinRequest", rt::<pr::CloseStdinRequest>),
        ("process.CloseStdinResponse", rt::<pr::CloseStdinResponse>),
        ("process.ConnectRequest", rt::<pr::ConnectRequest>),
        ("process.ProcessSelector", rt::<pr::ProcessSelector>),
        ("filesystem.MoveRequest", rt::<fs::MoveRequest>),
        ("filesystem.MoveResponse", rt::<fs::MoveResponse>),
        ("filesystem.MakeDirRequest", rt::<fs::MakeDirRequest>),
        ("filesystem.MakeDirResponse", rt::<fs::MakeDirResponse>),
        ("filesystem.RemoveRequest", rt::<fs::RemoveRequest>),
        ("filesystem.RemoveResponse", rt::<fs::RemoveResponse>),
        ("filesystem.StatRequest", rt::<fs::StatRequest>),
        ("filesystem.StatResponse", rt::<fs::StatResponse>),
        ("filesystem.EntryInfo", rt::<fs::EntryInfo>),
        ("filesystem.FileType", rt::<fs::FileType>),
        ("filesystem.ListDirRequest", rt::<fs::ListDirRequest>),
        ("filesystem.ListDirResponse", rt::<fs::ListDirResponse>),
        ("filesystem.WatchDirRequest", rt::<fs::WatchDirRequest>),
        ("filesystem.FilesystemEvent", rt::<fs::FilesystemEvent>),
        ("filesystem.EventType", rt::<fs::EventType>),
        ("filesystem.WatchDirResponse", rt::<fs::WatchDirResponse>),
        (
            "filesystem.WatchDirResponse.StartEvent",
            rt::<fs::watch_dir_response::StartEvent>,
        ),
        (
            "filesystem.WatchDirResponse.KeepAlive",
            rt::<fs::watch_dir_response::KeepAlive>,
        ),
        (
            "filesystem.CreateWatcherRequest",
            rt::<fs::CreateWatcherRequest>,
        ),
        (
            "filesystem.CreateWatcherResponse",
            rt::<fs::CreateWatcherResponse>,
        ),
        (
            "filesystem.GetWatcherEventsRequest",
            rt::<fs::GetWatcherEventsRequest>,
        ),
        (
            "filesystem.GetWatcherEventsResponse",
            rt::<fs::GetWatcherEventsResponse>,
        ),
        (
            "filesystem.RemoveWatcherRequest",
            rt::<fs::RemoveWatcherRequest>,
        ),
        (
            "filesystem.RemoveWatcherResponse",
            rt::<fs::RemoveWatcherResponse>,
        ),
    ];
    let map: BTreeMap<_, _> = entries.iter().copied().collect();
    assert_eq!(map.len(), entries.len(), "duplicate registry entry");
    map
}

// ---------------------------------------------------------------------------------------------

#[test]
fn parser_sees_the_whole_contract() {
    let schema = load_schema();
    assert_eq!(schema.messages.len() + schema.enums.len(), registry().len());
    let end = &schema.messages["process.ProcessEvent.EndEvent"];
    let names: Vec<_> = end.iter().map(|f| (f.name.as_str(), f.number)).collect();
    assert_eq!(
        names,
        [("exit_code", 1), ("exited", 2), ("status", 3), ("error", 4)]
    );
    let entry = &schema.messages["filesystem.EntryInfo"];
    assert_eq!(entry.len(), 12);
    assert_eq!(
        schema.enums["process.Signal"],
        [
            ("SIGNAL_UNSPECIFIED".to_owned(), 0),
            ("SIGNAL_SIGTERM".to_owned(), 15),
            ("SIGNAL_SIGKILL".to_owned(), 9)
        ]
    );
    let oneof: Vec<_> = schema.messages["process.ProcessEvent"]
        .iter()
        .map(|f| (f.name.as_str(), f.oneof.as_deref()))
        .collect();
    assert_eq!(
        oneof,
        [
            ("start", Some("event")),
            ("data", Some("event")),
            ("end", Some("event")),
            ("keepalive", Some("event"))
        ]
    );
}

#[test]
fn every_contract_type_has_a_rust_type_and_back() {
    let schema = load_schema();
    let registry = registry();
    let contract: BTreeSet<&str> = schema
        .messages
        .keys()
        .chain(schema.enums.keys())
        .map(String::as_str)
        .collect();
    let rust: BTreeSet<&str> = registry.keys().copied().collect();
    let missing: Vec<_> = contract.difference(&rust).collect();
    let extra: Vec<_> = rust.difference(&contract).collect();
    assert!(
        missing.is_empty(),
        "contract types without a Rust type: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "Rust types not in the contract: {extra:?}"
    );
}

#[test]
fn every_field_is_accepted_and_produced_under_its_json_name() {
    let schema = load_schema();
    let registry = registry();
    let mut checked = 0;
    for (message, fields) in &schema.messages {
        let roundtrip = registry[message.as_str()];
        for field in fields {
            let sample = field_sample(&schema, message, field, 0);
            let camel = lower_camel(&field.name);
            let mut names = vec![camel.clone()];
            if field.name != camel {
                names.push(field.name.clone());
            }
            for input_name in names {
                let input = json!({ input_name.clone(): sample.clone() });
                let output = roundtrip(input.clone()).unwrap_or_else(|e| {
                    panic!(
                        "{message}.{} (#{}) rejected as {input}: {e}",
                        field.name, field.number
                    )
                });
                assert_eq!(
                    output.get(&camel),
                    Some(&sample),
                    "{message}.{}: input {input} came back as {output}",
                    field.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 80, "only {checked} field checks ran");
}

#[test]
fn full_samples_round_trip_exactly() {
    let schema = load_schema();
    let registry = registry();
    for message in schema.messages.keys() {
        let sample = message_sample(&schema, message, 0);
        let output = registry[message.as_str()](sample.clone())
            .unwrap_or_else(|e| panic!("{message} rejected its full sample {sample}: {e}"));
        assert_eq!(output, sample, "{message} did not round-trip");
    }
}

#[test]
fn every_other_oneof_member_round_trips() {
    let schema = load_schema();
    let registry = registry();
    for (message, fields) in &schema.messages {
        for field in fields.iter().filter(|f| f.oneof.is_some()) {
            let input =
                json!({ lower_camel(&field.name): field_sample(&schema, message, field, 0) });
            let output = registry[message.as_str()](input.clone()).unwrap();
            assert_eq!(output, input, "{message}.{}", field.name);
        }
    }
}

#[test]
fn enum_values_accept_names_and_numbers() {
    let schema = load_schema();
    let registry = registry();
    for (name, values) in &schema.enums {
        let roundtrip = registry[name.as_str()];
        for (value, number) in values {
            assert_eq!(
                roundtrip(json!(value)).unwrap(),
                json!(value),
                "{name}.{value}"
            );
            assert_eq!(
                roundtrip(json!(number)).unwrap(),
                json!(value),
                "{name} = {number}"
            );
        }
    }
}

#[test]
fn empty_objects_are_valid_for_every_message() {
    let schema = load_schema();
    let registry = registry();
    for message in schema.messages.keys() {
        registry[message.as_str()](json!({}))
            .unwrap_or_else(|e| panic!("{message} rejected {{}}: {e}"));
        registry[message.as_str()](json!({"unknownField": [1, 2, {"x": null}]}))
            .unwrap_or_else(|e| panic!("{message} rejected an unknown field: {e}"));
    }
}
