//! The node protocol over real TCP on 127.0.0.1, one binary, no root: a [`NodeServer`] over a
//! `LocalNode` and the fake driver, and a [`RemoteNode`] talking to it.
//!
//! - [`engine`]: an engine over the remote node gives the same results as one over its node in
//!   process (create, agent traffic, pause and resume, kill);
//! - [`seam`]: every other method of the `Node` trait answers as in process; `wait` polls;
//! - [`stream`]: the data path carries the agent's HTTP byte for byte;
//! - [`errors`]: every driver error the fake can be made to produce reaches the engine as in
//!   process; the engine's network and agent errors round-trip their detail exactly;
//! - [`refusals`]: a wrong or missing token (the driver is never called), a stale epoch, a
//!   path that leaves the data directory, a path under no root of the path map;
//! - [`json`]: a plain HTTP client calls `Info` in proto3 JSON, as curl would.

mod engine;
mod errors;
mod json;
mod refusals;
mod seam;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bulkhead_engine::LocalNode;
use bulkhead_engine::network::EgressControl;
use bulkhead_engine::testing::FakeDriver;
use bulkhead_node::{NodeServer, PathMap, RemoteNode, ServerConfig};

pub const TOKEN: &str = "node-secret-token";

/// A node serving on 127.0.0.1 and a remote node connected to it.
pub struct Harness {
    /// The node's data directory (and the engine's: checkpoints and templates live under it).
    pub dir: tempfile::TempDir,
    pub driver: Arc<FakeDriver>,
    pub local: Arc<LocalNode>,
    pub server: NodeServer,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub remote: Arc<RemoteNode>,
}

impl Harness {
    pub async fn start() -> Harness {
        Harness::start_with(None).await
    }

    /// A node whose `LocalNode` has `egress` as its egress proxy.
    pub async fn start_with_egress(egress: Arc<dyn EgressControl>) -> Harness {
        Harness::start_with(Some(egress)).await
    }

    async fn start_with(egress: Option<Arc<dyn EgressControl>>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let driver = Arc::new(FakeDriver::default());
        let local = LocalNode::new(driver.clone());
        if let Some(egress) = egress {
            local.set_egress(egress, None);
        }
        let server = NodeServer::new(
            local.clone(),
            local.clone(),
            ServerConfig::new("node-1", TOKEN, dir.path()),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = server.router();
        tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        let url = format!("http://{addr}");
        let remote = RemoteNode::connect(&url, TOKEN, path_map(dir.path()))
            .await
            .expect("the remote node connects");
        Harness {
            dir,
            driver,
            local,
            server,
            url,
            addr,
            remote: Arc::new(remote),
        }
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("checkpoints")
    }
}

/// The engine's directories under `root` and their wire prefixes: the node's data directory is
/// `root` too, so both see the same files.
pub fn path_map(root: &Path) -> PathMap {
    PathMap::new()
        .with(root.join("checkpoints"), "checkpoints")
        .unwrap()
        .with(root.join("templates"), "templates")
        .unwrap()
}

/// The `base` template with its rootfs under `root` (a path the map can send).
pub fn template(root: &Path) -> bulkhead_engine::TemplateInfo {
    bulkhead_engine::TemplateInfo {
        rootfs: root.join("templates/base/rootfs"),
        ..bulkhead_engine::testing::base_template()
    }
}

/// The messages of an error and its causes.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    bulkhead_node_proto::convert::error::messages(e)
}

/// Sends `request` (a whole HTTP/1.1 request, `Connection: close`) on a fresh TCP connection,
/// as curl would, and reads the answer until the server closes: (status, head, body).
pub async fn raw_http(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8(answer[..split].to_vec()).unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head, answer[split + 4..].to_vec())
}

/// A `POST` of `body` to `method` with `content_type` and `token` (none: no header).
pub async fn post(
    addr: std::net::SocketAddr,
    method: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let mut request = format!(
        "POST /bulkhead.node.v1.Node/{method} HTTP/1.1\r\nHost: node\r\n{auth}\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    raw_http(addr, &request).await
}
