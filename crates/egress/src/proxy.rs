//! Per-connection proxy: learn the destination name (fake IP, SNI, Host), refuse mismatches,
//! evaluate the policy, resolve and connect ourselves, splice with byte counts, audit once.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::CONNECT_TIMEOUT;
use crate::dns::is_fake;
use crate::inject;
use crate::policy::NameCheck;
use crate::sniff::{Sniffed, sniff};
use crate::stack::Sandbox;

/// How long to wait for the client's first bytes before treating the protocol as
/// server-speaks-first (SSH, SMTP...) and deciding on the destination alone.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_millis(300);
const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);

/// The wrappers below only change reading; writes go straight to the inner stream.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                b: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, b)
            }
            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }
            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
        }
    };
}

/// Counts bytes read through it.
pub(crate) struct Counted<S> {
    inner: S,
    count: Arc<AtomicU64>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, count: Arc<AtomicU64>) -> Self {
        Self { inner, count }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

write_through!(Counted);

/// Replays already-peeked bytes before reading from the inner stream.
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

write_through!(Prefixed);

/// Emits the connection's audit event when dropped (normal end, error, or detach), so every
/// allowed connection is recorded exactly once with the bytes that actually flowed.
pub(crate) struct AuditGuard {
    sb: Arc<Sandbox>,
    protocol: &'static str,
    host: Option<String>,
    pub ip: Option<IpAddr>,
    port: u16,
    pub rule: String,
    pub allowed: bool,
    pub out: Arc<AtomicU64>,
    pub inn: Arc<AtomicU64>,
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        self.sb.audit(
            self.protocol,
            self.host.take(),
            self.ip,
            self.port,
            self.allowed,
            std::mem::take(&mut self.rule),
            self.out.load(Ordering::Relaxed),
            self.inn.load(Ordering::Relaxed),
        );
    }
}

/// Tries each address in turn within one overall deadline.
pub(crate) async fn connect_any(addrs: &[IpAddr], port: u16) -> io::Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no usable address");
    for ip in addrs {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, TcpStream::connect(SocketAddr::new(*ip, port))).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect to {ip}:{port} timed out"),
                )
            }
        }
    }
    Err(last)
}

fn forbidden_body(host: Option<&str>, reason: &str) -> String {
    let host = host.unwrap_or("this destination");
    format!(
        "Bulkhead egress policy: access to {host} is denied ({reason}).\n\
         Allow it in the sandbox's network policy (network.allowOut) to reach it.\n"
    )
}

/// Refuses a connection after peeking: HTTP gets a 403 naming host and reason; everything else
/// is closed at once.
async fn refuse<S: AsyncWrite + Unpin>(
    client: &mut S,
    sniffed: &Sniffed,
    host: Option<&str>,
    reason: &str,
) {
    if let Sniffed::Http { .. } = sniffed {
        let body = forbidden_body(host, reason);
        let resp = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Bulkhead-Egress: denied\r\n\r\n{body}",
            body.len()
        );
        let _ =
            tokio::time::timeout(Duration::from_secs(2), client.write_all(resp.as_bytes())).await;
    }
    let _ = tokio::time::timeout(Duration::from_millis(300), client.shutdown()).await;
}

