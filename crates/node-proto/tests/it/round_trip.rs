//! Rust value → message → binary and JSON → message → Rust value, equal to the original.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bulkhead_driver::{
    Capabilities, ChangeKind, ChangeSource, CheckpointInfo, CheckpointOptions, DriverHandle,
    FileChange, NetworkLink, ResourceUsage, RestoreOptions, SandboxSpec, VolumeMount,
};
use bulkhead_egress::{HeaderRule, NetworkPolicy};
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;
use bulkhead_node_proto::v1;
use proptest::prelude::*;
use serde_json::Value;

use crate::over_the_wire;

/// JSON as drivers write it: no floats (serde_json does not round-trip every float exactly, and
/// handles hold paths, names and numbers).
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A path as the wire carries it: relative, plain components.
pub fn wire_path() -> impl Strategy<Value = PathBuf> {
    prop::collection::vec("[a-zA-Z0-9_-][a-zA-Z0-9_.-]{0,9}", 1..5)
        .prop_map(|parts| PathBuf::from(parts.join("/")))
}

pub fn handle() -> impl Strategy<Value = DriverHandle> {
    (
        any::<u32>(),
        "[a-z]{1,8}",
        any::<i32>(),
        any::<u64>(),
        any::<u32>(),
        json(),
        prop::option::of("[a-z0-9-]{0,8}"),
    )
        .prop_map(
            |(format, driver, pid, pid_start_time, slot, data, node)| DriverHandle {
                format,
                driver,
                pid,
                pid_start_time,
                slot,
                data,
                node,
            },
        )
}

fn volume() -> impl Strategy<Value = VolumeMount> {
    (".{0,10}", wire_path(), "/[a-z/]{0,10}").prop_map(|(name, host_dir, path)| VolumeMount {
        name,
        host_dir,
        path,
    })
}

fn spec() -> impl Strategy<Value = SandboxSpec> {
    (
        ".{0,10}",
        wire_path(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(volume(), 0..3),
    )
        .prop_map(
            |(template_id, rootfs, cpu_count, memory_mb, pids_max, disk_mb, volumes)| SandboxSpec {
                template_id,
                rootfs,
                cpu_count,
                memory_mb,
                pids_max,
                disk_mb,
                volumes,
            },
        )
}

fn capabilities() -> impl Strategy<Value = Capabilities> {
    let link = prop_oneof![
        Just(NetworkLink::None),
        Just(NetworkLink::TunInNetns),
        Just(NetworkLink::VmNic)
    ];
    (any::<[bool; 7]>(), link).prop_map(|(b, network)| Capabilities {
        freeze: b[0],
        checkpoint: b[1],
        snapshot: b[2],
        network,
        warm_start: b[3],
        changes: b[4],
        export_changes: b[5],
        checkpoint_key: b[6],
    })
}

fn file_change() -> impl Strategy<Value = FileChange> {
    let kind = prop_oneof![
        Just(ChangeKind::Created),
        Just(ChangeKind::Modified),
        Just(ChangeKind::Deleted)
    ];
    (
        "/.{0,12}",
        kind,
        "file|dir|symlink|other",
        any::<u64>(),
        any::<Option<i64>>(),
    )
        .prop_map(|(path, kind, file_type, size, mtime)| FileChange {
            path,
            kind,
            file_type,
            size,
            mtime,
        })
}

fn headers() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map("[A-Za-z-]{1,10}", ".{0,12}", 0..3)
}

