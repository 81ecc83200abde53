//! Sandbox networking as the engine sees it: the E2B-shaped network config stored per sandbox,
//! its translation into the egress proxy's [`NetworkPolicy`], the [`EgressControl`] seam the
//! engine drives (implemented by [`bulkhead_egress::Egress`]; a recorder in tests), and the
//! store-backed [`AuditSink`] and [`SecretSource`] the proxy is given.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bulkhead_egress::{
    AuditEvent, AuditSink, EgressError, HeaderRule, NetworkPolicy, SecretSource,
};
use bulkhead_store::{EgressEventRow, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

/// `SandboxNetworkConfig` as stored and returned (`GET /sandboxes/{id}` → `network`). Fields of
/// E2B's schema that concern inbound traffic (`allowPublicTraffic`, `maskRequestHost`,
/// `httpsPorts`) or that Bulkhead replaces (`dnsServers`: the proxy answers DNS itself) are not
/// kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SandboxNetworkConfig)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNetwork {
    /// Domains (`example.com`, `*.example.com`), IPs and CIDRs the sandbox may reach.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// IPs and CIDRs it may not reach (allowOut wins).
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// Host → header transforms applied by the proxy to HTTPS requests to that host.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rules: BTreeMap<String, Vec<NetworkRule>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SandboxNetworkRule)]
pub struct NetworkRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<NetworkTransform>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = SandboxNetworkTransform)]
pub struct NetworkTransform {
    /// Header name → value; values may hold secret placeholders `${e2b.secrets.<name>}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl SandboxNetwork {
    /// The proxy policy for this config in a sandbox of team `team_id`: its header rules
    /// resolve `${e2b.secrets.NAME}` among that team's secrets only.
    pub fn policy(&self, allow_internet: bool, team_id: &str) -> NetworkPolicy {
        let rules = self
            .rules
            .iter()
            .map(|(host, rules)| {
                let rules = rules
                    .iter()
                    .filter_map(|r| r.transform.as_ref())
                    .map(|t| HeaderRule {
                        headers: t.headers.clone(),
                    })
                    .collect();
                (host.clone(), rules)
            })
            .collect();
        NetworkPolicy {
            allow_internet,
            allow_out: self.allow_out.clone(),
            deny_out: self.deny_out.clone(),
            rules,
            secret_scope: Some(team_id.to_string()),
        }
    }
}

/// Does this policy let anything out? Only then does the sandbox get a link at all; a sandbox
/// without one has nothing but loopback, so every attempt fails at once.
pub fn egress_allowed(policy: &NetworkPolicy) -> bool {
    policy.allow_internet || !policy.allow_out.is_empty()
}

/// What the engine needs from the egress proxy.
pub trait EgressControl: Send + Sync {
    /// Start serving the sandbox's link (`tun`, created inside its network namespace).
    fn attach(
        &self,
        sandbox_id: &str,
        tun: OwnedFd,
        policy: NetworkPolicy,
    ) -> Result<(), EgressError>;
    /// Replace the policy of an attached sandbox; applies to new connections at once.
    fn set_policy(&self, sandbox_id: &str, policy: NetworkPolicy) -> Result<(), EgressError>;
    /// Stop serving the link (closing it removes the device); idempotent.
    fn detach(&self, sandbox_id: &str);
}

impl EgressControl for bulkhead_egress::Egress {
    fn attach(
        &self,
        sandbox_id: &str,
        tun: OwnedFd,
        policy: NetworkPolicy,
    ) -> Result<(), EgressError> {
        bulkhead_egress::Egress::attach(self, sandbox_id, tun, policy)
    }
    fn set_policy(&self, sandbox_id: &str, policy: NetworkPolicy) -> Result<(), EgressError> {
        bulkhead_egress::Egress::set_policy(self, sandbox_id, policy)
    }
    fn detach(&self, sandbox_id: &str) {
        bulkhead_egress::Egress::detach(self, sandbox_id)
    }
}

// ----- audit trail -----

/// Events queued for the store at most; beyond that they are dropped (and counted) rather than
/// ever making the proxy wait on the database.
const AUDIT_QUEUE: usize = 16 * 1024;
/// Largest batch written in one transaction.
const AUDIT_BATCH: usize = 512;
/// How long an event may wait for companions before its batch is written.
const AUDIT_LINGER: Duration = Duration::from_millis(100);

enum AuditMsg {
    Event(EgressEventRow),
    /// Reply once everything queued before this message is stored.
    Flush(oneshot::Sender<()>),
}

/// Batches audit events into the store from a background task; `record` never blocks.
pub struct StoreAuditSink {
    tx: mpsc::Sender<AuditMsg>,
    dropped: AtomicU64,
}

impl StoreAuditSink {
    /// Spawns the writer on the current tokio runtime.
    pub fn spawn(store: Store) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(AUDIT_QUEUE);
        tokio::spawn(audit_writer(store, rx));
        Arc::new(StoreAuditSink {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Wait until every event recorded so far is in the store (for readers of the trail).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(AuditMsg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Events lost because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn push(&self, row: EgressEventRow) {
        if self.tx.try_send(AuditMsg::Event(row)).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "egress audit queue full: events dropped");
            }
        }
    }
}

