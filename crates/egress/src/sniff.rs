//! Peeks at the first bytes of a connection: TLS ClientHello SNI (parsed by rustls's
//! `Acceptor`) or the HTTP/1 `Host` header (httparse). Bounded in size and time.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::policy::normalize_name;

/// Most ClientHellos are < 2 KiB (post-quantum key shares push them near 1.8 KiB); headers of
/// real HTTP requests fit easily. Anything larger is treated as unparseable.
pub(crate) const MAX_PEEK: usize = 16 * 1024;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Sniffed {
    Tls {
        sni: Option<String>,
    },
    Http {
        host: Option<String>,
    },
    /// Unrecognised bytes, or a client that waited for the server (server-speaks-first).
    Other,
    /// The client closed before sending anything.
    Closed,
}

impl Sniffed {
    pub fn protocol(&self) -> &'static str {
        match self {
            Sniffed::Tls { .. } => "tls",
            Sniffed::Http { .. } => "http",
            _ => "tcp",
        }
    }
    pub fn name(&self) -> Option<&str> {
        match self {
            Sniffed::Tls { sni } => sni.as_deref(),
            Sniffed::Http { host } => host.as_deref(),
            _ => None,
        }
    }
}

enum Parse {
    Done(Sniffed),
    NeedMore,
}

/// Strips an optional port and brackets from a Host header value.
pub(crate) fn host_without_port(h: &str) -> String {
    let h = h.trim();
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_ascii_lowercase();
    }
    match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            normalize_name(host)
        }
        _ => normalize_name(h),
    }
}

fn parse_tls(buf: &[u8]) -> Parse {
    let mut acc = rustls::server::Acceptor::default();
    let mut rd = buf;
    while !rd.is_empty() {
        match acc.read_tls(&mut rd) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Parse::Done(Sniffed::Tls { sni: None }),
        }
    }
    match acc.accept() {
        Ok(Some(accepted)) => {
            let sni = accepted.client_hello().server_name().map(normalize_name);
            Parse::Done(Sniffed::Tls { sni })
        }
        Ok(None) => Parse::NeedMore,
        Err(_) => Parse::Done(Sniffed::Tls { sni: None }),
    }
}

fn looks_like_http(buf: &[u8]) -> bool {
    let method_len = buf.iter().take(16).position(|b| *b == b' ');
    match method_len {
        Some(n) if n > 0 => buf[..n].iter().all(|b| b.is_ascii_uppercase()),
        // Not enough bytes yet to see the space: keep waiting while it still looks like a token.
        None => buf.len() < 16 && buf.iter().all(|b| b.is_ascii_uppercase()),
        _ => false,
    }
}

fn parse_http(buf: &[u8]) -> Parse {
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            let host = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("host"))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(host_without_port)
                .or_else(|| {
                    // Absolute-form request target ("GET http://host/ HTTP/1.1").
                    req.path
                        .and_then(|p| p.parse::<http::Uri>().ok())
                        .and_then(|u| u.host().map(normalize_name))
                });
            Parse::Done(Sniffed::Http { host })
        }
        Ok(httparse::Status::Partial) => Parse::NeedMore,
        Err(_) => Parse::Done(Sniffed::Other),
    }
}

/// Classifies bytes received so far.
fn classify(buf: &[u8]) -> Parse {
    if buf.is_empty() {
        return Parse::NeedMore;
    }
    if buf[0] == 0x16 {
        return parse_tls(buf);
    }
    if looks_like_http(buf) {
        return parse_http(buf);
    }
    Parse::Done(Sniffed::Other)
}