fn policy() -> impl Strategy<Value = NetworkPolicy> {
    let rules = prop::collection::btree_map(
        "[a-z.*]{1,12}",
        prop::collection::vec(headers().prop_map(|headers| HeaderRule { headers }), 0..3),
        0..3,
    );
    let list = || prop::collection::vec(".{0,12}", 0..4);
    (
        any::<bool>(),
        list(),
        list(),
        rules,
        any::<Option<String>>(),
    )
        .prop_map(
            |(allow_internet, allow_out, deny_out, rules, secret_scope)| NetworkPolicy {
                allow_internet,
                allow_out,
                deny_out,
                rules,
                secret_scope,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn driver_handle(h in handle()) {
        let back = DriverHandle::try_from(over_the_wire(&v1::DriverHandle::from(&h))).unwrap();
        prop_assert_eq!(back, h);
    }

    #[test]
    fn sandbox_spec(s in spec()) {
        let message = v1::SandboxSpec::try_from(&s).unwrap();
        prop_assert_eq!(SandboxSpec::try_from(over_the_wire(&message)).unwrap(), s);
    }

    #[test]
    fn volume_mount(v in volume()) {
        let message = v1::VolumeMount::try_from(&v).unwrap();
        prop_assert_eq!(VolumeMount::try_from(over_the_wire(&message)).unwrap(), v);
    }

    #[test]
    fn capabilities_(c in capabilities()) {
        let back = Capabilities::try_from(over_the_wire(&v1::Capabilities::from(&c))).unwrap();
        prop_assert_eq!(back, c);
    }

    #[test]
    fn checkpoint_options(leave_running: bool, filesystem_only: bool) {
        let o = CheckpointOptions { leave_running, filesystem_only };
        let back = CheckpointOptions::from(over_the_wire(&v1::CheckpointOptions::from(&o)));
        prop_assert_eq!(back, o);
    }

    #[test]
    fn restore_options(consume: bool, filesystem_only: bool, access_token: Option<String>) {
        let o = RestoreOptions { consume, filesystem_only, access_token };
        let back = RestoreOptions::from(over_the_wire(&v1::RestoreOptions::from(&o)));
        prop_assert_eq!(back, o);
    }

    #[test]
    fn checkpoint_info(
        driver in "[a-z]{1,8}",
        format: u32,
        dir in wire_path(),
        size_bytes: u64,
        memory: bool,
    ) {
        let i = CheckpointInfo { driver, format, dir, size_bytes, memory };
        let message = v1::CheckpointInfo::try_from(&i).unwrap();
        prop_assert_eq!(CheckpointInfo::try_from(over_the_wire(&message)).unwrap(), i);
    }

    #[test]
    fn file_change_(c in file_change()) {
        let back = FileChange::try_from(over_the_wire(&v1::FileChange::from(&c))).unwrap();
        prop_assert_eq!(back, c);
    }

    #[test]
    fn change_source(
        s in prop_oneof![
            handle().prop_map(ChangeSource::Running),
            wire_path().prop_map(ChangeSource::Checkpoint),
        ],
    ) {
        let message = v1::ChangeSource::try_from(&s).unwrap();
        prop_assert_eq!(ChangeSource::try_from(over_the_wire(&message)).unwrap(), s);
    }

    #[test]
    fn resource_usage(n: [u64; 7]) {
        let u = ResourceUsage {
            cpu_usage_ns: n[0],
            mem_used_bytes: n[1],
            mem_cache_bytes: n[2],
            mem_limit_bytes: n[3],
            disk_used_bytes: n[4],
            disk_total_bytes: n[5],
            pids_current: n[6],
        };
        let back = ResourceUsage::from(over_the_wire(&v1::ResourceUsage::from(&u)));
        prop_assert_eq!(back, u);
    }

    #[test]
    fn init_request(
        env_vars in prop::option::of(headers()),
        access_token: Option<String>,
        default_user: Option<String>,
        default_workdir: Option<String>,
        hostname: Option<String>,
    ) {
        // `Some(empty)` and `None` both occur: the wrapper message keeps them apart.
        let r = InitRequest { env_vars, access_token, default_user, default_workdir, hostname };
        let back = InitRequest::from(over_the_wire(&v1::InitRequest::from(&r)));
        prop_assert_eq!(back, r);
    }

    #[test]
    fn agent_info(protocol_version: u32, agent_build in ".{0,12}") {
        let i = AgentInfo { protocol_version, agent_build };
        prop_assert_eq!(AgentInfo::from(over_the_wire(&v1::AgentInfo::from(&i))), i);
    }

    #[test]
    fn network_policy(p in policy()) {
        let back = NetworkPolicy::from(over_the_wire(&v1::NetworkPolicy::from(&p)));
        prop_assert_eq!(back, p);
    }
}

#[test]
fn init_request_keeps_empty_env_vars_apart_from_none() {
    let empty = InitRequest {
        env_vars: Some(BTreeMap::new()),
        ..InitRequest::default()
    };
    let message = over_the_wire(&v1::InitRequest::from(&empty));
    assert!(message.env_vars.is_some());
    assert_eq!(InitRequest::from(message), empty);
    let none = over_the_wire(&v1::InitRequest::from(&InitRequest::default()));
    assert_eq!(none.env_vars, None);
}

#[test]
fn the_json_form_is_the_proto3_mapping() {
    // What curl shows: lowerCamelCase names, 64-bit integers as strings, enums by name.
    let h = DriverHandle::new("jail", 7, 8, 9, serde_json::json!({"cgroup": "9-ab"}));
    assert_eq!(
        serde_json::to_string(&v1::DriverHandle::from(&h)).unwrap(),
        r#"{"format":1,"driver":"jail","pid":7,"pidStartTime":"8","slot":9,"dataJson":"{\"cgroup\":\"9-ab\"}"}"#
    );
    let c = FileChange {
        path: "/a".into(),
        kind: ChangeKind::Deleted,
        file_type: "file".into(),
        size: 0,
        mtime: None,
    };
    assert_eq!(
        serde_json::to_string(&v1::FileChange::from(&c)).unwrap(),
        r#"{"path":"/a","kind":"CHANGE_KIND_DELETED","fileType":"file","size":"0"}"#
    );
}
