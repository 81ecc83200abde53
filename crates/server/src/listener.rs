//! The HTTP listener: an accept loop that passes every connection through the [`Gate`]
//! (global and per-address caps, a reserve checked by [`probe`](crate::probe)), and a
//! hyper connection per client with timeouts, so silent, half-sent or idle connections are
//! closed and cannot exhaust the server's descriptors.
//!
//! Timeouts: hyper's HTTP/1 header-read timeout runs whenever a head is awaited, from the
//! connection's start and again after each response (so it also ends idle keep-alive
//! connections); on top, a watchdog per connection closes one whose first request has not
//! begun within the header timeout (HTTP/2 prefaces and protocol sniffing included) and one
//! that has had no request in flight for the idle timeout. A request in flight is never cut
//! by either: a streamed response (command output, watches, `/execute`) runs as long as it
//! runs; hyper's HTTP/2 keep-alive pings find peers that vanished under a stream.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

use crate::limits::{Admission, Gate, Refusal, Resolved, Slot};
use crate::probe::{self, Verdict, Vouch};

/// Back-off after an accept error such as EMFILE (the connection stays in the backlog).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How often refusals are summarised in the log.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);
/// HTTP/2: ping an idle peer this often and drop it if the answer takes longer than
/// [`H2_PING_TIMEOUT`] (a peer gone under a long stream).
const H2_PING_EVERY: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 streams at once on one connection.
const H2_MAX_STREAMS: u32 = 256;

/// Serves `router` on `listener` until `signal` completes; then each connection is asked to
/// finish (idle ones close at once) and given `drain` before it is dropped.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    vouch: Arc<dyn Vouch>,
    limits: Resolved,
    signal: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> io::Result<()> {
    let gate = Gate::new(limits);
    let builder = Arc::new(builder(gate.limits()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut refusals = Refusals::default();
    tokio::pin!(signal);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            _ = &mut signal => break,
        };
        match gate.admit(peer.ip()) {
            Admission::Refused(why) => {
                refusals.note(why, &gate);
                reset(stream);
            }
            Admission::Open(slot) => {
                tokio::spawn(connection(
                    stream,
                    peer,
                    slot,
                    router.clone(),
                    builder.clone(),
                    gate.limits().clone(),
                    stop_rx.clone(),
                    drain,
                ));
            }
            Admission::Reserve(slot) => {
                let probe = gate.start_probe(slot);
                let (router, builder, vouch, limits, stop) = (
                    router.clone(),
                    builder.clone(),
                    vouch.clone(),
                    gate.limits().clone(),
                    stop_rx.clone(),
                );
                tokio::spawn(async move {
                    let mut probe = probe;
                    let head = tokio::select! {
                        h = tokio::time::timeout(limits.probe_timeout, probe::read_head(&stream)) => h.ok().flatten(),
                        _ = &mut probe.evicted => None,
                    };
                    // A complete head no longer waits on the client: it leaves the eviction
                    // queue before its key is looked up (a store read that a flood of new
                    // connections must not be able to cut short). No slot back: evicted
                    // meanwhile, its place is another connection's.
                    let slot = probe.finish();
                    let verdict = match (head, &slot) {
                        (Some((claims, len)), Some(_)) => {
                            match tokio::time::timeout(
                                limits.probe_timeout,
                                probe::qualifies(&claims, &*vouch),
                            )
                            .await
                            {
                                Ok(true) => Verdict::Passed,
                                Ok(false) => Verdict::Refused(len),
                                Err(_) => Verdict::Silent,
                            }
                        }
                        _ => Verdict::Silent,
                    };
                    match (verdict, slot) {
                        (Verdict::Passed, Some(slot)) => {
                            connection(stream, peer, slot, router, builder, limits, stop, drain)
                                .await
                        }
                        (Verdict::Refused(head), _) => {
                            // Take the peeked head off the socket first: closing with unread
                            // data sends a reset, which can discard the answer at the client.
                            // One small write into an empty send buffer; if it does not fit,
                            // the client sees the close alone.
                            let _ = stream.try_read(&mut vec![0; head]);
                            let _ = stream.try_write(probe::REFUSED_RESPONSE);
                            drop(stream);
                        }
                        _ => reset(stream),
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Connections end themselves within `drain`; wait for them so the caller's shutdown of
    // the engine does not race their last responses.
    let deadline = Instant::now() + drain + Duration::from_millis(200);
    while gate.open() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn builder(limits: &Resolved) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING_EVERY)
        .keep_alive_timeout(H2_PING_TIMEOUT)
        .max_concurrent_streams(H2_MAX_STREAMS);
    b
}

/// One admitted client: served until it closes, a timeout ends it, or the server stops.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    router: axum::Router,
    builder: Arc<auto::Builder<TokioExecutor>>,
    limits: Resolved,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    // Streamed responses (command output, /execute lines) are many small writes; with Nagle
    // on, each waits for the client's delayed ACK (~40 ms per round trip).
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY on a client connection");
    }
    let activity = Arc::new(Activity::new());
    let service = Tracked {
        router,
        activity: activity.clone(),
    };
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::trace!(%peer, error = %e, "client connection ended");
            }
        }
        why = watchdog(&activity, &limits) => {
            tracing::debug!(%peer, why, "closing a client connection");
        }
        // (The watch's `Ref` is a lock guard: dropped before the drain awaits.)
        () = async { drop(stop.wait_for(|s| *s).await) } => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(drain, conn).await;
        }
    }
    drop(slot);
}

