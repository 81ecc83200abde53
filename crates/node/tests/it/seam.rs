//! Every method of the `Node` trait through the remote node answers what the node in process
//! answers (the ones the engine scenario does not reach), and `wait` is a long poll.

use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::Node;
use bulkhead_engine::driver::{ChangeSource, CheckpointOptions, SandboxSpec};
use bulkhead_engine::testing::RecordingEgress;
use bulkhead_node::{RemoteConfig, RemoteNode};

use crate::{Harness, TOKEN, path_map};

fn spec(h: &Harness) -> SandboxSpec {
    SandboxSpec {
        template_id: "base".into(),
        rootfs: h.dir.path().join("templates/base/rootfs"),
        cpu_count: 1,
        memory_mb: 128,
        pids_max: 16,
        disk_mb: 0,
        volumes: Vec::new(),
    }
}

#[tokio::test]
async fn every_method_answers_as_in_process() {
    let egress = Arc::new(RecordingEgress::default());
    let h = Harness::start_with_egress(egress.clone()).await;
    let (remote, local) = (&h.remote, &h.local);
    let warm = remote.start(&spec(&h), true).await.unwrap();
    assert!(h.driver.in_background(warm.pid));
    remote.claimed(&warm).await.unwrap();
    assert!(!h.driver.in_background(warm.pid));
    assert!(remote.adopt(&warm).await);
    assert!(remote.reachable(&warm).await);
    remote.thaw(&warm).await.unwrap();
    assert_eq!(
        remote.usage(&warm).await.unwrap(),
        local.usage(&warm).await.unwrap()
    );
    let info = remote
        .init_agent(&warm, &Default::default(), Some("tok"))
        .await
        .unwrap();
    assert_eq!(info, local.agent_info(&warm).await.unwrap());
    assert_eq!(info, remote.agent_info(&warm).await.unwrap());

    // Changes, of a running sandbox and of a checkpoint, and their export.
    h.driver.write_file(warm.pid, "/home/user/a.txt", "a");
    let running = ChangeSource::Running(warm.clone());
    assert_eq!(
        remote.changes(&running, None).await.unwrap(),
        local.changes(&running, None).await.unwrap()
    );
    let dir = h.checkpoints().join("snapshots/s1");
    let opts = CheckpointOptions {
        leave_running: true,
        filesystem_only: false,
    };
    remote.checkpoint(&warm, &dir, opts).await.unwrap();
    h.driver.write_file(warm.pid, "/home/user/b.txt", "b");
    let of = ChangeSource::Checkpoint(dir.clone());
    assert_eq!(
        remote.changes(&of, None).await.unwrap(),
        local.changes(&of, None).await.unwrap()
    );
    assert_eq!(
        remote.changes(&running, Some(&dir)).await.unwrap(),
        local.changes(&running, Some(&dir)).await.unwrap()
    );
    let dest = h.dir.path().join("templates/t1/tree");
    remote.export_changes(&warm, &dest).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dest.join("home/user/b.txt")).unwrap(),
        "b"
    );

    // The network, through the node's egress proxy.
    let cold = remote.start(&spec(&h), false).await.unwrap();
    let policy = bulkhead_egress::NetworkPolicy::default();
    remote
        .attach_network("sb1", &cold, policy.clone())
        .await
        .unwrap();
    remote.set_network_policy("sb1", policy).await.unwrap();
    remote.detach_network("sb1").await;
    remote.flush_audit().await;
    assert_eq!(
        *egress.calls.lock().unwrap(),
        vec!["attach sb1", "set sb1", "detach sb1"]
    );

    // Orphans: everything not kept.
    let kept = remote.start(&spec(&h), false).await.unwrap();
    assert_eq!(
        remote
            .reclaim_orphans(std::slice::from_ref(&kept))
            .await
            .unwrap(),
        1
    );
    assert!(remote.reachable(&kept).await);
    assert!(!remote.reachable(&cold).await);
}

#[tokio::test]
async fn wait_polls_until_the_sandbox_is_gone() {
    let h = Harness::start().await;
    let cfg = RemoteConfig {
        wait_poll: Duration::from_millis(50),
        ..Default::default()
    };
    let remote = Arc::new(
        RemoteNode::connect_with(&h.url, TOKEN, path_map(h.dir.path()), cfg)
            .await
            .unwrap(),
    );
    let handle = remote.start(&spec(&h), false).await.unwrap();
    let waiting = {
        let (remote, handle) = (remote.clone(), handle.clone());
        tokio::spawn(async move { remote.wait(&handle).await })
    };
    // Several polls come back "still running".
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    h.local.stop(&handle).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("wait returns once the sandbox is gone")
        .unwrap();
}
