//! The egress proxy a server starts (its CA lives in `<data>/egress`), with store-backed
//! secrets and audit trail, and the trust bundle and variables sandboxes get.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bulkhead_egress::{Egress, EgressConfig};
use bulkhead_engine::network::{StoreAuditSink, StoreSecrets};
use bulkhead_store::Store;

use crate::config::{ConfigError, NetworkConfig, NetworkDefault, parse_overrides};

/// Why the egress proxy could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetworkSetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the CA bundle {}", path.display())]
    ReadBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} holds no PEM certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("{} contains a private key: sandboxes must only get public certificates", .0.display())]
    PrivateKey(PathBuf),
    #[error("cannot start the egress proxy")]
    Egress(#[source] bulkhead_egress::EgressError),
}

/// What the server wires into the driver and the engine.
pub(crate) struct Network {
    pub egress: Arc<Egress>,
    pub audit: Arc<StoreAuditSink>,
    /// The proxy's CA certificate plus the operator's bundle (public certificates only).
    pub sandbox_ca_pem: String,
}

fn read_pem_bundle(path: &Path) -> Result<String, NetworkSetupError> {
    let pem = std::fs::read_to_string(path).map_err(|source| NetworkSetupError::ReadBundle {
        path: path.to_path_buf(),
        source,
    })?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(NetworkSetupError::NoCertificate(path.to_path_buf()));
    }
    if pem.contains("PRIVATE KEY") {
        return Err(NetworkSetupError::PrivateKey(path.to_path_buf()));
    }
    Ok(pem)
}

/// The sandbox trust bundle path and the variables that point tools at it (Python ssl /
/// requests / pip, Node, curl).
pub(crate) fn sandbox_ca_env() -> BTreeMap<String, String> {
    let bundle = bulkhead_jail::mountplan::CA_BUNDLE.to_string();
    let mut env: BTreeMap<String, String> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "PIP_CERT",
    ]
    .into_iter()
    .map(|k| (k.to_string(), bundle.clone()))
    .collect();
    // A registry the policy denies fails each attempt at once, but npm waits 10 s then 60 s
    // between its retries and pip backs off 5 times: 70 s and 8 s of apparent hangs. Keep the
    // retries, shorten the waits (a create request's envVars override these).
    for (k, v) in [
        ("npm_config_fetch_retry_mintimeout", "1000"),
        ("npm_config_fetch_retry_maxtimeout", "3000"),
        ("PIP_RETRIES", "2"),
    ] {
        env.insert(k.to_string(), v.to_string());
    }
    env
}

/// Creates the egress proxy.
pub(crate) fn setup(
    cfg: &NetworkConfig,
    data_dir: &Path,
    store: &Store,
) -> Result<Network, NetworkSetupError> {
    let overrides = parse_overrides(&cfg.resolve)?;
    if !overrides.is_empty() {
        tracing::warn!(
            names = ?overrides.keys().collect::<Vec<_>>(),
            "TEST-ONLY egress resolver overrides are active"
        );
    }
    if cfg.allow_private {
        tracing::warn!(
            "--egress-allow-private: sandbox policies may reach loopback, private networks, cloud \
             metadata and this host's own addresses"
        );
        eprintln!(
            "WARNING: --egress-allow-private is set: sandboxes whose policy allows it can reach \
             this host, its private networks and cloud metadata endpoints."
        );
    }
    for p in &cfg.upstream_ca {
        read_pem_bundle(p)?;
    }
    let extra = cfg
        .sandbox_ca_bundle
        .as_deref()
        .map(read_pem_bundle)
        .transpose()?;
    let audit = StoreAuditSink::spawn(store.clone());
    let egress = Egress::new(
        EgressConfig {
            state_dir: data_dir.join("egress"),
            allow_private: cfg.allow_private,
            resolve_overrides: overrides,
            upstream_extra_roots: cfg.upstream_ca.clone(),
        },
        StoreSecrets::new(store.clone()),
        audit.clone(),
    )
    .map_err(NetworkSetupError::Egress)?;
    let mut sandbox_ca_pem = egress.ca_cert_pem();
    if let Some(extra) = extra {
        if !sandbox_ca_pem.ends_with('\n') {
            sandbox_ca_pem.push('\n');
        }
        sandbox_ca_pem.push_str(&extra);
    }
    let default_allow = cfg.default == NetworkDefault::Allow;
    tracing::info!(
        default = if default_allow { "allow" } else { "deny" },
        "sandbox network default"
    );
    Ok(Network {
        egress,
        audit,
        sandbox_ca_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_must_be_public_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.pem");
        std::fs::write(
            &good,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(read_pem_bundle(&good).is_ok());
        let key = dir.path().join("key.pem");
        std::fs::write(
            &key,
            "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\n",
        )
        .unwrap();
        assert!(
            read_pem_bundle(&key)
                .unwrap_err()
                .to_string()
                .contains("private key")
        );
        assert!(read_pem_bundle(&dir.path().join("missing")).is_err());
    }
}
