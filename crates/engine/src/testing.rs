//! Test doubles for code built on the engine (enabled with the `testing` feature): a driver
//! whose "sandboxes" are in-memory HTTP agents answering `/init`, so engine and API logic is
//! tested without root.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::driver::{AgentStream, Driver, DriverError, DriverHandle, ResourceUsage, SandboxSpec};

#[derive(Default)]
pub struct FakeDriver {
    next_pid: AtomicI32,
    pub alive: Mutex<HashSet<i32>>,
    deaths: Mutex<HashMap<i32, Arc<Notify>>>,
    pub inits: Arc<Mutex<Vec<serde_json::Value>>>,
    pub started: AtomicI32,
    pub stopped: AtomicI32,
    /// `open_network` calls (pids), and the peer ends of the fake links handed out.
    pub networks: Mutex<Vec<(i32, std::os::unix::net::UnixDatagram)>>,
}

impl FakeDriver {
    /// Simulate the sandbox dying on its own.
    pub fn crash(&self, pid: i32) {
        self.alive.lock().unwrap().remove(&pid);
        if let Some(n) = self.deaths.lock().unwrap().get(&pid) {
            n.notify_waiters();
            n.notify_one();
        }
    }
}

#[async_trait]
impl Driver for FakeDriver {
    fn name(&self) -> &'static str {
        "fake"
    }
    async fn start(&self, _spec: &SandboxSpec) -> Result<DriverHandle, DriverError> {
        let pid = self.next_pid.fetch_add(1, Ordering::SeqCst) + 100;
        self.alive.lock().unwrap().insert(pid);
        self.deaths
            .lock()
            .unwrap()
            .insert(pid, Arc::new(Notify::new()));
        self.started.fetch_add(1, Ordering::SeqCst);
        Ok(DriverHandle {
            driver: "fake".into(),
            pid,
            pid_start_time: 1,
            slot: pid as u32,
            data: serde_json::Value::Null,
        })
    }
    async fn stop(&self, h: &DriverHandle) -> Result<(), DriverError> {
        self.stopped.fetch_add(1, Ordering::SeqCst);
        self.crash(h.pid);
        Ok(())
    }
    async fn wait(&self, h: &DriverHandle) {
        let n = self.deaths.lock().unwrap().get(&h.pid).cloned();
        if let Some(n) = n {
            if !self.alive.lock().unwrap().contains(&h.pid) {
                return;
            }
            n.notified().await;
        }
    }
    async fn adopt(&self, h: &DriverHandle) -> bool {
        self.alive.lock().unwrap().contains(&h.pid)
    }
    async fn connect(&self, h: &DriverHandle) -> Result<AgentStream, DriverError> {
        if !self.alive.lock().unwrap().contains(&h.pid) {
            return Err(DriverError::NotRunning);
        }
        let (client, server) = tokio::io::duplex(64 * 1024);
        let sink = Arc::clone(&self.inits);
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        use http_body_util::BodyExt;
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        if path == "/init" {
                            sink.lock()
                                .unwrap()
                                .push(serde_json::from_slice::<serde_json::Value>(&body).unwrap());
                        }
                        let status = if path == "/init" { 204 } else { 404 };
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(server), svc)
                .await;
        });
        Ok(Box::new(client))
    }
    async fn open_network(&self, h: &DriverHandle) -> Result<std::os::fd::OwnedFd, DriverError> {
        if !self.alive.lock().unwrap().contains(&h.pid) {
            return Err(DriverError::NotRunning);
        }
        // A datagram pair stands in for the TUN device: packet-shaped, and the test keeps the
        // peer to see whether the engine still holds (or has closed) its end.
        let (ours, peer) = std::os::unix::net::UnixDatagram::pair()
            .map_err(|e| DriverError::io("socketpair", e))?;
        self.networks.lock().unwrap().push((h.pid, peer));
        Ok(ours.into())
    }
    async fn usage(&self, _h: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        Ok(ResourceUsage {
            cpu_usage_ns: 5_000_000,
            mem_used_bytes: 1 << 20,
            ..Default::default()
        })
    }
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let keep: HashSet<i32> = keep.iter().map(|h| h.pid).collect();
        let orphans: Vec<i32> = self
            .alive
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|p| !keep.contains(p))
            .collect();
        for p in &orphans {
            self.crash(*p);
        }
        Ok(orphans.len())
    }
}

/// Records what the engine asks of the egress proxy.
#[derive(Default)]
pub struct RecordingEgress {
    /// sandbox id → current policy (present while attached).
    pub attached: Mutex<BTreeMap<String, bulkhead_egress::NetworkPolicy>>,
    /// Every call, in order: `attach <id>`, `set <id>`, `detach <id>`.
    pub calls: Mutex<Vec<String>>,
    /// The link fds, held like the proxy would (dropped on detach).
    links: Mutex<HashMap<String, std::os::fd::OwnedFd>>,
}

impl crate::network::EgressControl for RecordingEgress {
    fn attach(
        &self,
        sandbox_id: &str,
        tun: std::os::fd::OwnedFd,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), bulkhead_egress::EgressError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("attach {sandbox_id}"));
        self.links.lock().unwrap().insert(sandbox_id.into(), tun);
        self.attached
            .lock()
            .unwrap()
            .insert(sandbox_id.into(), policy);
        Ok(())
    }
    fn set_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), bulkhead_egress::EgressError> {
        self.calls.lock().unwrap().push(format!("set {sandbox_id}"));
        match self.attached.lock().unwrap().get_mut(sandbox_id) {
            Some(p) => {
                *p = policy;
                Ok(())
            }
            None => Err(bulkhead_egress::EgressError::NotAttached(sandbox_id.into())),
        }
    }
    fn detach(&self, sandbox_id: &str) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("detach {sandbox_id}"));
        self.attached.lock().unwrap().remove(sandbox_id);
        self.links.lock().unwrap().remove(sandbox_id);
    }
}

/// A `base` template (alias `debian`) for engine tests; the [`FakeDriver`] never reads its rootfs.
pub fn base_template() -> crate::TemplateInfo {
    crate::TemplateInfo {
        id: "base".into(),
        aliases: vec!["debian".into()],
        rootfs: std::path::PathBuf::from("/nonexistent"),
        content_hash: "h".into(),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        pids_max: 64,
    }
}