pub(crate) async fn handle_tcp(
    sb: Arc<Sandbox>,
    tcp: ipstack::IpStackTcpStream,
    cancel: CancellationToken,
) {
    let dst = tcp.peer_addr();
    let mut client = EofPoll::new(tcp);
    let port = dst.port();
    let fake_name = if is_fake(dst.ip()) {
        let IpAddr::V4(v4) = dst.ip() else { return };
        match sb.fakes.lock().expect("fake pool").lookup(v4) {
            Some(n) => Some(n),
            // The SYN filter refuses (and audits) unknown fake IPs; nothing to do here.
            None => return,
        }
    } else {
        None
    };

    let mut buf = Vec::with_capacity(4096);
    let Ok(sniffed) = sniff(&mut client, &mut buf, FIRST_BYTE_TIMEOUT, SNIFF_TIMEOUT).await else {
        return;
    };
    if sniffed == Sniffed::Closed {
        return;
    }
    let protocol = sniffed.protocol();
    let seen = sniffed.name().map(str::to_string);
    let policy = sb.policy();
    let deny = sb.shared.deny.get();
    let allow_private = sb.shared.allow_private;

    if let (Some(f), Some(s)) = (&fake_name, &seen)
        && f != s
    {
        let reason = format!("mismatch: connection to {f} names {s} in {protocol}");
        sb.audit(
            protocol,
            Some(s.clone()),
            None,
            port,
            false,
            reason.clone(),
            0,
            0,
        );
        refuse(&mut client, &sniffed, Some(s), &reason).await;
        return;
    }

    // Decide and pick the addresses we will connect to.
    let (host, verdict, addrs) = match &fake_name {
        Some(name) => {
            let addrs = match policy.check_name(name) {
                NameCheck::Denied(_) => Vec::new(),
                _ => sb.shared.resolve(name).await,
            };
            let (v, ok) = policy.decide_resolved(name, &addrs, &deny, allow_private);
            (Some(name.clone()), v, ok)
        }
        None => {
            let v = policy.check_ip(dst.ip(), &deny, allow_private);
            let ok = if v.allowed {
                vec![dst.ip()]
            } else {
                Vec::new()
            };
            (seen.clone(), v, ok)
        }
    };
    if !verdict.allowed {
        let ip = (!is_fake(dst.ip())).then_some(dst.ip());
        sb.audit(
            protocol,
            host.clone(),
            ip,
            port,
            false,
            verdict.rule.clone(),
            0,
            0,
        );
        refuse(&mut client, &sniffed, host.as_deref(), &verdict.rule).await;
        return;
    }

    let mut guard = AuditGuard {
        sb: sb.clone(),
        protocol,
        host: host.clone(),
        ip: addrs.first().copied(),
        port,
        rule: verdict.rule.clone(),
        allowed: true,
        out: Arc::new(AtomicU64::new(0)),
        inn: Arc::new(AtomicU64::new(0)),
    };

    // Injection domains: terminate TLS and rewrite headers (only names learned via our DNS).
    if let (Some(name), Sniffed::Tls { .. }) = (&fake_name, &sniffed)
        && policy.header_rules(name).is_some()
    {
        guard.rule = format!("{} +inject", verdict.rule);
        let client = Counted::new(Prefixed::new(buf, client), guard.out.clone());
        inject::serve(sb.clone(), client, name.clone(), port, addrs, guard, cancel).await;
        return;
    }

    let mut upstream = match connect_any(&addrs, port).await {
        Ok(s) => s,
        Err(e) => {
            guard.rule = format!("{}; upstream connect failed: {e}", verdict.rule);
            let _ = tokio::time::timeout(Duration::from_millis(300), client.shutdown()).await;
            return;
        }
    };
    if let Ok(peer) = upstream.peer_addr() {
        guard.ip = Some(peer.ip());
    }
    guard.out.fetch_add(buf.len() as u64, Ordering::Relaxed);
    if upstream.write_all(&buf).await.is_err() {
        return;
    }
    let mut client = Counted::new(client, guard.out.clone());
    let mut upstream = Counted::new(upstream, guard.inn.clone());
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    drop(guard);
}

/// ipstack 1.0 does not wake a pending read when the sandbox closes the connection (FIN, then
/// the final ACK moves it to Closed without notifying the reader), so a blocked read would only
/// notice at the idle timeout. While a read is pending we re-poll on a short tick; the stream
/// then reports EOF on its own (its `poll_read` checks for the Closed state first).
pub(crate) struct EofPoll<S> {
    inner: S,
    tick: Pin<Box<tokio::time::Sleep>>,
}

const EOF_TICK: Duration = Duration::from_millis(100);

impl<S> EofPoll<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            tick: Box::pin(tokio::time::sleep(EOF_TICK)),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for EofPoll<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Pending => {
                if this.tick.as_mut().poll(cx).is_ready() {
                    this.tick
                        .as_mut()
                        .reset(tokio::time::Instant::now() + EOF_TICK);
                    let _ = this.tick.as_mut().poll(cx);
                }
                Poll::Pending
            }
            ready => ready,
        }
    }
}

write_through!(EofPoll);
