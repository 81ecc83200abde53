//! The HTTP listener's connection limits on loopback, without root: silent, half-sent and idle
//! connections are closed after their timeouts, a streamed response is not, the per-address
//! cap and the reserve hold (only `/health`, a valid key or a running sandbox get the last
//! slots), and a flood of silent connections cannot keep the reserve.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bulkhead_server::{ConnectionLimits, ResolvedLimits, Vouch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

const HEADER: Duration = Duration::from_millis(600);
const IDLE: Duration = Duration::from_millis(900);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(700);
const LONG: Duration = Duration::from_secs(8);
/// The reserve's check gives a head this long (`PROBE_TIMEOUT`, below the header timeout).
const PROBE: Duration = Duration::from_secs(2);

struct Fake;

impl Vouch for Fake {
    fn api_key<'a>(&'a self, key: &'a str) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move { key == "good-key" })
    }
    fn live_sandbox(&self, id: &str) -> bool {
        id == "livesandbox"
    }
}

fn router() -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/sandboxes", get(|| async { "[]" }))
        .route(
            "/stream",
            // A chunk every 150 ms for 3 s: far longer than both timeouts.
            get(|| async {
                let chunks = futures::stream::unfold(0usize, |i| async move {
                    if i == 20 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    Some((Ok::<_, std::io::Error>(format!("chunk {i}\n")), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(5), self.done)
            .await
            .expect("the listener stops within its drain time")
            .unwrap()
            .unwrap();
    }
}

fn limits(max: usize, per_ip: usize, reserved: usize) -> ResolvedLimits {
    ConnectionLimits {
        max_connections: Some(max),
        max_per_ip: per_ip,
        reserved,
        header_timeout: HEADER,
        idle_timeout: IDLE,
    }
    .resolve(0, 0)
}

/// Limits whose timeouts outlast a test that needs connections held.
fn holding(max: usize, per_ip: usize, reserved: usize) -> ResolvedLimits {
    ConnectionLimits {
        max_connections: Some(max),
        max_per_ip: per_ip,
        reserved,
        header_timeout: LONG,
        idle_timeout: LONG,
    }
    .resolve(0, 0)
}

async fn start(limits: ResolvedLimits) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let done = tokio::spawn(bulkhead_server::serve(
        listener,
        router(),
        Arc::new(Fake),
        limits,
        async move {
            let _ = rx.await;
        },
        Duration::from_millis(500),
    ));
    Running {
        addr,
        stop: Some(tx),
        done,
    }
}

/// A connection from `127.0.0.{from}`.
async fn connect_from(addr: SocketAddr, from: u8) -> TcpStream {
    try_connect_from(addr, from).await.unwrap()
}

/// [`connect_from`], keeping a reset: loopback completes the handshake before the server's
/// accept, and a connection refused at accept can be reset before the connect is seen done.
async fn try_connect_from(addr: SocketAddr, from: u8) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, from)),
        0,
    ))
    .unwrap();
    s.connect(addr).await
}

