//! The reserve's check: a connection admitted into the last slots must show, within a short
//! deadline, a first request head that is `/health`, carries an API key, or goes to a sandbox
//! (the routing proxy's `E2b-Sandbox-Id` header or `{port}-{id}.{domain}` host). The head is
//! read with `MSG_PEEK`, so the HTTP server then reads it again from the start; only HTTP/1.x
//! heads qualify (an HTTP/2 prior-knowledge preface hides its headers behind HPACK).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::TcpStream;

/// Largest head the check reads; a longer one does not qualify.
const MAX_HEAD: usize = 16 * 1024;
/// Headers parsed; a head with more does not qualify.
const MAX_HEADERS: usize = 64;
/// Pause between peeks while a head arrives in pieces (peek returns at once while any data
/// is queued, so it cannot be awaited for "more").
const REPEEK: Duration = Duration::from_millis(10);

/// What vouches for a request in the reserve: the engine in the server, a fake in tests.
pub trait Vouch: Send + Sync + 'static {
    /// Whether `key` is an active API key.
    fn api_key<'a>(&'a self, key: &'a str) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
    /// Whether `id` is a running sandbox.
    fn live_sandbox(&self, id: &str) -> bool;
}

/// What a complete request head claims.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Claims {
    /// `GET` or `HEAD` of `/health`.
    pub health: bool,
    /// `X-API-Key`, else `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// The sandbox the proxy would route it to.
    pub sandbox: Option<String>,
}

/// The result of reading what has arrived so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// More bytes are needed.
    Partial,
    /// Not an HTTP/1.x head we accept (malformed, too large, too many headers, HTTP/2).
    Invalid,
    /// A head of this many bytes.
    Complete(Claims, usize),
}

/// Reads a request head from `buf` (what has arrived on the connection so far).
pub fn parse(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Head::Partial,
        Ok(httparse::Status::Partial) | Err(_) => Head::Invalid,
        Ok(httparse::Status::Complete(len)) => {
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
            };
            let path = req.path.unwrap_or("");
            let path = path.split_once('?').map_or(path, |(p, _)| p);
            let health = matches!(req.method, Some("GET" | "HEAD")) && path == "/health";
            let api_key = bulkhead_api::api_key_of(header("x-api-key"), header("authorization"))
                .map(|k| k.trim().to_owned());
            let sandbox = header("e2b-sandbox-id")
                .map(str::to_owned)
                .or_else(|| header("host").and_then(bulkhead_api::sandbox_of_host));
            Head::Complete(
                Claims {
                    health,
                    api_key,
                    sandbox,
                },
                len,
            )
        }
    }
}

/// Whether a complete head's claims hold: `/health`, a valid key, or a running sandbox.
pub async fn qualifies(claims: &Claims, vouch: &dyn Vouch) -> bool {
    if claims.health {
        return true;
    }
    if let Some(id) = &claims.sandbox
        && vouch.live_sandbox(id)
    {
        return true;
    }
    match &claims.api_key {
        Some(key) => vouch.api_key(key).await,
        None => false,
    }
}

/// Why a reserve connection was not served.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Passed,
    /// A complete head of this many bytes that does not qualify: answer 503 and close.
    Refused(usize),
    /// Nothing usable arrived in time, the peer closed, or it was not HTTP/1.x: close.
    Silent,
}

/// Peeks at `stream` until a request head is complete: its claims and length, or None when
/// the peer closed or sent something that is not an HTTP/1.x head.
pub async fn read_head(stream: &TcpStream) -> Option<(Claims, usize)> {
    let mut buf = vec![0u8; MAX_HEAD];
    loop {
        let n = match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => n,
        };
        match parse(&buf[..n]) {
            Head::Partial => tokio::time::sleep(REPEEK).await,
            Head::Invalid => return None,
            Head::Complete(claims, len) => return Some((claims, len)),
        }
    }
}

