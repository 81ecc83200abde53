//! The per-sandbox context every handler works with: its id, live policy, fake-IP pool and
//! audit helpers, plus the SYN filter the TUN device consults. A leaf below `stack`, `dns`,
//! `proxy` and `inject`, which all receive it and none of which it calls back.

use std::net::{IpAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, RwLock};

use crate::audit::AuditEvent;
use crate::device::SynFilter;
use crate::fakeip::{FakePool, is_fake};
use crate::policy::{CompiledPolicy, NameCheck, NetworkPolicy, Verdict};
use crate::shared::Shared;

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
        // For `/metrics`: decisions by protocol and verdict (never the host: unbounded).
        metrics::counter!(
            "bulkhead_egress_decisions_total",
            "protocol" => protocol,
            "verdict" => if allowed { "allowed" } else { "denied" }
        )
        .increment(1);
        if bytes_out + bytes_in > 0 {
            metrics::counter!("bulkhead_egress_bytes_total", "direction" => "out")
                .increment(bytes_out);
            metrics::counter!("bulkhead_egress_bytes_total", "direction" => "in")
                .increment(bytes_in);
        }
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
        let (host, rule) = if is_fake(ip) {
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
            let real_ip = (!is_fake(ip)).then_some(ip);
            self.audit("tcp", host, real_ip, dst.port(), false, r.clone(), 0, 0);
        }
        rule
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::audit::AuditSink;
    use crate::config::EgressConfig;
    use crate::secrets::SecretSource;
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
        async fn resolve(&self, _scope: &str, _reference: &str) -> Option<String> {
            None
        }
    }

    /// A sandbox whose proxy resolves `overrides` (and nothing else offline).
    pub(crate) fn test_sandbox_with(
        policy: NetworkPolicy,
        overrides: HashMap<String, Vec<IpAddr>>,
    ) -> (Arc<Sandbox>, mpsc::Receiver<AuditEvent>) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        let cfg = EgressConfig {
            state_dir: dir.path().to_path_buf(),
            resolve_overrides: overrides,
            ..Default::default()
        };
        let shared =
            Shared::new(cfg, Arc::new(NoSecrets), Arc::new(ChanSink(Mutex::new(tx)))).unwrap();
        (
            Arc::new(Sandbox::new("sb-test", Arc::new(shared), policy)),
            rx,
        )
    }

    pub(crate) fn test_sandbox(
        policy: NetworkPolicy,
    ) -> (Arc<Sandbox>, mpsc::Receiver<AuditEvent>) {
        test_sandbox_with(
            policy,
            HashMap::from([
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