/// How long until the server closes `s` (FIN or reset), reading and discarding what it sends;
/// `None` if it is still open after `limit`.
async fn closed_after(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit.saturating_sub(t.elapsed()), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends `head` and reads the whole answer (the server closes or the body ends).
async fn request(s: &mut TcpStream, head: &str) -> String {
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => {
                out.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&out);
                // Responses here are small with a content-length: stop at their end.
                if let Some((h, body)) = text.split_once("\r\n\r\n")
                    && let Some(len) = h.lines().find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    && body.len() >= len.trim().parse::<usize>().unwrap()
                {
                    break;
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_half_sent_and_idle_connections_are_closed_in_time() {
    let srv = start(limits(1000, 0, 16)).await;
    let mut silent = connect_from(srv.addr, 1).await;
    let mut half = connect_from(srv.addr, 1).await;
    half.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    // A slow head: one header line at a time, each well within the timeout.
    let mut slow = connect_from(srv.addr, 1).await;
    let mut idle = connect_from(srv.addr, 1).await;
    let answer = request(&mut idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let slow_writer = tokio::spawn(async move {
        for _ in 0..10 {
            if slow.write_all(b"x-a: b\r\n").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        slow
    });
    let limit = HEADER + SLACK;
    for (name, s) in [
        ("silent", &mut silent),
        ("half-sent", &mut half),
        ("idle keep-alive", &mut idle),
    ] {
        let t = closed_after(s, limit + SLACK)
            .await
            .unwrap_or_else(|| panic!("the {name} connection is still open"));
        assert!(t <= limit, "the {name} connection was closed after {t:?}");
    }
    let mut slow = slow_writer.await.unwrap();
    assert!(
        closed_after(&mut slow, Duration::from_millis(100))
            .await
            .is_some(),
        "a head trickling in is closed at the header timeout"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_outlives_both_timeouts() {
    let srv = start(limits(1000, 0, 16)).await;
    let mut s = connect_from(srv.addr, 1).await;
    let t = Instant::now();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    let mut buf = [0u8; 4096];
    while !body.contains("0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("chunks keep coming")
            .unwrap();
        assert!(n > 0, "the stream was cut after {:?}: {body}", t.elapsed());
        body.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(body.contains("chunk 19"), "{body}");
    assert!(
        t.elapsed() > HEADER + IDLE,
        "the stream ran past both timeouts"
    );
    // Afterwards the connection is idle again and closed like any other.
    assert!(closed_after(&mut s, HEADER + IDLE + SLACK).await.is_some());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_more_than_its_share() {
    let srv = start(holding(1000, 4, 16)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from(srv.addr, 5).await);
    }
    // Refused at accept: reset at once, long before any timeout.
    let t = match try_connect_from(srv.addr, 5).await {
        Ok(mut fifth) => closed_after(&mut fifth, HEADER)
            .await
            .expect("the connection over the per-address cap is closed"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Duration::ZERO,
        Err(e) => panic!("connect: {e}"),
    };
    assert!(t < HEADER / 2, "closed after {t:?}");
    // Another address is served while the first is at its cap.
    let mut other = connect_from(srv.addr, 6).await;
    let answer = request(&mut other, "GET /sandboxes HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The held ones still count (no request yet, so they are open until the header timeout).
    for s in &mut held {
        assert!(closed_after(s, Duration::from_millis(50)).await.is_none());
    }
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut again = connect_from(srv.addr, 5).await;
    let answer = request(&mut again, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_serves_health_keys_and_sandboxes_only() {
    // 64 slots, the last 16 reserved; no per-address cap.
    let srv = start(holding(64, 0, 16)).await;
    let addr = srv.addr;
    let mut flood = Vec::new();
    for i in 0..48 {
        flood.push(connect_from(addr, 10 + (i % 8) as u8).await);
    }
    // Give the accept loop time to count them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ask = |head: &'static str| async move {
        let mut s = connect_from(addr, 2).await;
        request(&mut s, head).await
    };
    let health = ask("GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let keyed = ask("GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: good-key\r\n\r\n").await;
    assert!(keyed.starts_with("HTTP/1.1 200"), "{keyed}");
    let bearer =
        ask("GET /sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good-key\r\n\r\n").await;
    assert!(bearer.starts_with("HTTP/1.1 200"), "{bearer}");
    // (Not /health, which the reserve admits by itself: the host alone must vouch.)
    let sandbox = ask("GET /sandboxes HTTP/1.1\r\nHost: 49983-livesandbox.localhost\r\n\r\n").await;
    assert!(sandbox.starts_with("HTTP/1.1 200"), "{sandbox}");
    let by_header = ask(
        "GET /sandboxes HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: livesandbox\r\nE2b-Sandbox-Port: 49983\r\n\r\n",
    )
    .await;
    assert!(by_header.starts_with("HTTP/1.1 200"), "{by_header}");
    // Without a key, with a wrong one or for a sandbox that is not running: E2B's error shape.
    for head in [
        "GET /sandboxes HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: bad\r\n\r\n",
        "GET / HTTP/1.1\r\nE2b-Sandbox-Id: gone\r\nE2b-Sandbox-Port: 49983\r\n\r\n",
    ] {
        let answer = ask(head).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{head:?}: {answer}");
        assert!(answer.contains("{\"code\":503,"), "{answer}");
    }
    // A silent connection in the reserve is closed after the probe's deadline, well before
    // the header timeout would close it in the open slots.
    let mut silent = connect_from(addr, 3).await;
    let t = closed_after(&mut silent, PROBE + SLACK)
        .await
        .expect("a silent reserve connection is closed after the probe's deadline");
    assert!(t <= PROBE + SLACK, "closed after {t:?}");
    // The open slots are still held by the flood (this all ran within their timeout).
    for s in &mut flood {
        assert!(closed_after(s, Duration::from_millis(1)).await.is_none());
    }
    drop(flood);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_hold_the_reserve() {
    // Open slots full; then 64 silent connections hit the reserve (16 slots, 4 probed at once)
    // at once: the first 16 get their grace, the rest are refused. Past the grace, /health gets
    // in at once, evicting the oldest, and the silent ones are cut back to what is probed.
    let srv = start(holding(64, 0, 16)).await;
    let mut flood = Vec::new();
    for i in 0..48 {
        flood.push(connect_from(srv.addr, 10 + (i % 8) as u8).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut reserve_flood = Vec::new();
    for i in 0..64 {
        // (A connection refused while the reserve is full may be reset before its connect
        // is seen done: closed, as the test wants.)
        if let Ok(s) = try_connect_from(srv.addr, 30 + (i % 8) as u8).await {
            reserve_flood.push(s);
        }
    }
    // Past the probes' grace (100 ms).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t = Instant::now();
    let mut s = connect_from(srv.addr, 2).await;
    let health = request(&mut s, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(t.elapsed() < PROBE, "/health took {:?}", t.elapsed());
    // All but the newest few of the silent ones were already closed.
    let mut open = 0;
    for s in &mut reserve_flood {
        if closed_after(s, Duration::from_millis(5)).await.is_none() {
            open += 1;
        }
    }
    // At most the 4 being probed (a quarter of the reserve), plus a few whose eviction is
    // still on its way; without eviction all 16 reserve slots would stay held.
    assert!(
        open <= 8,
        "{open} silent connections still hold reserve slots"
    );
    drop(flood);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_closes_idle_connections_and_returns() {
    let srv = start(limits(1000, 0, 16)).await;
    let mut s = connect_from(srv.addr, 1).await;
    let answer = request(&mut s, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let t = Instant::now();
    srv.stop().await;
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stop took {:?}",
        t.elapsed()
    );
    assert!(
        closed_after(&mut s, Duration::from_millis(200))
            .await
            .is_some()
    );
}
