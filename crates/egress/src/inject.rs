//! Injection path: terminate the sandbox's TLS with a leaf minted by the deployment CA, serve
//! HTTP/1.1, check each request's Host against the SNI, set the rule's headers (secrets
//! resolved here, at request time), and forward over verified TLS to the real upstream.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use crate::conn::{AuditGuard, Counted, connect_any};
use crate::policy::{NameCheck, normalize_name};
use crate::sandbox::Sandbox;
use crate::secrets::render;
use crate::sniff::host_without_port;

type Body = BoxBody<Bytes, hyper::Error>;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Hop-by-hop headers (RFC 9110 §7.6.1) are never forwarded in either direction.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut http::HeaderMap) {
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

fn text(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(msg))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert("x-bulkhead-egress", HeaderValue::from_static("refused"));
    r
}

struct Upstream {
    sb: Arc<Sandbox>,
    host: String,
    port: u16,
    addrs: Vec<IpAddr>,
    inn: Arc<std::sync::atomic::AtomicU64>,
    cancel: CancellationToken,
    sender: tokio::sync::Mutex<Option<SendRequest<Incoming>>>,
}

impl Upstream {
    async fn connect(&self) -> Result<SendRequest<Incoming>, UpstreamError> {
        let tcp = connect_any(&self.addrs, self.port)
            .await
            .map_err(UpstreamError::Connect)?;
        let name = ServerName::try_from(self.host.clone()).map_err(UpstreamError::Name)?;
        let tls = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            TlsConnector::from(self.sb.shared.upstream_tls.clone())
                .connect(name, Counted::new(tcp, self.inn.clone())),
        )
        .await
        .map_err(|_| UpstreamError::HandshakeTimeout)?
        .map_err(UpstreamError::Tls)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(UpstreamError::Http)?;
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = conn => {}
            }
        });
        Ok(sender)
    }

    async fn send(&self, req: Request<Incoming>) -> Result<Response<Incoming>, UpstreamError> {
        let mut slot = self.sender.lock().await;
        if let Some(s) = slot.as_mut()
            && (s.is_closed() || s.ready().await.is_err())
        {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(self.connect().await?);
        }
        let s = slot.as_mut().expect("connected above");
        s.send_request(req).await.map_err(UpstreamError::Request)
    }
}

/// Why the upstream of an injected request failed (said in the sandbox's 502).
#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("server name: {0}")]
    Name(rustls::pki_types::InvalidDnsNameError),
    #[error("TLS handshake timed out")]
    HandshakeTimeout,
    #[error("TLS: {0}")]
    Tls(std::io::Error),
    #[error("HTTP: {0}")]
    Http(hyper::Error),
    #[error("request: {0}")]
    Request(hyper::Error),
}

async fn handle(up: Arc<Upstream>, req: Request<Incoming>) -> Response<Body> {
    let sb = &up.sb;
    let host = &up.host;
    let req_host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(host_without_port)
        .or_else(|| req.uri().host().map(normalize_name));
    if req_host.as_deref() != Some(host.as_str()) {
        let shown = req_host.unwrap_or_else(|| "(none)".into());
        let reason = format!("mismatch: request Host {shown} differs from TLS server name {host}");
        sb.audit(
            "http",
            Some(shown),
            None,
            up.port,
            false,
            reason.clone(),
            0,
            0,
        );
        return text(
            StatusCode::MISDIRECTED_REQUEST,
            format!("Bulkhead egress: {reason}\n"),
        );
    }
    // Live policy: a kept-alive connection must not outlive a revocation.
    let policy = sb.policy();
    if let NameCheck::Denied(rule) = policy.check_name(host) {
        sb.audit(
            "http",
            Some(host.clone()),
            None,
            up.port,
            false,
            rule.clone(),
            0,
            0,
        );
        return text(
            StatusCode::FORBIDDEN,
            format!("Bulkhead egress policy: access to {host} is denied ({rule}).\n"),
        );
    }
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.uri = match parts.uri.path_and_query() {
        Some(pq) => pq
            .as_str()
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/")),
        None => http::Uri::from_static("/"),
    };
    parts.version = http::Version::HTTP_11;
    if !parts.headers.contains_key(header::HOST) {
        match HeaderValue::from_str(host) {
            Ok(v) => {
                parts.headers.insert(header::HOST, v);
            }
            Err(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "Bulkhead egress: bad host\n".into(),
                );
            }
        }
    }
    let scope = policy.source.secret_scope.as_deref();
    for rule in policy.header_rules(host).unwrap_or_default() {
        for (name, template) in &rule.headers {
            let value = match render(template, scope, sb.shared.secrets.as_ref()).await {
                Ok(v) => v,
                Err(e) => {
                    let msg = format!("Bulkhead egress: header rule {name} for {host}: {e}");
                    sb.audit(
                        "http",
                        Some(host.clone()),
                        None,
                        up.port,
                        false,
                        format!("secret-error: {e}"),
                        0,
                        0,
                    );
                    return text(StatusCode::BAD_GATEWAY, format!("{msg}\n"));
                }
            };
            let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) else {
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "Bulkhead egress: header rule {name} for {host} is not a valid header\n"
                    ),
                );
            };
            parts.headers.insert(n, v);
        }
    }
    match up.send(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => text(
            StatusCode::BAD_GATEWAY,
            format!("Bulkhead egress: upstream {host}:{} failed: {e}\n", up.port),
        ),
    }
}

pub(crate) async fn serve<S>(
    sb: Arc<Sandbox>,
    client: S,
    host: String,
    port: u16,
    addrs: Vec<IpAddr>,
    mut guard: AuditGuard,
    cancel: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let cfg = match sb.shared.ca.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%host, error = %e, "cannot mint leaf certificate");
            guard.rule = format!("{}; leaf certificate: {e}", guard.rule);
            return;
        }
    };
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(cfg).accept(client))
        .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            guard.rule = format!(
                "{}; sandbox TLS handshake failed (does it trust the Bulkhead CA?): {e}",
                guard.rule
            );
            return;
        }
        Err(_) => {
            guard.rule = format!("{}; sandbox TLS handshake timed out", guard.rule);
            return;
        }
    };
    let up = Arc::new(Upstream {
        sb,
        host,
        port,
        addrs,
        inn: guard.inn.clone(),
        cancel,
        sender: tokio::sync::Mutex::new(None),
    });
    let svc = service_fn(move |req| {
        let up = up.clone();
        async move { Ok::<_, Infallible>(handle(up, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(tls), svc)
        .await;
    drop(guard);
}
