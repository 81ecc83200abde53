//! The registry client's only way out: a forward proxy on loopback, private to one pull, that
//! every request of `oci-client` goes through (its reqwest client follows redirects and token
//! realms on its own, with no hook to check them). Each connection — the registry, its token
//! service, every redirect target — is checked by [`ConnectPolicy`] on the addresses its name
//! resolves to and made to exactly those addresses, so neither a reference nor a registry's
//! `Location`/`WWW-Authenticate` header can aim the server at loopback or the private network,
//! and a second DNS answer cannot differ from the checked one.
//!
//! HTTPS goes through `CONNECT` (TLS stays end to end between the client and the registry);
//! plain HTTP, only to `--registry-insecure` hosts, is forwarded one request per connection.
//! A random credential keeps other local processes from using the proxy.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::policy::{ConnectPolicy, Refusal, split_authority};

/// Longest request head accepted from the client (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
const USER: &str = "bulkhead";

/// A running guard; the proxy stops when this is dropped.
pub(crate) struct Guard {
    url: String,
    notes: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Guard {
    /// Starts the proxy on an ephemeral loopback port.
    pub(crate) async fn start(
        policy: ConnectPolicy,
        connect_timeout: Duration,
    ) -> std::io::Result<Guard> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let secret = random_hex()?;
        let expected = format!(
            "Basic {}",
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                format!("{USER}:{secret}")
            )
        );
        let notes = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(Shared {
            policy,
            connect_timeout,
            expected,
            notes: notes.clone(),
        });
        let task = tokio::spawn(async move {
            // Connections live in the set: aborting the accept loop aborts them too.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let shared = shared.clone();
                        conns.spawn(async move { shared.serve(stream).await });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Guard {
            url: format!("http://{USER}:{secret}@{addr}"),
            notes,
            task,
        })
    }

    /// The proxy URL, credential included, for both `http_proxy` and `https_proxy`.
    pub(crate) fn proxy_url(&self) -> &str {
        &self.url
    }

    /// What the proxy refused or failed to reach since the last call (for the server log).
    pub(crate) fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

struct Shared {
    policy: ConnectPolicy,
    connect_timeout: Duration,
    expected: String,
    notes: Arc<Mutex<Vec<String>>>,
}

/// One parsed request head.
struct Head {
    method: String,
    target: String,
    version: String,
    /// Header lines, without the proxy's own.
    headers: Vec<(String, String)>,
    authorized: bool,
}

impl Shared {
    fn note(&self, what: String) {
        tracing::info!(target: "bulkhead::registry", "registry pull: {what}");
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    async fn serve(&self, mut client: TcpStream) {
        let (head, rest) = match read_head(&mut client, self.connect_timeout).await {
            Ok(Some(h)) => h,
            _ => return,
        };
        let Some(head) = parse_head(&head, &self.expected) else {
            let _ = reply(&mut client, "400 Bad Request").await;
            return;
        };
        if !head.authorized {
            let _ = reply(&mut client, "407 Proxy Authentication Required").await;
            return;
        }
        let result = if head.method.eq_ignore_ascii_case("CONNECT") {
            self.tunnel(&mut client, &head, &rest).await
        } else {
            self.forward(&mut client, &head, &rest).await
        };
        if let Err(status) = result {
            let _ = reply(&mut client, status).await;
        }
    }

    /// Resolves, checks and connects to the target; refusals and failures are noted and
    /// answered with a bare status (the client learns nothing about what is listening).
    async fn connect(
        &self,
        https: bool,
        authority: &str,
        default_port: u16,
    ) -> Result<TcpStream, &'static str> {
        let Some((host, port)) = split_authority(authority) else {
            self.note(Refusal::BadTarget(authority.to_owned()).to_string());
            return Err("403 Forbidden");
        };
        let port = port.unwrap_or(default_port);
        let addrs = match self.policy.resolve(https, host, port).await {
            Ok(a) => a,
            Err(refusal) => {
                self.note(format!("refused {authority}: {refusal}"));
                return Err("403 Forbidden");
            }
        };
        match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&addrs[..])).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => {
                self.note(format!("cannot connect to {authority} ({addrs:?}): {e}"));
                Err("502 Bad Gateway")
            }
            Err(_) => {
                self.note(format!(
                    "connecting to {authority} timed out after {:?}",
                    self.connect_timeout
                ));
                Err("504 Gateway Timeout")
            }
        }
    }

    async fn tunnel(
        &self,
        client: &mut TcpStream,
        head: &Head,
        rest: &[u8],
    ) -> Result<(), &'static str> {
        let mut upstream = self.connect(true, &head.target, 443).await?;
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
            || upstream.write_all(rest).await.is_err()
        {
            return Ok(());
        }
        let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
        Ok(())
    }

    /// Plain HTTP: the request line rewritten to origin form, `Connection: close` so that the
    /// next request (to whatever host) comes on a new, newly checked connection.
    async fn forward(
        &self,
        client: &mut TcpStream,
        head: &Head,
        rest: &[u8],
    ) -> Result<(), &'static str> {
        let Some(after) = head.target.strip_prefix("http://") else {
            self.note(format!("refused a request for {:?}", head.target));
            return Err("403 Forbidden");
        };
        let (authority, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, "/"),
        };
        if authority.contains('@') {
            self.note(format!("refused a request with user info for {authority}"));
            return Err("403 Forbidden");
        }
        let mut upstream = self.connect(false, authority, 80).await?;
        let mut out = format!("{} {path} {}\r\n", head.method, head.version);
        for (name, value) in &head.headers {
            if name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive") {
                continue;
            }
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str("Connection: close\r\n\r\n");
        if upstream.write_all(out.as_bytes()).await.is_err()
            || upstream.write_all(rest).await.is_err()
        {
            return Err("502 Bad Gateway");
        }
        let _ = tokio::io::copy_bidirectional(client, &mut upstream).await;
        Ok(())
    }
}

