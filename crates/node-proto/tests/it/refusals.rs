//! What a message cannot mean gives a typed `ConvertError` naming the field: unknown enum values
//! (binary and JSON), missing required fields, bad paths, bad JSON; and `DataDir` confines paths.

use std::path::{Path, PathBuf};

use bulkhead_driver::{
    Capabilities, ChangeSource, CheckpointInfo, DriverError, DriverHandle, FileChange, SandboxSpec,
    StartError,
};
use bulkhead_node_proto::paths::PathError;
use bulkhead_node_proto::v1::{driver_fault, start_fault};
use bulkhead_node_proto::{ConvertError, DataDir, v1};
use prost::Message;

fn handle() -> v1::DriverHandle {
    v1::DriverHandle::from(&DriverHandle::new("jail", 1, 2, 3, serde_json::Value::Null))
}

fn file_change(kind: i32) -> v1::FileChange {
    v1::FileChange {
        path: "/a".into(),
        kind,
        file_type: "file".into(),
        size: 1,
        mtime: Some(2),
    }
}

/// Asserts an unknown-enum refusal of `field` holding `value`, and that the message names both.
fn unknown(result: Result<impl std::fmt::Debug, ConvertError>, field: &str, value: i32) {
    match result {
        Err(
            e @ ConvertError::UnknownEnum {
                field: f, value: v, ..
            },
        ) => {
            assert_eq!((f, v), (field, value));
            let text = e.to_string();
            assert!(
                text.contains(field) && text.contains(&value.to_string()),
                "{text}"
            );
        }
        other => panic!("expected an unknown {field} = {value}, got {other:?}"),
    }
}

/// Asserts a missing-field refusal of `field`.
fn missing(result: Result<impl std::fmt::Debug, ConvertError>, field: &str) {
    match result {
        Err(e @ ConvertError::MissingField { field: f }) => {
            assert_eq!(f, field);
            assert!(e.to_string().contains(field), "{e}");
        }
        other => panic!("expected {field} missing, got {other:?}"),
    }
}

#[test]
fn unknown_enum_values_are_refused_by_name() {
    // Through the binary form: prost keeps the number it does not know.
    let bytes = file_change(99).encode_to_vec();
    let decoded = v1::FileChange::decode(bytes.as_slice()).unwrap();
    unknown(FileChange::try_from(decoded), "FileChange.kind", 99);
    unknown(FileChange::try_from(file_change(0)), "FileChange.kind", 0);

    let caps = v1::Capabilities {
        network: 42,
        ..v1::Capabilities::from(&Capabilities::default())
    };
    unknown(Capabilities::try_from(caps), "Capabilities.network", 42);
    unknown(
        Capabilities::try_from(v1::Capabilities::default()),
        "Capabilities.network",
        0,
    );

    let fault = v1::DriverFault {
        kind: Some(driver_fault::Kind::Unsupported(driver_fault::Unsupported {
            operation: 77,
            driver: "jail".into(),
        })),
    };
    unknown(
        DriverError::try_from(fault),
        "DriverFault.Unsupported.operation",
        77,
    );

    let io = v1::DriverFault {
        kind: Some(driver_fault::Kind::Connect(v1::IoFault {
            kind: 1000,
            raw_os_error: None,
            messages: vec!["x".into()],
        })),
    };
    unknown(DriverError::try_from(io), "IoFault.kind", 1000);
}

#[test]
fn unknown_enum_names_in_json_read_as_unset_and_are_refused() {
    // A newer peer's value: the JSON decoder ignores it (reads 0), the conversion refuses 0.
    let json = r#"{"path":"/a","kind":"CHANGE_KIND_RENAMED","fileType":"file","size":"1"}"#;
    let message: v1::FileChange = serde_json::from_str(json).unwrap();
    unknown(FileChange::try_from(message), "FileChange.kind", 0);
    // And unknown fields are ignored, not refused (a node one version apart).
    let json =
        r#"{"path":"/a","kind":"CHANGE_KIND_CREATED","fileType":"file","size":"1","owner":"root"}"#;
    let message: v1::FileChange = serde_json::from_str(json).unwrap();
    assert!(FileChange::try_from(message).is_ok());
}

