//! One attached sandbox: its policy, fake-IP pool, and the task set that runs the userspace
//! stack over its TUN fd (TCP → proxy, UDP to GATEWAY:53 → DNS, everything else dropped).

use std::net::{IpAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ipstack::{IpStack, IpStackConfig, IpStackStream, IpStackUdpStream, TcpConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::device::{SynFilter, TunDevice};
use crate::dns::{self, FakePool};
use crate::policy::{CompiledPolicy, NameCheck, Verdict};
use crate::{AuditEvent, MTU, NetworkPolicy, Shared, proxy};

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

impl Shared {
    /// The proxy's own resolution (override map first). Empty = unresolvable.
    pub(crate) async fn resolve(&self, name: &str) -> Vec<IpAddr> {
        if let Some(v) = self.overrides.get(name) {
            return v.clone();
        }
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((name, 0))).await {
            Ok(Ok(it)) => {
                let mut out: Vec<IpAddr> = Vec::new();
                for sa in it {
                    if !out.contains(&sa.ip()) {
                        out.push(sa.ip());
                    }
                }
                out
            }
            _ => Vec::new(),
        }
    }
}

pub(crate) struct Sandbox {
    pub id: String,
    pub shared: Arc<Shared>,
    policy: RwLock<Arc<CompiledPolicy>>,
    pub fakes: Mutex<FakePool>,
}

impl Sandbox {
    pub fn new(id: &str, shared: Arc<Shared>, policy: NetworkPolicy) -> Self {
        Self {
            id: id.to_string(),
            shared,
            policy: RwLock::new(Arc::new(CompiledPolicy::new(policy))),
            fakes: Mutex::new(FakePool::default()),
        }
    }

    pub fn policy(&self) -> Arc<CompiledPolicy> {
        self.policy.read().expect("policy lock").clone()
    }

    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.policy.write().expect("policy lock") = Arc::new(CompiledPolicy::new(policy));
    }

    #[allow(clippy::too_many_arguments)]
    pub fn audit(
        &self,
        protocol: &'static str,
        host: Option<String>,
        ip: Option<IpAddr>,
        port: u16,
        allowed: bool,
        rule: String,
        bytes_out: u64,
        bytes_in: u64,
    ) {
        self.shared.audit.record(AuditEvent {
            sandbox_id: self.id.clone(),
            at: chrono::Utc::now(),
            protocol,
            host,
            ip,
            port,
            allowed,
            rule,
            bytes_out,
            bytes_in,
        });
    }

    pub fn audit_dns(&self, name: &str, v: &Verdict, ip: Option<IpAddr>) {
        self.audit(
            "dns",
            Some(name.to_string()),
            ip,
            53,
            v.allowed,
            v.rule.clone(),
            0,
            0,
        );
    }
}

impl SynFilter for Sandbox {
    fn check_syn(&self, dst: SocketAddrV4) -> Option<String> {
        let ip = IpAddr::V4(*dst.ip());
        let policy = self.policy();
        let (host, rule) = if dns::is_fake(ip) {
            match self.fakes.lock().expect("fake pool").lookup(*dst.ip()) {
                None => (None, Some("unknown-fake-ip".to_string())),
                Some(name) => match policy.check_name(&name) {
                    NameCheck::Denied(r) => (Some(name), Some(r)),
                    _ => (Some(name), None),
                },
            }
        } else {
            let v = policy.check_ip(ip, &self.shared.deny.get(), self.shared.allow_private);
            (None, (!v.allowed).then_some(v.rule))
        };
        if let Some(r) = &rule {
            let real_ip = (!dns::is_fake(ip)).then_some(ip);
            self.audit("tcp", host, real_ip, dst.port(), false, r.clone(), 0, 0);
        }
        rule
    }
}

