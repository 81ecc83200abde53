//! Egress latency benchmark (root only): the same local HTTP upstream reached (a) directly from
//! the host and (b) from inside a sandbox network namespace through the TUN link, userspace
//! stack and proxy. Measures per-request latency on a kept-alive connection and per-connection
//! latency (connect + one request), and reports p50/p95/p99 plus proxy/direct ratios.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::NetworkPolicy;
use crate::netlab::{Lab, in_netns, resolve_in_sandbox, unavailable_reason};

#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Timed requests on one kept-alive connection (after a warm-up of 20).
    pub requests: usize,
    /// Timed fresh connections, one request each.
    pub connections: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            requests: 1000,
            connections: 300,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
}

impl Stats {
    pub fn from_samples(mut v: Vec<Duration>) -> Stats {
        v.sort();
        let pick = |q: f64| {
            if v.is_empty() {
                Duration::ZERO
            } else {
                v[(((v.len() - 1) as f64) * q).round() as usize]
            }
        };
        Stats {
            n: v.len(),
            p50: pick(0.50),
            p95: pick(0.95),
            p99: pick(0.99),
        }
    }
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    pub request_direct: Stats,
    pub request_proxy: Stats,
    pub connection_direct: Stats,
    pub connection_proxy: Stats,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::NAN
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "egress proxy latency (µs)            p50       p95       p99      n"
        )?;
        for (label, s) in [
            ("request, kept-alive, direct", self.request_direct),
            ("request, kept-alive, proxy", self.request_proxy),
            ("connect+request, direct", self.connection_direct),
            ("connect+request, proxy", self.connection_proxy),
        ] {
            writeln!(
                f,
                "  {label:<30} {:>9.1} {:>9.1} {:>9.1} {:>6}",
                us(s.p50),
                us(s.p95),
                us(s.p99),
                s.n
            )?;
        }
        for (label, p, d) in [
            (
                "request ratio proxy/direct",
                self.request_proxy,
                self.request_direct,
            ),
            (
                "connection ratio proxy/direct",
                self.connection_proxy,
                self.connection_direct,
            ),
        ] {
            writeln!(
                f,
                "  {label:<30} {:>8.2}x {:>8.2}x {:>8.2}x",
                ratio(p.p50, d.p50),
                ratio(p.p95, d.p95),
                ratio(p.p99, d.p99)
            )?;
        }
        Ok(())
    }
}

async fn request(s: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) -> std::io::Result<()> {
    s.write_all(req).await?;
    buf.clear();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed mid-response",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).map_err(std::io::Error::other)?;
            if !head.starts_with("HTTP/1.1 200") {
                return Err(std::io::Error::other(format!(
                    "unexpected response: {}",
                    head.lines().next().unwrap_or("")
                )));
            }
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| std::io::Error::other("no content-length"))?;
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "closed mid-body",
                    ));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
    }
}

/// Runs the client workload on its own thread (inside `netns` if given) with its own
/// current-thread runtime, so sockets are created in that namespace.
fn client_run(
    netns: Option<PathBuf>,
    target: SocketAddr,
    opts: BenchOptions,
) -> std::io::Result<(Vec<Duration>, Vec<Duration>)> {
    let work = move || -> std::io::Result<(Vec<Duration>, Vec<Duration>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let req = b"GET /bench HTTP/1.1\r\nHost: bench.test\r\n\r\n";
            let mut buf = Vec::with_capacity(4096);
            let mut s = TcpStream::connect(target).await?;
            s.set_nodelay(true)?;
            for _ in 0..20 {
                request(&mut s, req, &mut buf).await?;
            }
            let mut per_request = Vec::with_capacity(opts.requests);
            for _ in 0..opts.requests {
                let t = Instant::now();
                request(&mut s, req, &mut buf).await?;
                per_request.push(t.elapsed());
            }
            drop(s);
            let mut per_conn = Vec::with_capacity(opts.connections);
            for _ in 0..opts.connections {
                let t = Instant::now();
                let mut s = TcpStream::connect(target).await?;
                s.set_nodelay(true)?;
                request(&mut s, req, &mut buf).await?;
                per_conn.push(t.elapsed());
            }
            Ok((per_request, per_conn))
        })
    };
    match netns {
        Some(ns) => in_netns(&ns, work)?,
        None => std::thread::spawn(work)
            .join()
            .map_err(|_| std::io::Error::other("client thread panicked"))?,
    }
}

/// Why the benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Not root, or no `/dev/net/tun` (the reason is [`unavailable_reason`]'s).
    #[error("egress benchmark needs root and /dev/net/tun: {0}")]
    Unavailable(String),
    #[error("lab setup: {0}")]
    Lab(#[source] std::io::Error),
    /// A blocking task panicked or was cancelled.
    #[error("{0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("DNS inside the sandbox: {0}")]
    Dns(#[source] std::io::Error),
    #[error("bench.test did not resolve inside the sandbox")]
    NotResolved,
    #[error("through the proxy: {0}")]
    Proxy(#[source] std::io::Error),
    #[error("direct: {0}")]
    Direct(#[source] std::io::Error),
}

/// Runs the benchmark. Needs root (see [`unavailable_reason`]) and a multi-threaded runtime.
pub async fn run(opts: BenchOptions) -> Result<BenchReport, BenchError> {
    if let Some(why) = unavailable_reason() {
        return Err(BenchError::Unavailable(why));
    }
    let policy = NetworkPolicy {
        allow_out: vec!["bench.test".into()],
        ..Default::default()
    };
    let lab = Lab::start(policy, Default::default())
        .await
        .map_err(BenchError::Lab)?;
    let ns = lab.sandbox.path();
    let fake = {
        let ns = ns.clone();
        tokio::task::spawn_blocking(move || resolve_in_sandbox(&ns, "bench.test"))
            .await
            .map_err(BenchError::Task)?
            .map_err(BenchError::Dns)?
            .ok_or(BenchError::NotResolved)?
    };
    let direct = SocketAddr::from((lab.upstream.addr, 80));
    let proxied = SocketAddr::from((fake, 80));
    let (o1, o2) = (opts.clone(), opts);
    let (req_p, conn_p) = tokio::task::spawn_blocking(move || client_run(Some(ns), proxied, o1))
        .await
        .map_err(BenchError::Task)?
        .map_err(BenchError::Proxy)?;
    let (req_d, conn_d) = tokio::task::spawn_blocking(move || client_run(None, direct, o2))
        .await
        .map_err(BenchError::Task)?
        .map_err(BenchError::Direct)?;
    drop(lab);
    Ok(BenchReport {
        request_direct: Stats::from_samples(req_d),
        request_proxy: Stats::from_samples(req_p),
        connection_direct: Stats::from_samples(conn_d),
        connection_proxy: Stats::from_samples(conn_p),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = Stats::from_samples((1..=100).map(Duration::from_millis).collect());
        assert_eq!(
            (s.n, s.p50, s.p95, s.p99),
            (
                100,
                Duration::from_millis(51),
                Duration::from_millis(95),
                Duration::from_millis(99)
            )
        );
        assert_eq!(Stats::from_samples(vec![]).p99, Duration::ZERO);
    }
}
