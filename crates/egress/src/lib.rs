//! Host-side egress for sandboxes: a TUN link inside the sandbox's network namespace whose only
//! peer is a userspace TCP/IP stack ([`ipstack`]) in this process, a fake-IP DNS responder, and a
//! transparent proxy that decides per connection (domain from DNS/SNI/Host, IPs, CIDRs, a fixed
//! deny set), injects headers with secrets for configured domains (TLS terminated with a
//! per-deployment CA), and records one [`AuditEvent`] per decision.
//!
//! Packets from the sandbox never reach the host kernel's routing or netfilter: the proxy is the
//! only reachable peer by construction.
//!
//! Runtime requirement: `attach` must run inside a **multi-threaded** tokio runtime (ipstack's
//! TCP streams use `block_in_place` when dropped).

pub mod bench;
mod ca;
mod denyset;
mod device;
mod dns;
mod inject;
pub mod netlab;
mod netns;
mod policy;
mod proxy;
mod secrets;
mod sniff;
mod stack;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use denyset::{DenySet, host_addresses};
pub use netns::open_tun_in_netns;
pub use policy::{HeaderRule, NetworkPolicy, PolicyError, Verdict, normalize_name};
pub use secrets::{SecretRefError, SecretSource};

/// The sandbox's address on its `eth0` TUN link.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The link's peer: our userspace stack; DNS server for the sandbox (`nameserver 10.200.0.1`).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const PREFIX_LEN: u8 = 24;
pub const MTU: u16 = 1500;
/// DNS answers for allowed names come from this pool (198.18.0.0/15, per-sandbox mapping).
pub const FAKE_IP_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
pub const FAKE_IP_PREFIX_LEN: u8 = 15;
/// TTL of fake-IP answers: short, so policy changes are picked up by resolvers quickly.
pub const DNS_TTL_SECS: u32 = 5;
/// Upper bound on connecting to an upstream.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Default)]
pub struct EgressConfig {
    /// Where the CA lives (`ca.pem` 0644, `ca.key` 0600); created on first start.
    pub state_dir: PathBuf,
    /// Operator opt-in: let policies reach the fixed deny set (private ranges, loopback, host).
    pub allow_private: bool,
    /// Name → addresses used instead of real resolution (TEST-ONLY: local test upstreams).
    pub resolve_overrides: HashMap<String, Vec<IpAddr>>,
    /// Extra PEM CA bundles trusted for upstream TLS on injection domains (besides the host store).
    pub upstream_extra_roots: Vec<PathBuf>,
}

/// One egress decision. `bytes_out` = sandbox → upstream, `bytes_in` = upstream → sandbox.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AuditEvent {
    pub sandbox_id: String,
    pub at: DateTime<Utc>,
    /// `tcp` | `tls` | `http` | `dns`
    pub protocol: &'static str,
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub allowed: bool,
    pub rule: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// Receives audit events; `record` is called on the proxy's hot path and must not block.