/// Reads up to the end of the request head; returns it and whatever followed it.
async fn read_head(
    s: &mut TcpStream,
    timeout: Duration,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = buf[i + 4..].to_vec();
                buf.truncate(i);
                return Ok(String::from_utf8(buf).ok().map(|h| (h, rest)));
            }
            if buf.len() > MAX_HEAD {
                return Ok(None);
            }
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    // The client is ours and sends at once; a slow one is not worth waiting for.
    tokio::time::timeout(timeout.max(Duration::from_secs(5)), read)
        .await
        .unwrap_or(Ok(None))
}

fn parse_head(head: &str, expected_auth: &str) -> Option<Head> {
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target, version) = (first.next()?, first.next()?, first.next()?);
    if first.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let mut headers = Vec::new();
    let mut authorized = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("proxy-authorization") {
            authorized |= ct_eq(value.as_bytes(), expected_auth.as_bytes());
        } else if !name.eq_ignore_ascii_case("proxy-connection") {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
        authorized,
    })
}

/// Constant-time comparison of the proxy credential.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn reply(s: &mut TcpStream, status: &str) -> std::io::Result<()> {
    s.write_all(
        format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    s.shutdown().await
}

fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(hex::encode(b))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::oci::policy::HostPattern;

    async fn roundtrip(guard: &Guard, request: String) -> String {
        let addr = guard.url.rsplit_once('@').unwrap().1;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    fn auth(guard: &Guard) -> String {
        let cred = guard.url.strip_prefix("http://").unwrap();
        let cred = cred.rsplit_once('@').unwrap().0;
        format!(
            "Basic {}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cred)
        )
    }

    /// A listener that counts connections (and answers each with a fixed response).
    async fn canary(response: &'static str) -> (u16, Arc<AtomicUsize>) {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(response.as_bytes()).await;
            }
        });
        (port, hits)
    }

    #[tokio::test]
    async fn only_trusted_or_public_targets_are_reached() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        let (trusted_port, trusted_hits) = canary(ok).await;
        let (other_port, other_hits) = canary(ok).await;
        let policy = ConnectPolicy {
            insecure: vec![HostPattern::parse(&format!("127.0.0.1:{trusted_port}")).unwrap()],
        };
        let guard = Guard::start(policy, Duration::from_secs(2)).await.unwrap();
        let a = auth(&guard);

        // Without the credential: refused before anything else.
        let r = roundtrip(
            &guard,
            format!("GET http://127.0.0.1:{trusted_port}/v2/ HTTP/1.1\r\nHost: x\r\n\r\n"),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 407"), "{r}");

        // The trusted endpoint over plain HTTP.
        let r = roundtrip(
            &guard,
            format!(
                "GET http://127.0.0.1:{trusted_port}/v2/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {a}\r\n\r\n"
            ),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("ok"), "{r}");
        assert_eq!(trusted_hits.load(Ordering::SeqCst), 1);

        // Another loopback port, in every spelling, by HTTP and by CONNECT: never reached.
        for target in [
            format!("GET http://127.0.0.1:{other_port}/internal HTTP/1.1"),
            format!("GET http://2130706433:{other_port}/internal HTTP/1.1"),
            format!("GET http://0177.0.0.1:{other_port}/internal HTTP/1.1"),
            format!("GET http://localhost:{other_port}/internal HTTP/1.1"),
            format!("GET http://[::ffff:127.0.0.1]:{other_port}/internal HTTP/1.1"),
            format!("GET http://0.0.0.0:{other_port}/internal HTTP/1.1"),
            format!("CONNECT 127.0.0.1:{other_port} HTTP/1.1"),
            format!("CONNECT localhost:{other_port} HTTP/1.1"),
            format!("CONNECT [::1]:{other_port} HTTP/1.1"),
            format!("CONNECT 0.0.0.0:{other_port} HTTP/1.1"),
            format!("GET ftp://127.0.0.1:{other_port}/ HTTP/1.1"),
        ] {
            let r = roundtrip(
                &guard,
                format!("{target}\r\nHost: x\r\nProxy-Authorization: {a}\r\n\r\n"),
            )
            .await;
            assert!(r.starts_with("HTTP/1.1 403"), "{target}: {r}");
        }
        assert_eq!(other_hits.load(Ordering::SeqCst), 0);
        // Plain HTTP to a public address is refused too (no DNS needed to decide).
        let r = roundtrip(
            &guard,
            format!("GET http://8.8.8.8/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {a}\r\n\r\n"),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        let notes = guard.take_notes();
        assert!(
            notes.iter().any(|n| n.contains("not a public address")),
            "{notes:?}"
        );
        assert!(notes.iter().any(|n| n.contains("plain HTTP")), "{notes:?}");
    }
}
