//! The operator's registry settings ([`RegistryConfig`]) and how an image reference such as
//! `python:3.12` becomes the endpoint, repository and credentials a pull uses. Data only: no
//! network here.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use oci_client::Reference;
use serde::Deserialize;

use super::error::OciError;
use super::policy::{
    ConnectPolicy, HostPattern, PUBLIC_REGISTRIES, normalize_host, split_authority,
};

/// Why a `--registry-mirror` value is not `REGISTRY=URL`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorSpecError {
    #[error("{0:?}: expected REGISTRY=URL, e.g. docker.io=https://mirror.example")]
    Shape(String),
    #[error("{0:?}: the URL must start with http:// or https://")]
    Scheme(String),
    #[error("{0:?}: give the endpoint as scheme://host[:port] without a path")]
    Path(String),
}

/// Docker Hub's canonical name, as image references normalise it.
pub const DOCKER_HUB: &str = "docker.io";

/// A username and password (or token as password) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryCredentials {
    pub username: String,
    pub password: String,
}

impl RegistryCredentials {
    /// E2B's `GeneralRegistry` (`{"type": "registry", "username", "password"}`).
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        RegistryCredentials {
            username: username.into(),
            password: password.into(),
        }
    }

    /// E2B's `GCPRegistry` (`serviceAccountJson`): Google's registries take the key itself
    /// as the password of the user `_json_key`.
    pub fn gcp_service_account(service_account_json: impl Into<String>) -> Self {
        RegistryCredentials::basic("_json_key", service_account_json)
    }
}

impl fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RegistryCredentials({}, <redacted>)", self.username)
    }
}

/// Size limits of one pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullLimits {
    /// Compressed bytes downloaded (all layers and the config).
    pub max_download_bytes: u64,
    /// Bytes of regular files written to the tree.
    pub max_unpacked_bytes: u64,
    /// Tar entries across all layers.
    pub max_entries: u64,
    pub max_layers: usize,
}

impl Default for PullLimits {
    fn default() -> Self {
        PullLimits {
            max_download_bytes: 8 << 30,
            // A few GiB: real images are far smaller; a gzip bomb stops here, not at the disk.
            max_unpacked_bytes: 4 << 30,
            max_entries: 2_000_000,
            max_layers: 256,
        }
    }
}

/// Which registries images may come from and how to reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Registries (as named in references: `docker.io`, `ghcr.io`, `registry:5000`) images
    /// may be pulled from, as [`HostPattern`]s (`*.pkg.dev`; `*` for any; no port: any
    /// port). Default: [`PUBLIC_REGISTRIES`]. A mirror entry does not allow a registry by
    /// itself. Empty: none.
    pub allowed: Vec<String>,
    /// Endpoints (`HOST[:PORT]` patterns) the server may reach over plain HTTP and at
    /// loopback, private or link-local addresses (`--registry-insecure`): a registry on this
    /// machine or the LAN. Every other connection of a pull, redirects and token services
    /// included, is HTTPS to public addresses only (see `policy`).
    pub insecure: Vec<String>,
    /// Registry → endpoint URL serving it (`docker.io` → `https://mirror.example`,
    /// `http://127.0.0.1:5000`): a pull-through mirror, or the registry's own address. The
    /// scheme decides HTTP or HTTPS (HTTP only for an [`insecure`](Self::insecure) endpoint);
    /// registries without an entry use HTTPS at their name, or HTTP when they are insecure.
    pub mirrors: BTreeMap<String, String>,
    /// Credentials by registry name or endpoint host (`host:port`).
    pub credentials: BTreeMap<String, RegistryCredentials>,
    /// Platform to pick from multi-platform images; default: this host's (`linux/amd64`).
    pub platform: Option<(String, String)>,
    pub connect_timeout: Duration,
    /// A read that stalls this long fails the pull.
    pub read_timeout: Duration,
    pub limits: PullLimits,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            allowed: PUBLIC_REGISTRIES.iter().map(|s| (*s).to_owned()).collect(),
            insecure: Vec::new(),
            mirrors: BTreeMap::new(),
            credentials: BTreeMap::new(),
            platform: None,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
            limits: PullLimits::default(),
        }
    }
}

