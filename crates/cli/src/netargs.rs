//! `bulkhead serve`'s network flags and the egress proxy it starts (kept apart from serve.rs,
//! which other features edit too).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use bulkhead_egress::{Egress, EgressConfig};
use bulkhead_engine::network::{StoreAuditSink, StoreSecrets};
use bulkhead_store::Store;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkDefault {
    Deny,
    Allow,
}

#[derive(clap::Args, Debug, Clone)]
pub struct NetworkArgs {
    /// Internet access of sandboxes whose create request does not set `allow_internet_access`.
    /// `deny`: no network unless the request allows it (allowOut or allow_internet_access).
    #[arg(
        long,
        env = "BULKHEAD_NETWORK_DEFAULT",
        value_enum,
        default_value = "deny"
    )]
    pub network_default: NetworkDefault,
    /// DANGEROUS: let sandbox policies reach loopback, private (RFC 1918, fc00::/7), link-local,
    /// CGNAT, cloud-metadata and this host's own addresses when a policy allows them. Without it
    /// those are always denied, whatever the policy says.
    #[arg(long, env = "BULKHEAD_EGRESS_ALLOW_PRIVATE")]
    pub egress_allow_private: bool,
    /// PEM bundle added to every sandbox's trust store, e.g. /etc/ssl/certs/ca-certificates.crt
    /// on hosts whose outbound TLS is re-signed by an inspecting proxy.
    #[arg(long, env = "BULKHEAD_SANDBOX_CA_BUNDLE", value_name = "PEM")]
    pub sandbox_ca_bundle: Option<PathBuf>,
    /// Extra PEM roots the egress proxy trusts when it connects upstream for header injection
    /// (besides the host's trust store); repeatable.
    #[arg(long, env = "BULKHEAD_EGRESS_UPSTREAM_CA", value_name = "PEM")]
    pub egress_upstream_ca: Vec<PathBuf>,
    /// TEST ONLY: resolve NAME to IP in the egress proxy instead of DNS (points test domains at
    /// local test servers). Never use in production: it bypasses real name resolution.
    #[arg(long, hide = true, value_name = "NAME=IP")]
    pub egress_resolve: Vec<String>,
}

/// What `serve` wires into the driver and the engine.
pub struct Network {
    pub egress: Arc<Egress>,
    pub audit: Arc<StoreAuditSink>,
    /// The proxy's CA certificate plus the operator's bundle (public certificates only).
    pub sandbox_ca_pem: String,
    pub default_allow: bool,
    /// Variables pointing every common TLS stack at the sandbox trust bundle.
    pub sandbox_env: BTreeMap<String, String>,
}

fn parse_overrides(items: &[String]) -> anyhow::Result<HashMap<String, Vec<IpAddr>>> {
    let mut map: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for item in items {
        let (name, ip) = item
            .split_once('=')
            .with_context(|| format!("--egress-resolve {item:?}: expected NAME=IP"))?;
        let ip: IpAddr = ip
            .parse()
            .with_context(|| format!("--egress-resolve {item:?}: {ip:?} is not an IP address"))?;
        map.entry(bulkhead_egress::normalize_name(name))
            .or_default()
            .push(ip);
    }
    Ok(map)
}

fn read_pem_bundle(path: &Path) -> anyhow::Result<String> {
    let pem = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the CA bundle {}", path.display()))?;
    anyhow::ensure!(
        pem.contains("-----BEGIN CERTIFICATE-----"),
        "{} holds no PEM certificate",
        path.display()
    );
    anyhow::ensure!(
        !pem.contains("PRIVATE KEY"),
        "{} contains a private key: sandboxes must only get public certificates",
        path.display()
    );
    Ok(pem)
}

/// The sandbox trust bundle path and the variables that point tools at it (Python ssl /
/// requests / pip, Node, curl).
pub fn sandbox_ca_env() -> BTreeMap<String, String> {
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

/// Create the egress proxy (its CA lives in `<data>/egress`) with store-backed secrets and
/// audit trail.
pub fn setup(args: &NetworkArgs, data_dir: &Path, store: &Store) -> anyhow::Result<Network> {
    let overrides = parse_overrides(&args.egress_resolve)?;
    if !overrides.is_empty() {
        tracing::warn!(
            names = ?overrides.keys().collect::<Vec<_>>(),
            "TEST-ONLY egress resolver overrides are active"
        );
    }
    if args.egress_allow_private {
        tracing::warn!(
            "--egress-allow-private: sandbox policies may reach loopback, private networks, cloud \
             metadata and this host's own addresses"
        );
        eprintln!(
            "WARNING: --egress-allow-private is set: sandboxes whose policy allows it can reach \
             this host, its private networks and cloud metadata endpoints."
        );
    }
    for p in &args.egress_upstream_ca {
        read_pem_bundle(p)?;
    }
    let extra = args
        .sandbox_ca_bundle
        .as_deref()
        .map(read_pem_bundle)
        .transpose()?;
    let audit = StoreAuditSink::spawn(store.clone());
    let egress = Egress::new(
        EgressConfig {
            state_dir: data_dir.join("egress"),
            allow_private: args.egress_allow_private,
            resolve_overrides: overrides,
            upstream_extra_roots: args.egress_upstream_ca.clone(),
        },
        StoreSecrets::new(store.clone()),
        audit.clone(),
    )
    .context("cannot start the egress proxy")?;
    let mut sandbox_ca_pem = egress.ca_cert_pem();
    if let Some(extra) = extra {
        if !sandbox_ca_pem.ends_with('\n') {
            sandbox_ca_pem.push('\n');
        }
        sandbox_ca_pem.push_str(&extra);
    }
    let default_allow = args.network_default == NetworkDefault::Allow;
    tracing::info!(
        default = if default_allow { "allow" } else { "deny" },
        "sandbox network default"
    );
    Ok(Network {
        egress,
        audit,
        sandbox_ca_pem,
        default_allow,
        sandbox_env: sandbox_ca_env(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_overrides_parse() {
        let m = parse_overrides(&[
            "API.Allowed.test=203.0.113.10".into(),
            "api.allowed.test=::1".into(),
        ])
        .unwrap();
        assert_eq!(m["api.allowed.test"].len(), 2);
        assert!(parse_overrides(&["nope".into()]).is_err());
        assert!(parse_overrides(&["a=b".into()]).is_err());
    }

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
