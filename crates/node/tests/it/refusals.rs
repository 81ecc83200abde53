//! What a node refuses before its driver runs anything: a caller without its token, a call for
//! another epoch, a path outside its data directory; and what `RemoteNode` refuses to send.

use std::sync::atomic::Ordering;

use bulkhead_engine::Node;
use bulkhead_engine::driver::{CheckpointOptions, DriverError, SandboxSpec};
use bulkhead_node::wire::ErrorBody;
use bulkhead_node::{PathMap, RemoteNode};
use bulkhead_node_proto::v1;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;
use prost::Message;

use crate::{Harness, TOKEN, chain, post};

fn start_request() -> Vec<u8> {
    v1::StartRequest {
        context: None,
        spec: Some(v1::SandboxSpec {
            template_id: "base".into(),
            rootfs: "templates/base/rootfs".into(),
            cpu_count: 1,
            memory_mb: 128,
            pids_max: 16,
            ..Default::default()
        }),
        warm: false,
    }
    .encode_to_vec()
}

fn detail_code(body: &[u8], status: u16) -> NodeCode {
    ErrorBody::parse(status, body)
        .detail()
        .expect("a NodeError detail")
        .code()
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_401_and_the_driver_is_not_called() {
    let h = Harness::start().await;
    let body = start_request();
    for token in [
        None,
        Some("wrong"),
        Some(""),
        Some(&TOKEN[..TOKEN.len() - 1]),
    ] {
        let (status, head, answer) = post(h.addr, "Start", token, "application/proto", &body).await;
        assert_eq!(status, 401, "{token:?}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json")
        );
        let error = ErrorBody::parse(status, &answer);
        assert_eq!(error.code, bulkhead_envd::Code::Unauthenticated);
        assert!(error.details.is_empty(), "nothing else is revealed");
    }
    // Not even whether a route exists.
    let (status, ..) = post(
        h.addr,
        "NoSuchMethod",
        Some("wrong"),
        "application/json",
        b"{}",
    )
    .await;
    assert_eq!(status, 401);
    let (status, ..) = crate::raw_http(
        h.addr,
        b"GET /bulkhead.node.v1.Node/AgentStream HTTP/1.1\r\nHost: node\r\n\
          Connection: Upgrade, close\r\nUpgrade: bulkhead-agent\r\n\r\n",
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(h.driver.started.load(Ordering::SeqCst), 0);

    // The remote client with a wrong token cannot connect.
    let err = RemoteNode::connect(&h.url, "wrong", PathMap::new())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("unauthenticated"), "{err}");

    // The right token starts one.
    let (status, _, answer) = post(h.addr, "Start", Some(TOKEN), "application/proto", &body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(h.driver.started.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_call_for_another_epoch_is_refused_and_info_tells_the_new_one() {
    let h = Harness::start().await;
    let spec = SandboxSpec {
        template_id: "base".into(),
        rootfs: h.dir.path().join("templates/base/rootfs"),
        cpu_count: 1,
        memory_mb: 128,
        pids_max: 16,
        disk_mb: 0,
        volumes: Vec::new(),
    };
    let handle = h.remote.start(&spec, false).await.unwrap();
    assert_eq!(h.remote.info().epoch, 0);

    // The node registers: epoch 7. The client still speaks for epoch 0.
    h.server.set_epoch(7);
    let started = h.driver.started.load(Ordering::SeqCst);
    let err = h.remote.start(&spec, false).await.unwrap_err();
    assert!(matches!(err, DriverError::Io { .. }), "{err:?}");
    assert!(
        chain(&err).iter().any(|m| m.contains("epoch 7")),
        "{:?}",
        chain(&err)
    );
    assert_eq!(
        h.driver.started.load(Ordering::SeqCst),
        started,
        "nothing ran"
    );
    // The refusal made the client read Info again: it speaks for epoch 7 now.
    assert_eq!(h.remote.info().epoch, 7);
    h.remote.usage(&handle).await.unwrap();

    // Over the wire: aborted (409) with CODE_STALE_EPOCH.
    let stale = v1::UsageRequest {
        context: Some(v1::CallContext {
            node_epoch: 6,
            generation: 0,
        }),
        handle: Some((&handle).into()),
    };
    let (status, _, body) = post(
        h.addr,
        "Usage",
        Some(TOKEN),
        "application/proto",
        &stale.encode_to_vec(),
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(detail_code(&body, status), NodeCode::StaleEpoch);
    // Info answers whatever the epoch.
    let (status, _, body) = post(h.addr, "Info", Some(TOKEN), "application/json", b"{}").await;
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["epoch"], "7");
}

#[tokio::test]
async fn a_path_leaving_the_data_directory_is_refused() {
    let h = Harness::start().await;
    let spec = SandboxSpec {
        template_id: "base".into(),
        rootfs: h.dir.path().join("templates/base/rootfs"),
        cpu_count: 1,
        memory_mb: 128,
        pids_max: 16,
        disk_mb: 0,
        volumes: Vec::new(),
    };
    let handle = h.remote.start(&spec, false).await.unwrap();
    // A link under the data directory to outside it.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), h.dir.path().join("escape")).unwrap();

    for dir in ["../outside", "/etc", "checkpoints/../../x", "escape/cp", ""] {
        let req = v1::CheckpointRequest {
            context: None,
            handle: Some((&handle).into()),
            dir: dir.into(),
            options: None,
        };
        let (status, _, body) = post(
            h.addr,
            "Checkpoint",
            Some(TOKEN),
            "application/proto",
            &req.encode_to_vec(),
        )
        .await;
        assert_eq!(status, 400, "{dir:?}: {}", String::from_utf8_lossy(&body));
        assert_eq!(
            detail_code(&body, status),
            NodeCode::InvalidArgument,
            "{dir:?}"
        );
    }
    assert_eq!(h.driver.checkpoints.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);

    // The client sends no path under no root of its map, nor one that climbs out of a root.
    for dir in [
        outside.path().join("cp"),
        h.dir.path().join("checkpoints/../../cp"),
    ] {
        let err = h
            .remote
            .checkpoint(&handle, &dir, CheckpointOptions::default())
            .await
            .unwrap_err();
        assert!(
            chain(&err).iter().any(|m| m.contains("path")),
            "{:?}",
            chain(&err)
        );
    }
    assert_eq!(h.driver.checkpoints.load(Ordering::SeqCst), 0);

    // A path under a root goes, and its checkpoint comes back under the same local path.
    let dir = h.checkpoints().join("sandboxes/sb/1");
    let info = h
        .remote
        .checkpoint(&handle, &dir, CheckpointOptions::default())
        .await
        .unwrap();
    assert_eq!(info.dir, dir);
    assert_eq!(h.remote.checkpoint_info(&dir).await, Some(info.clone()));
    // The node marked it complete on its disk.
    assert!(dir.join("bulkhead-checkpoint.json").is_file());

    // Copied on the node (a snapshot of a paused sandbox), complete under its own path.
    let copy = h.checkpoints().join("snapshots/s1");
    let copied = h.remote.copy_checkpoint(&dir, &copy).await.unwrap();
    assert_eq!(copied.dir, copy);
    assert!(h.remote.checkpoint_info(&copy).await.is_some());

    // Deleting or copying into anything but the checkpoints tree is refused.
    std::fs::create_dir_all(h.dir.path().join("templates/keep")).unwrap();
    for dir in [
        "templates",
        "templates/keep",
        "checkpoints",
        "images/x",
        "../x",
        "escape",
    ] {
        let req = v1::RemoveCheckpointRequest {
            context: None,
            dir: dir.into(),
        };
        let (status, _, body) = post(
            h.addr,
            "RemoveCheckpoint",
            Some(TOKEN),
            "application/proto",
            &req.encode_to_vec(),
        )
        .await;
        assert_eq!(status, 400, "{dir:?}: {}", String::from_utf8_lossy(&body));
        assert_eq!(detail_code(&body, status), NodeCode::InvalidArgument);
        let req = v1::CopyCheckpointRequest {
            context: None,
            from: "checkpoints/sandboxes/sb/1".into(),
            to: dir.into(),
        };
        let (status, ..) = post(
            h.addr,
            "CopyCheckpoint",
            Some(TOKEN),
            "application/proto",
            &req.encode_to_vec(),
        )
        .await;
        assert_eq!(status, 400, "{dir:?}");
    }
    assert!(h.dir.path().join("templates/keep").is_dir());

    // A sandbox's checkpoints go with its root directory.
    h.remote
        .remove_checkpoint(&h.checkpoints().join("sandboxes/sb"))
        .await;
    assert!(!dir.exists());
    assert_eq!(h.remote.checkpoint_info(&dir).await, None);
    assert!(h.remote.checkpoint_info(&copy).await.is_some());
}

#[test]
fn the_path_map_swaps_the_longest_root() {
    let map = PathMap::new()
        .with("/data", "")
        .unwrap()
        .with("/data/checkpoints", "cp")
        .unwrap();
    let wire = map
        .to_wire(std::path::Path::new("/data/checkpoints/a/b"))
        .unwrap();
    assert_eq!(wire, std::path::Path::new("cp/a/b"));
    assert_eq!(
        map.to_local(&wire).unwrap(),
        std::path::Path::new("/data/checkpoints/a/b")
    );
    assert_eq!(
        map.to_wire(std::path::Path::new("/data/templates/x"))
            .unwrap(),
        std::path::Path::new("templates/x")
    );
    assert!(map.to_wire(std::path::Path::new("/etc/passwd")).is_err());
    assert!(map.to_wire(std::path::Path::new("/data")).is_err(), "empty");
    assert!(PathMap::new().with("relative", "x").is_err());
    assert!(PathMap::new().with("/a", "../x").is_err());
}
