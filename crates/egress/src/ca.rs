//! The per-deployment CA that signs leaf certificates for injection domains, and the upstream
//! TLS client configuration. One crypto provider (`ring`) is passed explicitly everywhere, so
//! nothing depends on a process-wide default provider.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};

use crate::error::EgressError;

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";
const LEAF_VALIDITY: Duration = Duration::days(30);
const LEAF_RENEW_BEFORE: Duration = Duration::days(2);

pub(crate) struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// One key for all leaves: generating a key per host buys nothing here and costs latency.
    leaf_key: KeyPair,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<HashMap<String, (OffsetDateTime, Arc<rustls::ServerConfig>)>>,
}

fn ca_err(path: &Path, message: impl Into<String>) -> EgressError {
    EgressError::Ca {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), EgressError> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| ca_err(&tmp, format!("cannot create: {e}")))?;
    f.write_all(data)
        .and_then(|_| f.sync_all())
        .map_err(|e| ca_err(&tmp, format!("cannot write: {e}")))?;
    // The umask may have narrowed the mode; set it exactly.
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(|e| ca_err(&tmp, e.to_string()))?;
    fs::rename(&tmp, path).map_err(|e| ca_err(path, format!("cannot rename into place: {e}")))
}

impl Ca {
    pub fn load_or_create(
        state_dir: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, EgressError> {
        fs::create_dir_all(state_dir)
            .map_err(|e| ca_err(state_dir, format!("cannot create state dir: {e}")))?;
        let cert_path: PathBuf = state_dir.join(CA_CERT);
        let key_path: PathBuf = state_dir.join(CA_KEY);
        let (cert_pem, key) = match (cert_path.exists(), key_path.exists()) {
            (true, true) => {
                let key_pem =
                    fs::read_to_string(&key_path).map_err(|e| ca_err(&key_path, e.to_string()))?;
                let key = KeyPair::from_pem(&key_pem)
                    .map_err(|e| ca_err(&key_path, format!("not a valid PEM private key ({e}); restore it or remove both {CA_CERT} and {CA_KEY} to mint a new CA")))?;
                let pem = fs::read_to_string(&cert_path)
                    .map_err(|e| ca_err(&cert_path, e.to_string()))?;
                (pem, key)
            }
            (true, false) => {
                return Err(ca_err(
                    &key_path,
                    format!(
                        "{CA_CERT} exists but its key is missing; restore {CA_KEY}, or remove {CA_CERT} to mint a new CA (sandboxes trusting the old one must be recreated)"
                    ),
                ));
            }
            // No CA yet (or an interrupted first start left only a key): mint one.
            _ => {
                let key = KeyPair::generate()
                    .map_err(|e| ca_err(&key_path, format!("key generation failed: {e}")))?;
                let mut params = CertificateParams::default();
                let mut dn = DistinguishedName::new();
                dn.push(DnType::CommonName, "Bulkhead egress CA");
                dn.push(DnType::OrganizationName, "Bulkhead");
                params.distinguished_name = dn;
                params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
                params.key_usages = vec![
                    KeyUsagePurpose::KeyCertSign,
                    KeyUsagePurpose::CrlSign,
                    KeyUsagePurpose::DigitalSignature,
                ];
                let now = OffsetDateTime::now_utc();
                params.not_before = now - Duration::days(1);
                params.not_after = now + Duration::days(3650);
                let cert = params
                    .self_signed(&key)
                    .map_err(|e| ca_err(&cert_path, e.to_string()))?;
                write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
                write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
                (cert.pem(), key)
            }
        };
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| ca_err(&cert_path, format!("not a PEM certificate: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .map_err(|e| ca_err(&cert_path, format!("cannot use as issuer: {e}")))?;
        let leaf_key = KeyPair::generate()
            .map_err(|e| ca_err(&cert_path, format!("leaf key generation: {e}")))?;
        Ok(Self {
            cert_pem,
            cert_der,
            issuer,
            leaf_key,
            provider,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A TLS server config presenting a leaf for `host` (cached per host; re-minted near expiry).
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, EgressError> {
        let now = OffsetDateTime::now_utc();
        if let Some((exp, cfg)) = self.leaves.lock().expect("leaf cache").get(host)
            && *exp - LEAF_RENEW_BEFORE > now
        {
            return Ok(cfg.clone());
        }
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| EgressError::Ca {
                path: PathBuf::from(host),
                message: format!("leaf params: {e}"),
            })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - Duration::hours(1);
        let expiry = now + LEAF_VALIDITY;
        params.not_after = expiry;
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| EgressError::Ca {
                path: PathBuf::from(host),
                message: format!("signing leaf: {e}"),
            })?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), self.cert_der.clone()], key)?;
        // Only HTTP/1.1 is served on the terminating side.
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        self.leaves
            .lock()
            .expect("leaf cache")
            .insert(host.to_string(), (expiry, cfg.clone()));
        Ok(cfg)
    }
}

/// Client config for upstream TLS: host trust store plus operator-supplied roots.
pub(crate) fn upstream_client_config(
    provider: Arc<CryptoProvider>,
    extra_roots: &[PathBuf],
) -> Result<rustls::ClientConfig, EgressError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!(error = %e, "some host trust-store certificates could not be loaded");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "host trust store loaded for upstream TLS");
    for path in extra_roots {
        let mut n = 0;
        for cert in CertificateDer::pem_file_iter(path)
            .map_err(|e| EgressError::Roots(format!("{}: {e}", path.display())))?
        {
            let cert = cert.map_err(|e| EgressError::Roots(format!("{}: {e}", path.display())))?;
            roots.add(cert).map_err(|e| {
                EgressError::Roots(format!("{}: certificate rejected: {e}", path.display()))
            })?;
            n += 1;
        }
        if n == 0 {
            return Err(EgressError::Roots(format!(
                "{}: no PEM certificates found",
                path.display()
            )));
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_created_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let p = Arc::new(rustls::crypto::ring::default_provider());
        let ca = Ca::load_or_create(dir.path(), p.clone()).unwrap();
        let key_mode = fs::metadata(dir.path().join(CA_KEY))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        let cert_mode = fs::metadata(dir.path().join(CA_CERT))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!((key_mode, cert_mode), (0o600, 0o644));
        let again = Ca::load_or_create(dir.path(), p.clone()).unwrap();
        assert_eq!(ca.cert_pem(), again.cert_pem());
        // Leaf verifies against the CA with a real rustls client handshake config.
        let cfg = again.server_config("api.example.test").unwrap();
        assert!(Arc::ptr_eq(
            &cfg,
            &again.server_config("api.example.test").unwrap()
        ));
        fs::remove_file(dir.path().join(CA_KEY)).unwrap();
        assert!(Ca::load_or_create(dir.path(), p).is_err());
    }
}