pub trait AuditSink: Send + Sync {
    fn record(&self, event: AuditEvent);
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress CA at {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("upstream trust roots: {0}")]
    Roots(String),
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error(
        "attach must be called from inside a tokio runtime (multi-threaded): the userspace stack runs on it"
    )]
    NoRuntime,
    #[error("sandbox {0} is already attached to the egress proxy; detach it first")]
    AlreadyAttached(String),
    #[error("sandbox {0} is not attached to the egress proxy")]
    NotAttached(String),
    #[error("invalid network policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("network namespace {path}: {message}")]
    Netns { path: PathBuf, message: String },
    #[error(
        "creating the sandbox's eth0 TUN link: {0} (needs root/CAP_NET_ADMIN and /dev/net/tun)"
    )]
    Tun(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// State shared by every attached sandbox.
pub(crate) struct Shared {
    pub allow_private: bool,
    pub overrides: HashMap<String, Vec<IpAddr>>,
    pub secrets: Arc<dyn SecretSource>,
    pub audit: Arc<dyn AuditSink>,
    pub ca: ca::Ca,
    pub upstream_tls: Arc<rustls::ClientConfig>,
    pub deny: denyset::DenyCache,
}

struct Attached {
    sandbox: Arc<stack::Sandbox>,
    cancel: CancellationToken,
}

pub struct Egress {
    shared: Arc<Shared>,
    attached: Mutex<HashMap<String, Attached>>,
}

impl Egress {
    /// Loads (or creates once) the CA in `state_dir` and the upstream trust store.
    pub fn new(
        cfg: EgressConfig,
        secrets: Arc<dyn SecretSource>,
        audit: Arc<dyn AuditSink>,
    ) -> Result<Arc<Self>, EgressError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let ca = ca::Ca::load_or_create(&cfg.state_dir, provider.clone())?;
        let upstream_tls = Arc::new(ca::upstream_client_config(
            provider,
            &cfg.upstream_extra_roots,
        )?);
        let overrides = cfg
            .resolve_overrides
            .iter()
            .map(|(k, v)| (normalize_name(k), v.clone()))
            .collect();
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                allow_private: cfg.allow_private,
                overrides,
                secrets,
                audit,
                ca,
                upstream_tls,
                deny: denyset::DenyCache::new(Duration::from_secs(5)),
            }),
            attached: Mutex::new(HashMap::new()),
        }))
    }

    /// The per-deployment CA certificate (PEM) to install in sandbox trust stores.
    pub fn ca_cert_pem(&self) -> String {
        self.shared.ca.cert_pem().to_string()
    }

    /// Starts the userspace stack for `sandbox_id` over `tun` (from [`open_tun_in_netns`]) on the
    /// current tokio runtime.
    pub fn attach(
        &self,
        sandbox_id: &str,
        tun: OwnedFd,
        policy: NetworkPolicy,
    ) -> Result<(), EgressError> {
        policy.validate()?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| EgressError::NoRuntime)?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(EgressError::NoRuntime);
        }
        let mut attached = self.attached.lock().expect("egress lock");
        if attached.contains_key(sandbox_id) {
            return Err(EgressError::AlreadyAttached(sandbox_id.to_string()));
        }
        let sandbox = Arc::new(stack::Sandbox::new(sandbox_id, self.shared.clone(), policy));
        let cancel = CancellationToken::new();
        let _guard = handle.enter();
        stack::spawn(sandbox.clone(), tun, cancel.clone())?;
        attached.insert(sandbox_id.to_string(), Attached { sandbox, cancel });
        Ok(())
    }

    /// Replaces the policy; new connections and DNS answers use it at once.
    pub fn set_policy(&self, sandbox_id: &str, policy: NetworkPolicy) -> Result<(), EgressError> {
        policy.validate()?;
        let attached = self.attached.lock().expect("egress lock");
        let a = attached
            .get(sandbox_id)
            .ok_or_else(|| EgressError::NotAttached(sandbox_id.to_string()))?;
        a.sandbox.set_policy(policy);
        Ok(())
    }

    /// The policy currently enforced for `sandbox_id`, if attached.
    pub fn policy(&self, sandbox_id: &str) -> Option<NetworkPolicy> {
        let attached = self.attached.lock().expect("egress lock");
        attached
            .get(sandbox_id)
            .map(|a| a.sandbox.policy().source.clone())
    }

    /// Stops the stack and closes all of the sandbox's connections (and the TUN fd).
    pub fn detach(&self, sandbox_id: &str) {
        let removed = self
            .attached
            .lock()
            .expect("egress lock")
            .remove(sandbox_id);
        if let Some(a) = removed {
            a.cancel.cancel();
        }
    }

    /// Ids of attached sandboxes.
    pub fn attached(&self) -> Vec<String> {
        self.attached
            .lock()
            .expect("egress lock")
            .keys()
            .cloned()
            .collect()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        if let Ok(attached) = self.attached.get_mut() {
            for (_, a) in attached.drain() {
                a.cancel.cancel();
            }
        }
    }
}