/// A reference resolved against a [`RegistryConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedReference {
    /// The normalised reference as the user meant it (`docker.io/library/python:3.12`).
    pub canonical: String,
    /// The registry it names (`docker.io`).
    pub registry: String,
    /// Where it is fetched from: the reference rewritten to the endpoint.
    pub fetch: Reference,
    /// `scheme://host[:port]` of the endpoint, for messages.
    pub endpoint: String,
    pub plain_http: bool,
    pub credentials: Option<RegistryCredentials>,
}

impl RegistryConfig {
    /// The connection rules every request of a pull passes (see `policy`).
    pub(crate) fn connect_policy(&self) -> Result<ConnectPolicy, OciError> {
        Ok(ConnectPolicy {
            insecure: patterns(&self.insecure, "--registry-insecure")?,
        })
    }

    /// Checks the settings against each other: patterns parse, and a plain-HTTP mirror is an
    /// insecure endpoint. `resolve` checks this too; call it at startup to fail early.
    pub fn validate(&self) -> Result<(), OciError> {
        patterns(&self.allowed, "--registry-allow")?;
        let policy = self.connect_policy()?;
        for (registry, url) in &self.mirrors {
            if let Some(host) = url.strip_prefix("http://") {
                let (h, port) = split_authority(host).unwrap_or((host, None));
                if !policy.is_insecure(h, port.unwrap_or(80)) {
                    return Err(OciError::Config(format!(
                        "the mirror for {registry} ({url}) is plain HTTP: allow it with \
                         --registry-insecure {host} (env BULKHEAD_REGISTRY_INSECURE), or use \
                         https://"
                    )));
                }
            }
        }
        Ok(())
    }

    /// True when `registry` (as named in a reference) may be pulled from.
    fn is_allowed(&self, registry: &str) -> Result<bool, OciError> {
        let (host, port) = split_authority(registry).unwrap_or((registry, None));
        let host = normalize_host(host);
        Ok(patterns(&self.allowed, "--registry-allow")?
            .iter()
            .any(|p| p.matches(&host, port.unwrap_or(443))))
    }

    /// Parses `REGISTRY=URL` (a `--registry-mirror` value) into [`mirrors`](Self::mirrors).
    pub fn add_mirror(&mut self, spec: &str) -> Result<(), MirrorSpecError> {
        let (registry, url) = spec
            .split_once('=')
            .ok_or_else(|| MirrorSpecError::Shape(spec.to_owned()))?;
        let url = url.trim().trim_end_matches('/');
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| MirrorSpecError::Scheme(spec.to_owned()))?;
        if rest.is_empty() || rest.contains('/') {
            return Err(MirrorSpecError::Path(spec.to_owned()));
        }
        self.mirrors
            .insert(registry.trim().to_owned(), url.to_owned());
        Ok(())
    }

    /// Reads a Docker `config.json`-style credentials file: `{"auths": {"HOST": {"auth":
    /// base64("user:password")}}}` or `{"username": …, "password": …}` per host.
    pub fn load_auth_file(&mut self, path: &Path) -> Result<(), OciError> {
        let bad = |reason: String| OciError::AuthFile {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        self.credentials.extend(parse_auths(&text).map_err(bad)?);
        Ok(())
    }

    /// Normalises `reference`, applies the allow list and the mirror mapping, and picks the
    /// credentials (`explicit` — e.g. from a build request — wins over configured ones).
    pub fn resolve(
        &self,
        reference: &str,
        explicit: Option<&RegistryCredentials>,
    ) -> Result<ResolvedReference, OciError> {
        let parsed: Reference = reference
            .trim()
            .parse()
            .map_err(|e: oci_client::ParseError| OciError::BadReference {
                reference: reference.to_owned(),
                reason: e.to_string(),
            })?;
        let registry = parsed.registry().to_owned();
        self.validate()?;
        if !self.is_allowed(&registry)? {
            return Err(OciError::NotAllowed {
                registry,
                allowed: if self.allowed.is_empty() {
                    "none".into()
                } else {
                    self.allowed.join(", ")
                },
            });
        }
        let policy = self.connect_policy()?;
        let (endpoint, host, plain_http) = match self.mirrors.get(&registry) {
            Some(url) => {
                let plain = url.starts_with("http://");
                let host = url.split_once("://").map_or(url.as_str(), |(_, h)| h);
                (url.clone(), host.to_owned(), plain)
            }
            // An insecure registry (one the operator listed: on this machine or the LAN)
            // speaks plain HTTP, as Docker's `insecure-registries` do.
            None if {
                let (h, port) = split_authority(&registry).unwrap_or((&registry, None));
                policy.is_insecure(h, port.unwrap_or(80))
            } =>
            {
                (format!("http://{registry}"), registry.clone(), true)
            }
            None => {
                // Docker Hub's API lives at index.docker.io; oci-client maps it on its own.
                let host = parsed.resolve_registry().to_owned();
                (format!("https://{host}"), registry.clone(), false)
            }
        };
        let repository = parsed.repository().to_owned();
        let fetch = match (parsed.digest(), parsed.tag()) {
            (Some(d), _) => Reference::with_digest(host.clone(), repository, d.to_owned()),
            (None, Some(t)) => Reference::with_tag(host.clone(), repository, t.to_owned()),
            (None, None) => Reference::with_tag(host.clone(), repository, "latest".to_owned()),
        };
        let credentials = explicit
            .cloned()
            .or_else(|| self.credentials.get(&host).cloned())
            .or_else(|| self.credentials.get(&registry).cloned());
        Ok(ResolvedReference {
            canonical: parsed.whole(),
            registry,
            fetch,
            endpoint,
            plain_http,
            credentials,
        })
    }
}

