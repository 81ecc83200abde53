//! Connection adapters and helpers shared by the plain proxy and the injection path: byte
//! counting, replay of peeked bytes, EOF polling for ipstack streams, the per-connection audit
//! guard, and connecting to an upstream. A leaf: it knows the sandbox context, not the handlers.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::CONNECT_TIMEOUT;
use crate::sandbox::Sandbox;

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

impl AuditGuard {
    /// An allowed connection's record, with both byte counters at zero.
    pub fn allowed(
        sb: Arc<Sandbox>,
        protocol: &'static str,
        host: Option<String>,
        ip: Option<IpAddr>,
        port: u16,
        rule: String,
    ) -> Self {
        Self {
            sb,
            protocol,
            host,
            ip,
            port,
            rule,
            allowed: true,
            out: Arc::new(AtomicU64::new(0)),
            inn: Arc::new(AtomicU64::new(0)),
        }
    }
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
