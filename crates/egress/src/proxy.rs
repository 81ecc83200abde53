//! Per-connection proxy: learn the destination name (fake IP, SNI, Host), refuse mismatches,
//! evaluate the policy, resolve and connect ourselves, splice with byte counts, audit once.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::conn::{AuditGuard, Counted, EofPoll, Prefixed, connect_any};
use crate::fakeip::is_fake;
use crate::inject;
use crate::policy::NameCheck;
use crate::sandbox::Sandbox;
use crate::sniff::{Sniffed, sniff};

/// How long to wait for the client's first bytes before treating the protocol as
/// server-speaks-first (SSH, SMTP...) and deciding on the destination alone.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_millis(300);
const SNIFF_TIMEOUT: Duration = Duration::from_secs(5);

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

    let mut guard = AuditGuard::allowed(
        sb.clone(),
        protocol,
        host.clone(),
        addrs.first().copied(),
        port,
        verdict.rule.clone(),
    );

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