fn patterns(specs: &[String], flag: &'static str) -> Result<Vec<HostPattern>, OciError> {
    specs
        .iter()
        .map(|s| HostPattern::parse(s).map_err(|source| OciError::Pattern { flag, source }))
        .collect()
}

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

fn parse_auths(text: &str) -> Result<BTreeMap<String, RegistryCredentials>, String> {
    let file: AuthFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for (host, e) in file.auths {
        // Docker writes `https://index.docker.io/v1/` for Hub; keep only the host part.
        let key = host
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let key = if key == "index.docker.io" {
            DOCKER_HUB.to_owned()
        } else {
            key
        };
        let creds = match (e.auth, e.username, e.password) {
            (Some(b64), _, _) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|err| format!("auths.{host}.auth is not base64: {err}"))?;
                let raw = String::from_utf8(raw)
                    .map_err(|_| format!("auths.{host}.auth is not UTF-8 user:password"))?;
                let (u, p) = raw
                    .split_once(':')
                    .ok_or_else(|| format!("auths.{host}.auth is not user:password"))?;
                RegistryCredentials {
                    username: u.to_owned(),
                    password: p.to_owned(),
                }
            }
            (None, Some(username), Some(password)) => RegistryCredentials { username, password },
            _ => {
                return Err(format!(
                    "auths.{host} has neither auth nor username+password"
                ));
            }
        };
        out.insert(key, creds);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_names_go_to_the_mirror() {
        let mut c = RegistryConfig::default();
        c.add_mirror("docker.io=http://127.0.0.1:5000/").unwrap();
        // A plain-HTTP mirror needs the operator's explicit trust.
        let e = c.resolve("python:3.12", None).unwrap_err();
        assert!(
            e.to_string().contains("--registry-insecure 127.0.0.1:5000"),
            "{e}"
        );
        c.insecure = vec!["127.0.0.1:5000".into()];
        let r = c.resolve("python:3.12", None).unwrap();
        assert_eq!(r.canonical, "docker.io/library/python:3.12");
        assert_eq!(r.registry, "docker.io");
        assert_eq!(r.endpoint, "http://127.0.0.1:5000");
        assert!(r.plain_http);
        assert_eq!(r.fetch.whole(), "127.0.0.1:5000/library/python:3.12");

        let other = c.resolve("ghcr.io/org/app@sha256:0000000000000000000000000000000000000000000000000000000000000000", None).unwrap();
        assert_eq!(other.endpoint, "https://ghcr.io");
        assert!(!other.plain_http);
        assert_eq!(other.fetch.digest().map(|d| &d[..7]), Some("sha256:"));
        assert_eq!(
            c.resolve("debian", None).unwrap().fetch.tag(),
            Some("latest")
        );
    }

    #[test]
    fn loopback_registries_need_the_operator_and_then_are_plain_http() {
        // By default only the public registries: a reference cannot aim a pull at this host.
        let c = RegistryConfig::default();
        for local in [
            "127.0.0.1:5000/x/y:1",
            "localhost:5000/y",
            "2130706433:5000/y",
            "10.0.0.5/y:1",
            "169.254.169.254/latest/meta-data:1",
        ] {
            let e = c.resolve(local, None).unwrap_err();
            assert!(matches!(e, OciError::NotAllowed { .. }), "{local}: {e}");
        }
        for public in [
            "python:3.12",
            "ghcr.io/o/a:1",
            "europe-docker.pkg.dev/p/r/i:1",
        ] {
            assert!(!c.resolve(public, None).unwrap().plain_http, "{public}");
        }
        // Allowed but not insecure: HTTPS (and the guard refuses the loopback address).
        let c = RegistryConfig {
            allowed: vec!["127.0.0.1:5000".into(), "localhost".into()],
            ..Default::default()
        };
        assert!(!c.resolve("127.0.0.1:5000/x/y:1", None).unwrap().plain_http);
        let c = RegistryConfig {
            insecure: c.allowed.clone(),
            ..c
        };
        for (reference, endpoint) in [
            ("127.0.0.1:5000/x/y:1", "http://127.0.0.1:5000"),
            ("localhost:5000/y", "http://localhost:5000"),
            ("localhost:6000/y", "http://localhost:6000"),
        ] {
            let r = c.resolve(reference, None).unwrap();
            assert_eq!(r.endpoint, endpoint, "{reference}");
            assert!(r.plain_http, "{reference}");
        }
        // Only the port listed.
        let e = c.resolve("127.0.0.1:5001/x/y:1", None).unwrap_err();
        assert!(matches!(e, OciError::NotAllowed { .. }), "{e}");
    }

    #[test]
    fn allow_list_and_bad_specs() {
        let c = RegistryConfig {
            allowed: vec!["docker.io".into()],
            ..Default::default()
        };
        assert!(c.resolve("ubuntu:24.04", None).is_ok());
        let e = c.resolve("quay.io/x/y:1", None).unwrap_err();
        assert!(e.to_string().contains("--registry-allow"), "{e}");
        // A mirror does not allow its registry by itself.
        let mut m = c.clone();
        m.add_mirror("quay.io=https://quay-mirror.example").unwrap();
        assert!(matches!(
            m.resolve("quay.io/x/y:1", None),
            Err(OciError::NotAllowed { .. })
        ));
        let none = RegistryConfig {
            allowed: Vec::new(),
            ..Default::default()
        };
        let e = none.resolve("ubuntu", None).unwrap_err();
        assert!(e.to_string().contains("allowed: none"), "{e}");
        let bad = RegistryConfig {
            allowed: vec!["a/b".into()],
            ..Default::default()
        };
        let e = bad.validate().unwrap_err();
        assert!(matches!(e, OciError::Pattern { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            r#"Invalid registry settings: --registry-allow "a/b": expected HOST or HOST:PORT (e.g. ghcr.io)"#
        );
        assert!(matches!(
            c.resolve("UPPER/Case:tag", None),
            Err(OciError::BadReference { .. })
        ));
        let mut c = RegistryConfig::default();
        assert_eq!(
            c.add_mirror("docker.io").unwrap_err().to_string(),
            r#""docker.io": expected REGISTRY=URL, e.g. docker.io=https://mirror.example"#
        );
        assert_eq!(
            c.add_mirror("docker.io=ftp://x").unwrap_err().to_string(),
            r#""docker.io=ftp://x": the URL must start with http:// or https://"#
        );
        assert!(c.add_mirror("docker.io=https://x/path").is_err());
    }

    #[test]
    fn credentials_from_a_docker_config_and_explicit_ones_win() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("auth.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            &p,
            format!(
                r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{b64}"}},
                   "mirror.local:5000": {{"username": "bob", "password": "pw"}}}}}}"#
            ),
        )
        .unwrap();
        let mut c = RegistryConfig::default();
        c.load_auth_file(&p).unwrap();
        c.add_mirror("docker.io=https://mirror.local:5000").unwrap();
        // The endpoint's own entry is preferred over the registry name's.
        assert_eq!(
            c.resolve("alpine", None)
                .unwrap()
                .credentials
                .unwrap()
                .username,
            "bob"
        );
        c.mirrors.clear();
        let hub = c.resolve("alpine", None).unwrap().credentials.unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("alice", "s3cret")
        );
        assert!(!format!("{hub:?}").contains("s3cret"));
        let mine = RegistryCredentials {
            username: "me".into(),
            password: "x".into(),
        };
        assert_eq!(
            c.resolve("alpine", Some(&mine)).unwrap().credentials,
            Some(mine)
        );
        std::fs::write(&p, r#"{"auths": {"x": {"auth": "!!"}}}"#).unwrap();
        assert!(matches!(
            c.load_auth_file(&p),
            Err(OciError::AuthFile { .. })
        ));
    }
}