impl AuditSink for StoreAuditSink {
    fn record(&self, e: AuditEvent) {
        self.push(EgressEventRow {
            sandbox_id: e.sandbox_id,
            at: e.at.timestamp_millis(),
            protocol: e.protocol.to_string(),
            host: e.host,
            ip: e.ip.map(|ip| ip.to_string()),
            port: i64::from(e.port),
            allowed: e.allowed,
            rule: e.rule,
            bytes_out: i64::try_from(e.bytes_out).unwrap_or(i64::MAX),
            bytes_in: i64::try_from(e.bytes_in).unwrap_or(i64::MAX),
        });
    }
}

async fn audit_writer(store: Store, mut rx: mpsc::Receiver<AuditMsg>) {
    let mut batch: Vec<EgressEventRow> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        // Block for the first message, then gather what arrives within the linger window.
        let Some(first) = rx.recv().await else { break };
        let mut next = Some(first);
        let deadline = tokio::time::Instant::now() + AUDIT_LINGER;
        loop {
            match next.take() {
                Some(AuditMsg::Event(e)) => batch.push(e),
                Some(AuditMsg::Flush(w)) => {
                    waiters.push(w);
                    break;
                }
                None => {}
            }
            if batch.len() >= AUDIT_BATCH {
                break;
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(m)) => next = Some(m),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty()
            && let Err(e) = store.insert_egress_events(&batch).await
        {
            tracing::error!(error = %e, events = batch.len(), "storing egress audit events failed");
        }
        batch.clear();
        for w in waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

// ----- secrets -----

/// Resolves `${e2b.secrets.<name>}` placeholders (or bare names) from the store at request
/// time, so a secret updated through the API applies to the next request. The scope is the
/// sandbox's team (set by [`SandboxNetwork::policy`]): another team's secret of that name is
/// never read.
pub struct StoreSecrets {
    store: Store,
}

impl StoreSecrets {
    pub fn new(store: Store) -> Arc<Self> {
        Arc::new(StoreSecrets { store })
    }
}

/// The secret name in a placeholder `${e2b.secrets.NAME}`, or the reference itself.
pub fn secret_name(reference: &str) -> &str {
    reference
        .strip_prefix("${e2b.secrets.")
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or(reference)
}

#[async_trait]
impl SecretSource for StoreSecrets {
    async fn resolve(&self, scope: &str, reference: &str) -> Option<String> {
        match self.store.secret_value(scope, secret_name(reference)).await {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(
                    team = %scope,
                    error = &e as &dyn std::error::Error,
                    "reading a secret for header injection failed"
                );
                None
            }
        }
    }
}

/// E2B's rule for secret names (they are interpolated into `${e2b.secrets.<name>}`).
pub fn validate_secret_name(name: &str) -> Result<(), SecretNameError> {
    if name.is_empty() || name.len() > 256 {
        return Err(SecretNameError::Length);
    }
    if name.chars().any(|c| c == '{' || c == '}' || c.is_control()) {
        return Err(SecretNameError::Characters(name.to_owned()));
    }
    Ok(())
}

/// Why a secret name is refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretNameError {
    #[error("Secret name must be 1 to 256 characters")]
    Length,
    #[error(
        "Secret name {0:?} is not usable: it cannot contain '{{', '}}' or control characters \
         (it is referenced as ${{e2b.secrets.<name>}})"
    )]
    Characters(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shape_round_trips() {
        let json = serde_json::json!({
            "allowOut": ["pypi.org", "*.example.com", "10.1.2.3"],
            "denyOut": ["0.0.0.0/0"],
            "rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.k}"}}}, {}]},
        });
        let n: SandboxNetwork = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(n.allow_out.len(), 3);
        assert_eq!(serde_json::to_value(&n).unwrap(), json);
        let p = n.policy(false, "team-a");
        assert!(!p.allow_internet);
        assert_eq!(p.deny_out, ["0.0.0.0/0"]);
        // A rule without a transform adds no header rule.
        assert_eq!(p.rules["api.example.com"].len(), 1);
        assert_eq!(
            p.rules["api.example.com"][0].headers["Authorization"],
            "Bearer ${e2b.secrets.k}"
        );
        // The rules resolve secrets in the sandbox's team, never server-wide.
        assert_eq!(p.secret_scope.as_deref(), Some("team-a"));
        assert!(egress_allowed(&p));
        assert!(!egress_allowed(
            &SandboxNetwork::default().policy(false, "t")
        ));
        assert!(egress_allowed(&SandboxNetwork::default().policy(true, "t")));
    }

    #[test]
    fn secret_names() {
        assert_eq!(secret_name("${e2b.secrets.openai}"), "openai");
        assert_eq!(secret_name("openai"), "openai");
        assert!(validate_secret_name("openai-key_1.x").is_ok());
        assert!(validate_secret_name("").is_err());
        assert!(validate_secret_name("a}b").is_err());
        assert!(validate_secret_name("a\nb").is_err());
    }
}