/// Resolves when the connection should be closed: no first request within the header
/// timeout, or no request in flight for the idle timeout.
async fn watchdog(activity: &Activity, limits: &Resolved) -> &'static str {
    loop {
        let now = activity.elapsed();
        let next = if !activity.started.load(Ordering::Acquire) {
            if now >= limits.header_timeout {
                return "no request within the header timeout";
            }
            limits.header_timeout
        } else if activity.in_flight.load(Ordering::Acquire) == 0 {
            let idle_since = Duration::from_millis(activity.idle_since_ms.load(Ordering::Acquire));
            let due = idle_since + limits.idle_timeout;
            if now >= due {
                return "idle";
            }
            due
        } else {
            // A request is running: look again later (it may finish and leave the
            // connection idle; the close then comes at most a quarter late).
            now + limits.idle_timeout / 4
        };
        tokio::time::sleep(next.saturating_sub(now)).await;
    }
}

/// What the watchdog reads: whether a request ever began, how many are running, and since
/// when none is (milliseconds from the connection's start).
struct Activity {
    start: Instant,
    started: AtomicBool,
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            started: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.store(true, Ordering::Release);
        InFlight(self.clone())
    }
}

/// A request in flight, until its response body is finished or dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        let ms = u64::try_from(a.elapsed().as_millis()).unwrap_or(u64::MAX);
        a.idle_since_ms.store(ms, Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router as a hyper service that counts requests in flight.
#[derive(Clone)]
struct Tracked {
    router: axum::Router,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Tracked {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let guard = self.activity.begin();
        let router = self.router.clone();
        Box::pin(async move {
            let resp = router.oneshot(req.map(Body::new)).await?;
            Ok(resp.map(|body| {
                Body::new(Guarded {
                    body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// A response body that keeps its request counted until hyper has sent (or dropped) it.
struct Guarded {
    body: Body,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Closes a connection with a reset: no FIN handshake, no TIME_WAIT here, nothing buffered.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Accept errors are the process's (EMFILE, ENFILE, ENOBUFS) or the aborted connection's; a
/// short pause lets descriptors free up instead of spinning on a full table.
async fn accept_failed(e: &io::Error) {
    let exhausted = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    if exhausted {
        tracing::warn!(error = %e, "cannot accept connections: out of descriptors or memory; lower --http-max-connections or raise the open-files limit");
        tokio::time::sleep(ACCEPT_BACKOFF).await;
    } else {
        tracing::debug!(error = %e, "accept failed");
    }
}

/// Counts connections refused at accept and says so in the log at most every
/// [`REFUSAL_LOG_EVERY`].
#[derive(Default)]
struct Refusals {
    per_address: u64,
    full: u64,
    logged: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, why: Refusal, gate: &Gate) {
        match why {
            Refusal::PerAddress => self.per_address += 1,
            Refusal::Full => self.full += 1,
        }
        if self.logged.is_some_and(|t| t.elapsed() < REFUSAL_LOG_EVERY) {
            return;
        }
        let l = gate.limits();
        tracing::warn!(
            per_address = self.per_address,
            at_capacity = self.full,
            open = gate.open(),
            max = l.max,
            max_per_address = l.max_per_ip,
            "refusing client connections (--http-max-connections, --http-max-connections-per-ip)"
        );
        self.logged = Some(Instant::now());
        self.per_address = 0;
        self.full = 0;
    }
}
