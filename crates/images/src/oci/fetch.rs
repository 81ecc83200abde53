//! Talking to the registry through `oci-client`: the client for a resolved reference, the
//! manifest (a multi-platform index resolved to this host's platform) and config, and layer
//! blobs downloaded to files with their size capped. The crate handles the distribution
//! protocol, anonymous/basic/bearer-token auth and checks every blob against its digest; every
//! connection it makes goes through this pull's [`Guard`], which applies the address rules.

use std::path::Path;
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use oci_client::Client;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use tokio::io::AsyncWrite;

use super::config::{RegistryConfig, ResolvedReference};
use super::error::{CONFIGURE_HINT, OciError};
use super::guard::Guard;

/// The platform to pick from an image index: the configured one, else this host's.
pub(crate) fn platform(config: &RegistryConfig) -> (String, String) {
    config.platform.clone().unwrap_or_else(|| {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        ("linux".to_owned(), arch.to_owned())
    })
}

/// The registry client of one pull and the guard its connections go through (stopped when
/// this is dropped).
pub(crate) struct RegistryClient {
    client: Client,
    guard: Guard,
}

impl std::ops::Deref for RegistryClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// A client for one resolved reference (its endpoint's scheme, the configured timeouts and
/// platform), whose every request — redirects and token fetches included — goes through a
/// [`Guard`] applying the operator's connection rules.
pub(crate) async fn client(
    config: &RegistryConfig,
    r: &ResolvedReference,
) -> Result<RegistryClient, OciError> {
    static PROVIDER: Once = Once::new();
    // reqwest is built without a default TLS provider; use ring, which the workspace already
    // ships. Fails only if another provider is installed, which is just as good.
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let (os, arch) = platform(config);
    let protocol = if r.plain_http {
        ClientProtocol::HttpsExcept(vec![r.fetch.registry().to_owned()])
    } else {
        ClientProtocol::Https
    };
    let guard = Guard::start(config.connect_policy()?, config.connect_timeout)
        .await
        .map_err(|source| OciError::Io {
            action: "start the registry connection guard on",
            path: "127.0.0.1".into(),
            source,
        })?;
    let proxy = guard.proxy_url().to_owned();
    // `try_from`, not `new`: `new` falls back to a default client (no proxy, so no checks)
    // when the configuration is rejected.
    let client = Client::try_from(ClientConfig {
        protocol,
        http_proxy: Some(proxy.clone()),
        https_proxy: Some(proxy),
        no_proxy: None,
        platform_resolver: Some(Box::new(move |entries: &[ImageIndexEntry]| {
            entries
                .iter()
                .find(|e| {
                    e.platform.as_ref().is_some_and(|p| {
                        p.os.to_string() == os && p.architecture.to_string() == arch
                    })
                })
                .map(|e| e.digest.clone())
        })),
        // Connecting to the guard is instant; the guard applies the connect timeout upstream.
        connect_timeout: Some(config.connect_timeout),
        read_timeout: Some(config.read_timeout),
        ..Default::default()
    })
    .map_err(|e| OciError::Config(format!("cannot set up the registry client: {e}")))?;
    Ok(RegistryClient { client, guard })
}