/// What a refused reserve connection is told: E2B's error shape, and the way in.
pub const REFUSED_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
connection: close\r\n\
retry-after: 1\r\n\
content-length: 150\r\n\
\r\n\
{\"code\":503,\"message\":\"The server is at its connection limit; its last connections are kept for API calls with a valid key and /health. Retry later.\"}";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claims(head: &str) -> Claims {
        match parse(head.as_bytes()) {
            Head::Complete(c, len) => {
                assert_eq!(len, head.len());
                c
            }
            other => panic!("{head:?}: {other:?}"),
        }
    }

    #[test]
    fn the_refusal_is_well_formed() {
        let text = std::str::from_utf8(REFUSED_RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], 503);
    }

    #[test]
    fn heads_and_what_they_claim() {
        assert!(claims("GET /health HTTP/1.1\r\nHost: x\r\n\r\n").health);
        assert!(claims("HEAD /health?x=1 HTTP/1.1\r\n\r\n").health);
        assert!(!claims("POST /health HTTP/1.1\r\n\r\n").health);
        assert!(!claims("GET /healthz HTTP/1.1\r\n\r\n").health);
        assert_eq!(
            claims("GET /sandboxes HTTP/1.1\r\nx-api-key: e2b_k\r\n\r\n").api_key,
            Some("e2b_k".into())
        );
        assert_eq!(
            claims("GET /metrics HTTP/1.1\r\nAuthorization: Bearer e2b_k \r\n\r\n").api_key,
            Some("e2b_k".into())
        );
        assert_eq!(
            claims("GET /m HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n").api_key,
            None
        );
        assert_eq!(
            claims("POST /process.Process/Start HTTP/1.1\r\nE2b-Sandbox-Id: ib3x\r\nE2b-Sandbox-Port: 49983\r\n\r\n")
                .sandbox,
            Some("ib3x".into())
        );
        assert_eq!(
            claims("GET / HTTP/1.1\r\nHost: 49983-ib3x.sb.example.com\r\n\r\n").sandbox,
            Some("ib3x".into())
        );
        assert_eq!(
            claims("GET / HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n\r\n"),
            Claims::default()
        );
    }

    #[test]
    fn partial_invalid_and_http2() {
        assert_eq!(parse(b""), Head::Partial);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Head::Partial);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nx-api-key: a"), Head::Partial);
        assert_eq!(parse(b"\x16\x03\x01\x02\x00"), Head::Invalid);
        assert_eq!(parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Head::Invalid);
        // A head that never ends within the limit does not qualify.
        let mut long = b"GET / HTTP/1.1\r\nx: ".to_vec();
        long.resize(MAX_HEAD, b'a');
        assert_eq!(parse(&long), Head::Invalid);
    }

    struct Fake;
    impl Vouch for Fake {
        fn api_key<'a>(&'a self, key: &'a str) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
            Box::pin(async move { key == "good" })
        }
        fn live_sandbox(&self, id: &str) -> bool {
            id == "live"
        }
    }

    #[tokio::test]
    async fn what_qualifies() {
        let q = |c: Claims| async move { qualifies(&c, &Fake).await };
        assert!(
            q(Claims {
                health: true,
                ..Claims::default()
            })
            .await
        );
        assert!(
            q(Claims {
                api_key: Some("good".into()),
                ..Claims::default()
            })
            .await
        );
        assert!(
            !q(Claims {
                api_key: Some("bad".into()),
                ..Claims::default()
            })
            .await
        );
        assert!(
            q(Claims {
                sandbox: Some("live".into()),
                ..Claims::default()
            })
            .await
        );
        assert!(
            !q(Claims {
                sandbox: Some("gone".into()),
                ..Claims::default()
            })
            .await
        );
        assert!(!q(Claims::default()).await);
    }

    proptest! {
        /// Whatever a client sends, the check answers without panicking.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse(&bytes);
        }

        /// A head cut anywhere before its blank line waits for more.
        #[test]
        fn a_head_cut_anywhere_is_partial(cut in 0usize..60) {
            let head = b"GET /health HTTP/1.1\r\nHost: a\r\nx-api-key: k\r\n\r\n";
            let cut = cut.min(head.len() - 1);
            prop_assert_eq!(parse(&head[..cut]), Head::Partial);
        }
    }
}