/// Reads from `s` into `buf` until the protocol and name are known. Waits at most
/// `first_byte` for the first bytes (server-speaks-first protocols send nothing) and at most
/// `total` overall.
pub(crate) async fn sniff<S: AsyncRead + Unpin>(
    s: &mut S,
    buf: &mut Vec<u8>,
    first_byte: Duration,
    total: Duration,
) -> std::io::Result<Sniffed> {
    let deadline = Instant::now() + total;
    let mut chunk = vec![0u8; 4096];
    loop {
        let wait = if buf.is_empty() {
            first_byte.min(total)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let n = match tokio::time::timeout(wait, s.read(&mut chunk)).await {
            Err(_) => {
                return Ok(match classify(buf) {
                    Parse::Done(x) => x,
                    // Timed out mid-header: decide on what we know (no usable name).
                    Parse::NeedMore if buf.is_empty() => Sniffed::Other,
                    Parse::NeedMore if buf[0] == 0x16 => Sniffed::Tls { sni: None },
                    Parse::NeedMore => Sniffed::Other,
                });
            }
            Ok(r) => r?,
        };
        if n == 0 {
            return Ok(if buf.is_empty() {
                Sniffed::Closed
            } else {
                match classify(buf) {
                    Parse::Done(x) => x,
                    Parse::NeedMore if buf[0] == 0x16 => Sniffed::Tls { sni: None },
                    Parse::NeedMore => Sniffed::Other,
                }
            });
        }
        buf.extend_from_slice(&chunk[..n]);
        match classify(buf) {
            Parse::Done(x) => return Ok(x),
            Parse::NeedMore if buf.len() >= MAX_PEEK => {
                return Ok(if buf[0] == 0x16 {
                    Sniffed::Tls { sni: None }
                } else {
                    Sniffed::Other
                });
            }
            Parse::NeedMore => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    pub(crate) fn client_hello(sni: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let mut conn =
            rustls::ClientConnection::new(Arc::new(cfg), sni.to_string().try_into().unwrap())
                .unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn tls_sni() {
        let hello = client_hello("API.Example.test");
        assert!(
            matches!(parse_tls(&hello), Parse::Done(Sniffed::Tls { sni: Some(ref s) }) if s == "api.example.test")
        );
        // Incomplete hello: need more bytes.
        assert!(matches!(
            classify(&hello[..hello.len() / 2]),
            Parse::NeedMore
        ));
        // IP-literal SNI is not sent by rustls; garbage after the TLS byte → no SNI.
        assert!(matches!(
            classify(&[0x16, 0x03, 0x01, 0x00, 0x05, 9, 9, 9, 9, 9]),
            Parse::Done(Sniffed::Tls { sni: None })
        ));
    }

    #[test]
    fn http_host() {
        let req = b"GET /x HTTP/1.1\r\nHost: Api.Example.test:8080\r\nUser-Agent: t\r\n\r\n";
        assert!(
            matches!(classify(req), Parse::Done(Sniffed::Http { host: Some(ref h) }) if h == "api.example.test")
        );
        assert!(matches!(classify(&req[..20]), Parse::NeedMore));
        let abs = b"GET http://abs.test/ HTTP/1.1\r\n\r\n";
        assert!(
            matches!(classify(abs), Parse::Done(Sniffed::Http { host: Some(ref h) }) if h == "abs.test")
        );
        assert!(matches!(
            classify(b"SSH-2.0-OpenSSH\r\n"),
            Parse::Done(Sniffed::Other)
        ));
        assert!(matches!(
            classify(b"\x00\x01binary"),
            Parse::Done(Sniffed::Other)
        ));
        assert_eq!(host_without_port("[::1]:80"), "::1");
        assert_eq!(host_without_port("example.com."), "example.com");
    }

    #[tokio::test]
    async fn sniff_over_stream_split_hello_and_silence() {
        let hello = client_hello("split.test");
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let h2 = hello.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            a.write_all(&h2[..100]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.write_all(&h2[100..]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let mut buf = Vec::new();
        let s = sniff(
            &mut b,
            &mut buf,
            Duration::from_secs(1),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
        assert_eq!(
            s,
            Sniffed::Tls {
                sni: Some("split.test".into())
            }
        );
        assert_eq!(buf, hello);
        // Server-speaks-first: nothing arrives → Other after the first-byte timeout.
        let (_a, mut b) = tokio::io::duplex(1024);
        let mut buf = Vec::new();
        let t = Instant::now();
        let s = sniff(
            &mut b,
            &mut buf,
            Duration::from_millis(100),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
        assert_eq!(s, Sniffed::Other);
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    mod props {
        //! Property tests: the sniffer reads bytes from an untrusted sandbox, so it must never
        //! panic, must recognise every well-formed ClientHello and request however it is split,
        //! and must keep asking for bytes while a header is incomplete.

        use std::collections::VecDeque;
        use std::pin::Pin;
        use std::task::{Context, Poll};

        use proptest::prelude::*;
        use tokio::io::ReadBuf;

        use super::*;

        /// Yields the given chunks one read at a time, then EOF: the splits the sandbox chose.
        struct Chunks(VecDeque<Vec<u8>>);

        impl AsyncRead for Chunks {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                if let Some(mut chunk) = self.0.pop_front() {
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk[..n]);
                    if n < chunk.len() {
                        self.0.push_front(chunk.split_off(n));
                    }
                }
                Poll::Ready(Ok(()))
            }
        }

        /// Cuts `bytes` at the given points (taken modulo the length).
        fn split(bytes: &[u8], cuts: &[usize]) -> VecDeque<Vec<u8>> {
            let mut at: Vec<usize> = cuts
                .iter()
                .map(|c| c % (bytes.len() + 1))
                .chain([0, bytes.len()])
                .collect();
            at.sort_unstable();
            at.dedup();
            at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
        }

        fn sniff_chunks(chunks: VecDeque<Vec<u8>>) -> (Sniffed, Vec<u8>) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut buf = Vec::new();
                let s = sniff(
                    &mut Chunks(chunks),
                    &mut buf,
                    Duration::from_secs(1),
                    Duration::from_secs(2),
                )
                .await
                .unwrap();
                (s, buf)
            })
        }

        /// DNS names as clients send them: LDH labels, mixed case, a letters-only top label.
        fn hostname() -> impl Strategy<Value = String> {
            (
                prop::collection::vec("[a-zA-Z0-9]([a-zA-Z0-9-]{0,14}[a-zA-Z0-9])?", 1..4),
                "[a-zA-Z]{2,6}",
            )
                .prop_map(|(labels, tld)| format!("{}.{tld}", labels.join(".")))
        }

        fn http_request() -> impl Strategy<Value = (String, Vec<u8>)> {
            (
                prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
                "/[a-zA-Z0-9/._-]{0,30}",
                hostname(),
                prop::option::of(1u16..),
                prop::collection::vec(("X-[A-Za-z]{1,10}", "[ -~]{0,20}"), 0..4),
            )
                .prop_map(|(method, path, host, port, extra)| {
                    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}");
                    if let Some(p) = port {
                        req.push_str(&format!(":{p}"));
                    }
                    req.push_str("\r\n");
                    for (n, v) in extra {
                        req.push_str(&format!("{n}: {v}\r\n"));
                    }
                    req.push_str("\r\n");
                    (host, req.into_bytes())
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
                let _ = classify(&bytes);
                // The same bytes behind a TLS record type or an HTTP method reach each parser.
                let mut tls = vec![0x16];
                tls.extend_from_slice(&bytes);
                let _ = classify(&tls);
                let mut http = b"GET ".to_vec();
                http.extend_from_slice(&bytes);
                let _ = classify(&http);
            }

            #[test]
            fn arbitrary_splits_never_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..4096),
                cuts in prop::collection::vec(any::<usize>(), 0..8),
            ) {
                let (_, buf) = sniff_chunks(split(&bytes, &cuts));
                // What was peeked is exactly the start of what was sent, and bounded.
                prop_assert!(bytes.starts_with(&buf));
                prop_assert!(buf.len() < MAX_PEEK + 4096);
            }

            #[test]
            fn client_hello_sni_is_recognised(
                name in hostname(),
                cuts in prop::collection::vec(any::<usize>(), 0..8),
            ) {
                let hello = client_hello(&name);
                let want = Sniffed::Tls { sni: Some(name.to_ascii_lowercase()) };
                prop_assert!(
                    matches!(classify(&hello), Parse::Done(ref s) if *s == want)
                );
                let (got, buf) = sniff_chunks(split(&hello, &cuts));
                prop_assert_eq!(got, want);
                prop_assert_eq!(buf, hello);
            }

            #[test]
            fn incomplete_client_hello_asks_for_more(name in hostname(), cut in any::<usize>()) {
                let hello = client_hello(&name);
                let k = 1 + cut % (hello.len() - 1);
                prop_assert!(matches!(classify(&hello[..k]), Parse::NeedMore));
            }

            #[test]
            fn http_host_is_recognised(
                (host, req) in http_request(),
                cuts in prop::collection::vec(any::<usize>(), 0..8),
            ) {
                let want = Sniffed::Http { host: Some(host.to_ascii_lowercase()) };
                prop_assert!(matches!(classify(&req), Parse::Done(ref s) if *s == want));
                let (got, buf) = sniff_chunks(split(&req, &cuts));
                prop_assert_eq!(got, want);
                prop_assert_eq!(buf, req);
            }

            #[test]
            fn incomplete_http_request_asks_for_more((_, req) in http_request(), cut in any::<usize>()) {
                let k = 1 + cut % (req.len() - 1);
                prop_assert!(matches!(classify(&req[..k]), Parse::NeedMore));
            }
        }
    }
}