pub(crate) fn auth(r: &ResolvedReference) -> RegistryAuth {
    match &r.credentials {
        Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// The image manifest for this platform, its digest, and the config JSON.
pub(crate) async fn manifest_and_config(
    client: &RegistryClient,
    config: &RegistryConfig,
    r: &ResolvedReference,
) -> Result<(OciImageManifest, String, String), OciError> {
    client
        .pull_manifest_and_config(&r.fetch, &auth(r))
        .await
        .map_err(|e| classify(e, config, r, &client.guard))
}

/// Downloads one blob to `dest`, refusing more than `budget` bytes; returns the bytes taken.
/// The client verifies the content against the descriptor's digest.
pub(crate) async fn blob(
    client: &RegistryClient,
    config: &RegistryConfig,
    r: &ResolvedReference,
    desc: &OciDescriptor,
    dest: &Path,
    budget: u64,
) -> Result<u64, OciError> {
    let limit = config.limits.max_download_bytes;
    if desc.size < 0 || desc.size as u64 > budget {
        return Err(OciError::TooLarge {
            what: "downloaded bytes",
            limit,
        });
    }
    let file = tokio::fs::File::create(dest)
        .await
        .map_err(|source| OciError::Io {
            action: "create",
            path: dest.to_owned(),
            source,
        })?;
    let mut out = Capped {
        inner: file,
        left: budget,
        written: 0,
    };
    client
        .pull_blob(&r.fetch, desc, &mut out)
        .await
        .map_err(|e| match e {
            OciDistributionError::IoError(io) if io.kind() == std::io::ErrorKind::FileTooLarge => {
                OciError::TooLarge {
                    what: "downloaded bytes",
                    limit,
                }
            }
            other => classify(other, config, r, &client.guard),
        })?;
    Ok(out.written)
}

/// Maps the client's error onto what the user should do. Anything at the transport level,
/// and anything after the guard refused or failed a connection, is the one generic
/// [`OciError::Unreachable`] (detail in the log); the registry's own answers (401, unknown
/// manifest) are told apart, as only an allowed registry at a checked address gives them.
fn classify(
    e: OciDistributionError,
    config: &RegistryConfig,
    r: &ResolvedReference,
    guard: &Guard,
) -> OciError {
    let reference = r.canonical.clone();
    let endpoint = r.endpoint.clone();
    let notes = guard.take_notes();
    let generic = |detail: String| {
        tracing::info!(
            reference = %reference,
            endpoint = %endpoint,
            guard = ?notes,
            "pull failed: {detail}"
        );
        OciError::Unreachable {
            reference: reference.clone(),
            registry: r.registry.clone(),
            hint: CONFIGURE_HINT,
        }
    };
    if !notes.is_empty() {
        return generic(chain(&e));
    }
    match e {
        OciDistributionError::RequestError(req) => generic(chain(&req)),
        OciDistributionError::AuthenticationFailure(reason) => OciError::Auth {
            reference,
            endpoint,
            reason,
        },
        OciDistributionError::UnauthorizedError { url } => OciError::Auth {
            reference,
            endpoint,
            reason: format!("{url} answered 401"),
        },
        OciDistributionError::ImageManifestNotFoundError(m) if m.contains("no entry found") => {
            let (os, arch) = platform(config);
            OciError::NoPlatform {
                reference,
                platform: format!("{os}/{arch}"),
            }
        }
        OciDistributionError::ImageManifestNotFoundError(reason) => OciError::NotFound {
            reference,
            endpoint,
            reason,
        },
        OciDistributionError::RegistryError { envelope, url } => {
            let text = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}: {}", e.code, e.message))
                .collect::<Vec<_>>()
                .join("; ");
            let unknown = envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                )
            });
            let reason = format!("{url}: {text}");
            if unknown {
                OciError::NotFound {
                    reference,
                    endpoint,
                    reason,
                }
            } else {
                OciError::Registry {
                    reference,
                    endpoint,
                    reason,
                }
            }
        }
        OciDistributionError::ServerError { code: 404, url, .. } => OciError::NotFound {
            reference,
            endpoint,
            reason: format!("{url} answered 404"),
        },
        // Redirect loops, bodies that are not a registry's: nothing a user can act on that
        // the log cannot tell the operator.
        other => generic(chain(&other)),
    }
}

/// An error and its sources on one line (reqwest hides the useful part in the sources).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A writer that fails once more than `left` bytes arrive, so an endless or oversized blob
/// stops the download instead of filling the disk.
struct Capped<W> {
    inner: W,
    left: u64,
    written: u64,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "blob larger than the pull limit",
            )));
        }
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.left -= n as u64;
                this.written += n as u64;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
