//! State shared by every attached sandbox: the deployment CA, upstream TLS trust, secrets,
//! the audit sink, the fixed deny set, and the proxy's own name resolution.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditSink;
use crate::ca;
use crate::config::EgressConfig;
use crate::denyset::DenyCache;
use crate::error::EgressError;
use crate::policy::normalize_name;
use crate::secrets::SecretSource;

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Shared {
    pub allow_private: bool,
    pub overrides: HashMap<String, Vec<IpAddr>>,
    pub secrets: Arc<dyn SecretSource>,
    pub audit: Arc<dyn AuditSink>,
    pub ca: ca::Ca,
    pub upstream_tls: Arc<rustls::ClientConfig>,
    pub deny: DenyCache,
}

impl Shared {
    /// Loads (or creates once) the CA in `state_dir` and the upstream trust store.
    pub fn new(
        cfg: EgressConfig,
        secrets: Arc<dyn SecretSource>,
        audit: Arc<dyn AuditSink>,
    ) -> Result<Self, EgressError> {
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
        Ok(Self {
            allow_private: cfg.allow_private,
            overrides,
            secrets,
            audit,
            ca,
            upstream_tls,
            deny: DenyCache::new(Duration::from_secs(5)),
        })
    }

    /// The proxy's own resolution (override map first). Empty = unresolvable.
    pub async fn resolve(&self, name: &str) -> Vec<IpAddr> {
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