/// Starts the stack on the current runtime; everything stops when `cancel` fires.
pub(crate) fn spawn(
    sb: Arc<Sandbox>,
    fd: OwnedFd,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let dev = TunDevice::new(fd, sb.clone())?;
    let mut cfg = IpStackConfig::default();
    cfg.mtu(MTU).map_err(std::io::Error::other)?;
    cfg.udp_timeout(Duration::from_secs(10));
    let mut tcp = TcpConfig::default();
    // Idle connections (HTTP keep-alive pools) are kept for a while before being reset.
    tcp.timeout = Duration::from_secs(300);
    // Our side of TIME_WAIT only delays the audit event of server-closed connections.
    tcp.two_msl = Duration::from_secs(1);
    cfg.with_tcp_config(tcp);
    let mut stack = IpStack::new(cfg, dev);
    let tracker = TaskTracker::new();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                s = stack.accept() => s,
            };
            match next {
                Ok(IpStackStream::Tcp(tcp)) => {
                    let (sb, c) = (sb.clone(), cancel.clone());
                    tracker.spawn(async move {
                        tokio::select! {
                            _ = c.cancelled() => {}
                            _ = proxy::handle_tcp(sb, tcp, c.clone()) => {}
                        }
                    });
                }
                Ok(IpStackStream::Udp(udp)) => {
                    let (sb, c) = (sb.clone(), cancel.clone());
                    tracker.spawn(async move {
                        tokio::select! {
                            _ = c.cancelled() => {}
                            _ = serve_dns(sb, udp) => {}
                        }
                    });
                }
                // The device filter already dropped other traffic; anything else is ignored.
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %sb.id, error = %e, "egress stack stopped");
                    break;
                }
            }
        }
        tracker.close();
        // Dropping the stack aborts its device loop, which closes the TUN fd.
        drop(stack);
        tracker.wait().await;
        tracing::debug!(sandbox = %sb.id, "egress stack detached");
    });
    Ok(())
}

async fn serve_dns(sb: Arc<Sandbox>, mut udp: IpStackUdpStream) {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = match udp.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(resp) = dns::answer(&sb, &buf[..n]).await
            && udp.write_all(&resp).await.is_err()
        {
            break;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{AuditSink, Egress, EgressConfig, SecretSource};
    use std::collections::HashMap;
    use std::sync::mpsc;

    pub(crate) struct ChanSink(pub Mutex<mpsc::Sender<AuditEvent>>);
    impl AuditSink for ChanSink {
        fn record(&self, event: AuditEvent) {
            let _ = self.0.lock().unwrap().send(event);
        }
    }
    pub(crate) struct NoSecrets;
    #[async_trait::async_trait]
    impl SecretSource for NoSecrets {
        async fn resolve(&self, _reference: &str) -> Option<String> {
            None
        }
    }

    pub(crate) fn test_sandbox(
        policy: NetworkPolicy,
    ) -> (Arc<Sandbox>, mpsc::Receiver<AuditEvent>) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let cfg = EgressConfig {
            state_dir: dir.path().to_path_buf(),
            resolve_overrides: HashMap::from([
                (
                    "api.allowed.test".to_string(),
                    vec!["203.0.113.10".parse().unwrap()],
                ),
                (
                    "x.wild.test".to_string(),
                    vec!["203.0.113.11".parse().unwrap()],
                ),
                (
                    "loop.allowed.test".to_string(),
                    vec!["127.0.0.1".parse().unwrap()],
                ),
            ]),
            ..Default::default()
        };
        let eg = Egress::new(cfg, Arc::new(NoSecrets), Arc::new(ChanSink(Mutex::new(tx)))).unwrap();
        (
            Arc::new(Sandbox::new("sb-test", eg.shared.clone(), policy)),
            rx,
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn syn_filter_decisions() {
        let policy = NetworkPolicy {
            allow_out: vec![
                "api.allowed.test".into(),
                "203.0.113.50".into(),
                "127.0.0.1".into(),
            ],
            ..Default::default()
        };
        let (sb, audit) = test_sandbox(policy);
        let sa = |s: &str| s.parse::<SocketAddrV4>().unwrap();
        assert_eq!(sb.check_syn(sa("203.0.113.50:443")), None);
        assert_eq!(
            sb.check_syn(sa("203.0.113.51:443")).as_deref(),
            Some("default-deny")
        );
        // Loopback listed in allowOut is still refused (fixed deny set).
        assert_eq!(
            sb.check_syn(sa("127.0.0.1:80")).as_deref(),
            Some("fixed-deny:loopback")
        );
        assert!(
            sb.check_syn(sa("10.200.0.1:80"))
                .unwrap()
                .starts_with("fixed-deny")
        );
        assert_eq!(
            sb.check_syn(sa("198.18.9.9:80")).as_deref(),
            Some("unknown-fake-ip")
        );
        let fake = sb.fakes.lock().unwrap().assign("api.allowed.test");
        assert_eq!(sb.check_syn(SocketAddrV4::new(fake, 80)), None);
        sb.set_policy(NetworkPolicy::default());
        assert_eq!(
            sb.check_syn(SocketAddrV4::new(fake, 80)).as_deref(),
            Some("default-deny")
        );
        let denied: Vec<_> = audit
            .try_iter()
            .filter(|e| !e.allowed && e.protocol == "tcp")
            .collect();
        assert_eq!(denied.len(), 5, "{denied:?}");
    }
}
