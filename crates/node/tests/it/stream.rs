//! The data path: `AgentPath::open` through the node is the agent's stream, byte for byte, and
//! ends when the agent ends it.

use bulkhead_engine::AgentPath;
use bulkhead_engine::Node;
use bulkhead_engine::driver::{DriverError, DriverHandle, SandboxSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Harness;

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

/// Writes `request` on a fresh stream from `path` and reads until the agent closes; the
/// answer without its `date` header (the one thing that differs between two answers).
async fn exchange(path: &dyn AgentPath, handle: &DriverHandle, request: &[u8]) -> String {
    let mut stream = path.open(handle).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8(answer)
        .unwrap()
        .split("\r\n")
        .filter(|line| !line.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n")
}

#[tokio::test]
async fn the_agent_stream_carries_the_agents_bytes() {
    let h = Harness::start().await;
    let handle = h.remote.start(&spec(&h), false).await.unwrap();

    let health = b"GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n";
    let remote = exchange(h.remote.as_ref(), &handle, health).await;
    let local = exchange(h.local.as_ref(), &handle, health).await;
    assert_eq!(remote, local);
    assert!(remote.starts_with("HTTP/1.1 204"), "{remote}");

    let body = r#"{"envVars":{"A":"b"},"accessToken":"t"}"#;
    let init = format!(
        "POST /init HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let remote = exchange(h.remote.as_ref(), &handle, init.as_bytes()).await;
    assert!(remote.starts_with("HTTP/1.1 204"), "{remote}");
    // The agent got the body as sent.
    let got = h.driver.inits.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        got,
        serde_json::from_str::<serde_json::Value>(body).unwrap()
    );
    assert_eq!(h.driver.memory(handle.pid).unwrap().env["A"], "b");
}

#[tokio::test]
async fn a_stream_to_a_dead_sandbox_fails_as_in_process() {
    let h = Harness::start().await;
    let handle = h.remote.start(&spec(&h), false).await.unwrap();
    h.remote.stop(&handle).await.unwrap();
    let remote = h.remote.open(&handle).await.err().unwrap();
    let local = h.local.open(&handle).await.err().unwrap();
    assert!(matches!(remote, DriverError::NotRunning), "{remote:?}");
    assert_eq!(crate::chain(&remote), crate::chain(&local));
}