#[test]
fn missing_required_fields_are_refused_by_name() {
    missing(
        ChangeSource::try_from(v1::ChangeSource { source: None }),
        "ChangeSource.source",
    );
    missing(
        DriverHandle::try_from(v1::DriverHandle {
            data_json: String::new(),
            ..handle()
        }),
        "DriverHandle.data_json",
    );
    missing(
        bulkhead_node_proto::convert::driver::handle(None, "StartResponse.handle"),
        "StartResponse.handle",
    );
    missing(
        DriverError::try_from(v1::DriverFault { kind: None }),
        "DriverFault.kind",
    );
    missing(
        DriverError::try_from(v1::DriverFault {
            kind: Some(driver_fault::Kind::Io(driver_fault::Io {
                context: "c".into(),
                source: None,
            })),
        }),
        "DriverFault.Io.source",
    );
    let start = |kind| v1::DriverFault {
        kind: Some(driver_fault::Kind::Start(v1::StartFault {
            kind: Some(kind),
        })),
    };
    missing(
        DriverError::try_from(start(start_fault::Kind::AgentExited(
            start_fault::AgentExited {
                exit: None,
                output: String::new(),
            },
        ))),
        "StartFault.AgentExited.exit",
    );
    missing(
        DriverError::try_from(start(start_fault::Kind::AgentExited(
            start_fault::AgentExited {
                exit: Some(v1::AgentExit { how: None }),
                output: String::new(),
            },
        ))),
        "AgentExit.how",
    );
    missing(
        DriverError::try_from(start(start_fault::Kind::Setup(start_fault::Setup {
            causes: Vec::new(),
        }))),
        "StartFault.Setup.causes",
    );
    missing(
        StartError::try_from(v1::StartFault { kind: None }),
        "StartFault.kind",
    );
    missing(
        DriverError::try_from(v1::NodeError {
            code: v1::node_error::Code::Driver.into(),
            ..v1::NodeError::default()
        }),
        "NodeError.driver",
    );
}

#[test]
fn out_of_range_and_bad_json_are_refused() {
    let fault = v1::StartFault {
        kind: Some(start_fault::Kind::AgentTimeout(start_fault::AgentTimeout {
            timeout_seconds: 1,
            timeout_nanos: 1_000_000_000,
            output: String::new(),
        })),
    };
    assert!(matches!(
        StartError::try_from(fault),
        Err(ConvertError::OutOfRange {
            field: "StartFault.AgentTimeout.timeout_nanos",
            ..
        })
    ));
    let bad = v1::DriverHandle {
        data_json: "{".into(),
        ..handle()
    };
    assert!(matches!(
        DriverHandle::try_from(bad),
        Err(ConvertError::BadJson {
            field: "DriverHandle.data_json",
            ..
        })
    ));
}

#[test]
fn paths_must_be_plain_and_relative_both_ways() {
    let spec = |rootfs: &str| SandboxSpec {
        template_id: "base".into(),
        rootfs: PathBuf::from(rootfs),
        cpu_count: 1,
        memory_mb: 512,
        pids_max: 100,
        disk_mb: 0,
        volumes: Vec::new(),
    };
    for (path, why) in [
        ("/var/lib/bulkhead/templates/base", "absolute"),
        ("templates/../../etc", "not plain"),
        ("./templates", "not plain"),
        ("", "empty"),
    ] {
        let refused = |r: Result<_, ConvertError>| match r {
            Err(ConvertError::BadPath {
                field: "SandboxSpec.rootfs",
                source,
            }) => match (why, source) {
                ("absolute", PathError::Absolute(_))
                | ("not plain", PathError::NotPlain(_))
                | ("empty", PathError::Empty) => {}
                (_, other) => panic!("{path:?}: expected {why}, got {other:?}"),
            },
            other => panic!("{path:?}: expected a bad path, got {other:?}"),
        };
        refused(v1::SandboxSpec::try_from(&spec(path)).map(|_| ()));
        let message = v1::SandboxSpec {
            rootfs: path.to_string(),
            ..v1::SandboxSpec::default()
        };
        refused(SandboxSpec::try_from(message).map(|_| ()));
    }
    let info = CheckpointInfo {
        driver: "jail".into(),
        format: 1,
        dir: PathBuf::from("/abs"),
        size_bytes: 0,
        memory: true,
    };
    assert!(matches!(
        v1::CheckpointInfo::try_from(&info),
        Err(ConvertError::BadPath {
            field: "CheckpointInfo.dir",
            ..
        })
    ));
}

#[test]
fn the_data_dir_resolves_and_confines() {
    let root = tempfile::tempdir().unwrap();
    let data = DataDir::new(root.path());
    std::fs::create_dir_all(root.path().join("checkpoints/a")).unwrap();

    let wire = data.relative(&root.path().join("checkpoints/a")).unwrap();
    assert_eq!(wire, Path::new("checkpoints/a"));
    assert_eq!(
        data.resolve(&wire).unwrap(),
        root.path().join("checkpoints/a")
    );
    // Components that do not exist yet (an export's destination) resolve too.
    assert_eq!(
        data.resolve(Path::new("checkpoints/a/new/dest")).unwrap(),
        root.path().join("checkpoints/a/new/dest")
    );

    assert!(matches!(
        data.relative(Path::new("/etc/passwd")),
        Err(PathError::Outside { .. })
    ));
    assert!(matches!(
        data.resolve(Path::new("../etc")),
        Err(PathError::NotPlain(_))
    ));
    assert!(matches!(
        data.resolve(Path::new("/etc")),
        Err(PathError::Absolute(_))
    ));

    // A link a sandbox left in its checkpoint does not lead out.
    std::os::unix::fs::symlink("/etc", root.path().join("checkpoints/a/escape")).unwrap();
    assert!(matches!(
        data.resolve(Path::new("checkpoints/a/escape/passwd")),
        Err(PathError::Symlink(_))
    ));
}
