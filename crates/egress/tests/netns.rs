//! End-to-end tests as root: a real sandbox network namespace with the TUN link from
//! `open_tun_in_netns`, real clients (curl via `ip netns exec`, std sockets on a thread inside
//! the namespace) and local upstream servers in another namespace (TEST-NET-3 over veth).
//! Gated with `#[requires(Root, Tun)]`: ignored by plain `cargo test`, failed by
//! `--include-ignored` on a host without them (or without iproute2).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bulkhead_egress::netlab::{Lab, in_netns, resolve_in_sandbox, unavailable_reason};
use bulkhead_egress::{AuditEvent, HeaderRule, NetworkPolicy};
use bulkhead_testkit::requires;

/// Fails the test when the lab cannot run here; `#[requires]` checks root and TUN before it,
/// this adds what only the lab knows (iproute2's `ip`).
fn require_lab() {
    bulkhead_testkit::require_host(
        "the egress network lab",
        unavailable_reason().as_slice(),
        "install iproute2 (`apt-get install iproute2`)",
    );
}

fn policy(allow: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

struct CurlOut {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

async fn curl(lab: &Lab, args: &[&str]) -> CurlOut {
    let t = Instant::now();
    let out = lab
        .sandbox
        .command("curl")
        .args(["-sS", "--max-time", "8", "--noproxy", "*"])
        .args(args)
        .output()
        .await
        .expect("run curl");
    CurlOut {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: t.elapsed(),
    }
}

fn fake_ip(lab: &Lab, name: &str) -> Ipv4Addr {
    resolve_in_sandbox(&lab.sandbox.path(), name)
        .unwrap()
        .unwrap_or_else(|| panic!("{name} did not resolve"))
}

/// Connects from inside the sandbox with a plain socket; returns the error kind or Ok.
fn connect_from_sandbox(lab: &Lab, to: SocketAddr) -> (std::io::Result<()>, Duration) {
    in_netns(&lab.sandbox.path(), move || {
        let t = Instant::now();
        let r = TcpStream::connect_timeout(&to, Duration::from_secs(5)).map(|_| ());
        (r, t.elapsed())
    })
    .unwrap()
}

fn brief(events: &[AuditEvent]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {:?} {:?}:{} allowed={} rule={} out={} in={}\n",
                e.protocol, e.host, e.ip, e.port, e.allowed, e.rule, e.bytes_out, e.bytes_in
            )
        })
        .collect()
}

fn has(events: &[AuditEvent], pred: impl Fn(&AuditEvent) -> bool) -> bool {
    events.iter().any(pred)
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_domain_and_wildcard_http_and_https() {
    require_lab();
    let lab = Lab::start(policy(&["api.allowed.test", "*.wild.test"]), HashMap::new())
        .await
        .unwrap();

    let r = curl(&lab, &["http://api.allowed.test/hello"]).await;
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("host=api.allowed.test"), "{}", r.stdout);

    let ca = lab.upstream_ca.to_str().unwrap();
    let r = curl(&lab, &["--cacert", ca, "https://x.wild.test/"]).await;
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("host=x.wild.test"), "{}", r.stdout);
    // Pass-through: the sandbox talks TLS end to end with the upstream (upstream CA verified).
    let r = curl(
        &lab,
        &[
            "--cacert",
            lab.egress_ca.to_str().unwrap(),
            "https://y.wild.test/",
        ],
    )
    .await;
    assert_ne!(
        r.code, 0,
        "pass-through must not be re-signed by the egress CA: {}",
        r.stdout
    );

    let t = Instant::now();
    let events = lab
        .audit_until(Duration::from_secs(10), |ev| {
            has(ev, |e| {
                e.protocol == "tls" && e.host.as_deref() == Some("x.wild.test")
            }) && has(ev, |e| {
                e.protocol == "http" && e.host.as_deref() == Some("api.allowed.test")
            })
        })
        .await;
    eprintln!("audit events complete after {:?}", t.elapsed());
    assert!(
        has(&events, |e| e.protocol == "http"
            && e.allowed
            && e.host.as_deref() == Some("api.allowed.test")
            && e.rule == "allowOut:api.allowed.test"
            && e.bytes_out > 0
            && e.bytes_in > 0
            && e.ip == Some(lab.upstream.addr.into())
            && e.port == 80),
        "{}",
        brief(&events)
    );
    assert!(
        has(&events, |e| e.protocol == "tls"
            && e.allowed
            && e.rule == "allowOut:*.wild.test"
            && e.bytes_in > 0),
        "{}",
        brief(&events)
    );
    assert!(has(&events, |e| e.protocol == "dns"
        && e.allowed
        && e.host.as_deref() == Some("api.allowed.test")));
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_destinations_fail_fast() {
    require_lab();
    let host_veth = lab_host_addr_policy();
    let lab = Lab::start(NetworkPolicy::default(), HashMap::new())
        .await
        .unwrap();
    // Allow the host's own veth address and loopback explicitly: the fixed deny set still wins.
    let host_addr = lab.upstream.host_addr.to_string();
    lab.egress
        .set_policy(
            &lab.sandbox_id,
            policy(&[
                "api.allowed.test",
                &host_addr,
                "127.0.0.1",
                "10.200.0.1",
                host_veth,
                "loop.allowed.test",
            ]),
        )
        .unwrap();

    // Denied name → NXDOMAIN (curl 6), immediately.
    let r = curl(&lab, &["http://denied.test/"]).await;
    assert_eq!(r.code, 6, "{}", r.stderr);
    assert!(r.took < Duration::from_secs(2), "took {:?}", r.took);
    // Allowed name resolving to loopback → NXDOMAIN too.
    let r = curl(&lab, &["http://loop.allowed.test/"]).await;
    assert_eq!(r.code, 6, "{}", r.stderr);

    // Direct IP connect to the test upstream (not allowed) → refused at once.
    let (res, took) = connect_from_sandbox(&lab, SocketAddr::from((lab.upstream.addr, 80)));
    assert_eq!(
        res.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // The host's own address, listed in allowOut → still refused.
    let (res, took) = connect_from_sandbox(&lab, SocketAddr::from((lab.upstream.host_addr, 80)));
    assert_eq!(
        res.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    assert!(took < Duration::from_secs(1));
    // The gateway itself.
    let (res, _) = connect_from_sandbox(&lab, SocketAddr::from((Ipv4Addr::new(10, 200, 0, 1), 22)));
    assert_eq!(
        res.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    // A fake IP that DNS never handed out.
    let (res, _) =
        connect_from_sandbox(&lab, SocketAddr::from((Ipv4Addr::new(198, 18, 200, 1), 80)));
    assert_eq!(
        res.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    // curl to a raw IP: fast failure too.
    let r = curl(&lab, &[&format!("http://{}/", lab.upstream.addr)]).await;
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.took < Duration::from_secs(2));

    let events = lab
        .audit_until(Duration::from_secs(2), |ev| {
            has(ev, |e| e.rule == "unknown-fake-ip")
        })
        .await;
    assert!(
        has(&events, |e| e.protocol == "dns"
            && !e.allowed
            && e.host.as_deref() == Some("denied.test")),
        "{}",
        brief(&events)
    );
    assert!(
        has(&events, |e| !e.allowed
            && e.rule == "fixed-deny:host-address"),
        "{}",
        brief(&events)
    );
    assert!(has(&events, |e| !e.allowed
        && e.ip == Some(lab.upstream.addr.into())
        && e.rule == "default-deny"));
    assert!(has(&events, |e| !e.allowed
        && e.host.as_deref() == Some("loop.allowed.test")
        && e.rule.starts_with("fixed-deny")));
    // Still works for the allowed name.
    let r = curl(&lab, &["http://api.allowed.test/"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// A second host address to list in allowOut (also must stay denied): the first non-loopback
/// IPv4 address of the host, if any.
fn lab_host_addr_policy() -> &'static str {
    let addrs = bulkhead_egress::host_addresses().unwrap();
    let s = addrs
        .iter()
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .map(|a| a.to_string())
        .unwrap_or_else(|| "127.0.0.2".into());
    Box::leak(s.into_boxed_str())
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_other_than_dns_and_ipv6_go_nowhere() {
    require_lab();
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let host_before = (
        read("/proc/sys/net/ipv6/conf/all/disable_ipv6"),
        read("/proc/sys/net/ipv6/conf/default/disable_ipv6"),
    );
    let lab = Lab::start(
        NetworkPolicy {
            allow_internet: true,
            allow_out: vec!["203.0.113.0/24".into()],
            ..Default::default()
        },
        HashMap::new(),
    )
    .await
    .unwrap();
    let sink = lab.upstream.udp(5353).unwrap();
    sink.set_read_timeout(Some(Duration::from_millis(800)))
        .unwrap();
    let target = SocketAddr::from((lab.upstream.addr, 5353));
    in_netns(&lab.sandbox.path(), move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            s.send_to(b"hello", target).unwrap();
            // UDP to the gateway on a non-DNS port, and DNS to a non-gateway address.
            s.send_to(b"ntp?", (Ipv4Addr::new(10, 200, 0, 1), 123))
                .unwrap();
            let _ = s.send_to(b"dns?", SocketAddr::from((target.ip(), 53)));
        }
    })
    .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        sink.recv_from(&mut buf).is_err(),
        "UDP datagram leaked to the upstream"
    );

    // IPv6 is disabled inside the sandbox namespace (and only there), eth0 has no IPv6 address.
    let inside = lab
        .sandbox
        .command("cat")
        .arg("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .output()
        .await
        .unwrap();
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        assert_eq!(String::from_utf8_lossy(&inside.stdout).trim(), "1");
        // The host's own settings are untouched (the sysctl write went to the sandbox's netns).
        let host_after = (
            read("/proc/sys/net/ipv6/conf/all/disable_ipv6"),
            read("/proc/sys/net/ipv6/conf/default/disable_ipv6"),
        );
        assert_eq!(host_before, host_after);
        eprintln!("host disable_ipv6 (all, default) = {host_after:?}");
        let v6 = lab
            .sandbox
            .command("ip")
            .args(["-6", "addr", "show"])
            .output()
            .await
            .unwrap();
        assert!(
            String::from_utf8_lossy(&v6.stdout).trim().is_empty(),
            "{}",
            String::from_utf8_lossy(&v6.stdout)
        );
        let r = lab
            .sandbox
            .command("curl")
            .args(["-sS", "--max-time", "3", "http://[2001:db8::1]/"])
            .output()
            .await
            .unwrap();
        assert_ne!(r.status.code(), Some(0));
    }
    // The link looks as specified.
    let a = lab
        .sandbox
        .command("ip")
        .args(["-4", "addr", "show", "eth0"])
        .output()
        .await
        .unwrap();
    let a = String::from_utf8_lossy(&a.stdout);
    assert!(a.contains("10.200.0.2/24") && a.contains("mtu 1500"), "{a}");
    let r = lab
        .sandbox
        .command("ip")
        .args(["route"])
        .output()
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&r.stdout).contains("default via 10.200.0.1 dev eth0"));
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_and_host_mismatch_refused() {
    require_lab();
    let lab = Lab::start(policy(&["api.allowed.test", "x.wild.test"]), HashMap::new())
        .await
        .unwrap();
    let fake = fake_ip(&lab, "api.allowed.test");
    // HTTP: connect to api.allowed.test's address but ask for another host.
    let r = curl(
        &lab,
        &["-i", "-H", "Host: denied.test", "http://api.allowed.test/"],
    )
    .await;
    assert!(r.stdout.starts_with("HTTP/1.1 403"), "{}", r.stdout);
    assert!(
        r.stdout.contains("denied.test") && r.stdout.contains("mismatch"),
        "{}",
        r.stdout
    );
    // Even towards another allowed name: the address decides, the claimed name must agree.
    let r = curl(
        &lab,
        &["-i", "-H", "Host: x.wild.test", "http://api.allowed.test/"],
    )
    .await;
    assert!(r.stdout.starts_with("HTTP/1.1 403"), "{}", r.stdout);
    // TLS: SNI names a different host than the fake IP's.
    let ca = lab.upstream_ca.to_str().unwrap();
    let resolve = format!("x.wild.test:443:{fake}");
    let r = curl(
        &lab,
        &[
            "--cacert",
            ca,
            "--resolve",
            &resolve,
            "https://x.wild.test/",
        ],
    )
    .await;
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.took < Duration::from_secs(3));
    let events = lab
        .audit_until(Duration::from_secs(2), |ev| {
            has(ev, |e| {
                e.protocol == "tls" && e.rule.starts_with("mismatch")
            })
        })
        .await;
    assert!(
        has(&events, |e| e.protocol == "http"
            && !e.allowed
            && e.rule.starts_with("mismatch")),
        "{}",
        brief(&events)
    );
    assert!(
        has(&events, |e| e.protocol == "tls"
            && !e.allowed
            && e.host.as_deref() == Some("x.wild.test")),
        "{}",
        brief(&events)
    );
    // The upstream never saw any of these requests.
    assert!(lab.seen.lock().unwrap().is_empty());
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_policy_flips_access_for_next_connection() {
    require_lab();
    let lab = Lab::start(policy(&["api.allowed.test"]), HashMap::new())
        .await
        .unwrap();
    let r = curl(&lab, &["http://api.allowed.test/"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let fake = fake_ip(&lab, "api.allowed.test");

    lab.egress
        .set_policy(&lab.sandbox_id, NetworkPolicy::default())
        .unwrap();
    let r = curl(&lab, &["http://api.allowed.test/"]).await;
    assert_eq!(r.code, 6, "DNS must now answer NXDOMAIN: {}", r.stderr);
    // A client that cached the old answer is refused at connect.
    let resolve = format!("api.allowed.test:80:{fake}");
    let r = curl(&lab, &["--resolve", &resolve, "http://api.allowed.test/"]).await;
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert!(r.took < Duration::from_secs(2));

    lab.egress
        .set_policy(&lab.sandbox_id, policy(&["api.allowed.test"]))
        .unwrap();
    let r = curl(&lab, &["http://api.allowed.test/"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        lab.egress.policy(&lab.sandbox_id).unwrap().allow_out,
        vec!["api.allowed.test".to_string()]
    );
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_out_wins_over_deny_out() {
    require_lab();
    let p = NetworkPolicy {
        allow_internet: true,
        allow_out: vec!["api.allowed.test".into()],
        deny_out: vec!["0.0.0.0/0".into()],
        ..Default::default()
    };
    let lab = Lab::start(p, HashMap::new()).await.unwrap();
    let r = curl(&lab, &["http://api.allowed.test/"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Same upstream address, but not named in allowOut: denyOut 0.0.0.0/0 applies.
    let r = curl(&lab, &["http://x.wild.test/"]).await;
    assert_eq!(r.code, 6, "{}", r.stderr);
    // Open internet minus a denied CIDR containing the upstream.
    let p = NetworkPolicy {
        allow_internet: true,
        deny_out: vec![format!("{}/32", lab.upstream.addr)],
        ..Default::default()
    };
    lab.egress.set_policy(&lab.sandbox_id, p).unwrap();
    let r = curl(&lab, &["http://x.wild.test/"]).await;
    assert_eq!(r.code, 6, "{}", r.stderr);
    let p = NetworkPolicy {
        allow_internet: true,
        ..Default::default()
    };
    lab.egress.set_policy(&lab.sandbox_id, p).unwrap();
    let r = curl(&lab, &["http://x.wild.test/"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let events = lab
        .audit_until(Duration::from_secs(3), |ev| {
            has(ev, |e| e.rule == "allowInternet" && e.protocol == "http")
        })
        .await;
    assert!(
        has(&events, |e| !e.allowed && e.rule == "denyOut:0.0.0.0/0"),
        "{}",
        brief(&events)
    );
    assert!(
        has(&events, |e| e.allowed
            && e.rule == "allowInternet"
            && e.protocol == "http"),
        "{}",
        brief(&events)
    );
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "current_thread")]
async fn attach_requires_multi_thread_runtime() {
    require_lab();
    let dir = tempfile::tempdir().unwrap();
    let eg = bulkhead_egress::Egress::new(
        bulkhead_egress::EgressConfig {
            state_dir: dir.path().into(),
            ..Default::default()
        },
        std::sync::Arc::new(bulkhead_egress::netlab::MapSecrets(HashMap::new())),
        std::sync::Arc::new(bulkhead_egress::netlab::ChannelAudit(
            std::sync::Mutex::new(std::sync::mpsc::channel().0),
        )),
    )
    .unwrap();
    let ns = bulkhead_egress::netlab::NetNs::create("rt").unwrap();
    let fd = bulkhead_egress::open_tun_in_netns(&ns.path()).unwrap();
    let err = eg.attach("x", fd, NetworkPolicy::default()).unwrap_err();
    assert!(err.to_string().contains("multi-threaded"), "{err}");
}

fn inject_policy(header_value: &str) -> NetworkPolicy {
    let mut p = policy(&["inject.allowed.test", "api.allowed.test"]);
    p.rules.insert(
        "inject.allowed.test".into(),
        vec![HeaderRule {
            headers: BTreeMap::from([
                ("Authorization".to_string(), header_value.to_string()),
                ("X-Static".to_string(), "static-value".to_string()),
            ]),
        }],
    );
    p.secret_scope = Some(bulkhead_egress::netlab::LAB_SECRET_SCOPE.into());
    p
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_sets_secret_header_upstream() {
    require_lab();
    let secrets = HashMap::from([("tok".to_string(), "s3cr3t-VALUE-42".to_string())]);
    let lab = Lab::start(inject_policy("Bearer ${e2b.secrets.tok}"), secrets)
        .await
        .unwrap();
    let ca = lab.egress_ca.to_str().unwrap().to_string();

    // The sandbox trusts the egress CA; it sends a fake credential which is overridden.
    let r = curl(
        &lab,
        &[
            "--cacert",
            &ca,
            "-H",
            "Authorization: Bearer placeholder",
            "https://inject.allowed.test/x",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("authorization: Bearer s3cr3t-VALUE-42"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("x-static: static-value"), "{}", r.stdout);
    assert!(!r.stdout.contains("placeholder"), "{}", r.stdout);
    // Two requests on one kept-alive connection both get the header.
    let r = curl(
        &lab,
        &[
            "--cacert",
            &ca,
            "https://inject.allowed.test/1",
            "https://inject.allowed.test/2",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.matches("s3cr3t-VALUE-42").count(),
        2,
        "{}",
        r.stdout
    );
    // Request Host must match SNI inside the terminated connection.
    let r = curl(
        &lab,
        &[
            "--cacert",
            &ca,
            "-i",
            "-H",
            "Host: api.allowed.test",
            "https://inject.allowed.test/",
        ],
    )
    .await;
    assert!(r.stdout.starts_with("HTTP/1.1 421"), "{}", r.stdout);
    // Without trusting the egress CA, the sandbox's TLS fails (no silent downgrade).
    let r = curl(&lab, &["https://inject.allowed.test/"]).await;
    assert_ne!(r.code, 0);
    // Non-injection domains are not terminated.
    let r = curl(
        &lab,
        &[
            "--cacert",
            lab.upstream_ca.to_str().unwrap(),
            "https://api.allowed.test/",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stdout.contains("s3cr3t"));

    let events = lab
        .audit_until(Duration::from_secs(5), |ev| {
            has(ev, |e| e.rule.contains("+inject") && e.bytes_in > 0)
        })
        .await;
    assert!(
        has(&events, |e| e.allowed
            && e.rule == "allowOut:inject.allowed.test +inject"
            && e.bytes_out > 0),
        "{}",
        brief(&events)
    );
    assert!(
        has(&events, |e| !e.allowed && e.rule.starts_with("mismatch")),
        "{}",
        brief(&events)
    );
    assert!(
        !format!("{events:?}").contains("s3cr3t"),
        "secret leaked into audit"
    );

    // Unknown secret: clear 502, nothing forwarded, placeholder never sent upstream.
    let before = lab.seen.lock().unwrap().len();
    lab.egress
        .set_policy(
            &lab.sandbox_id,
            inject_policy("Bearer ${e2b.secrets.missing}"),
        )
        .unwrap();
    let r = curl(
        &lab,
        &["--cacert", &ca, "-i", "https://inject.allowed.test/"],
    )
    .await;
    assert!(r.stdout.starts_with("HTTP/1.1 502"), "{}", r.stdout);
    assert!(
        r.stdout.contains("\"missing\"") && r.stdout.contains("/secrets"),
        "{}",
        r.stdout
    );
    assert_eq!(lab.seen.lock().unwrap().len(), before);
    assert!(!lab.seen.lock().unwrap().iter().any(|s| s.contains("${e2b")));

    // The same name in another team's policy (or in one with no team) is just as unknown:
    // the lab's value never reaches the upstream.
    for scope in [Some("another-team".to_string()), None] {
        let mut p = inject_policy("Bearer ${e2b.secrets.tok}");
        p.secret_scope = scope;
        lab.egress.set_policy(&lab.sandbox_id, p).unwrap();
        let r = curl(
            &lab,
            &["--cacert", &ca, "-i", "https://inject.allowed.test/"],
        )
        .await;
        assert!(r.stdout.starts_with("HTTP/1.1 502"), "{}", r.stdout);
        assert!(r.stdout.contains("\"tok\""), "{}", r.stdout);
        assert_eq!(lab.seen.lock().unwrap().len(), before);
        assert!(!r.stdout.contains("s3cr3t"));
    }
}

#[requires(Root, Tun)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_closes_connections_and_link() {
    require_lab();
    let lab = Lab::start(policy(&["api.allowed.test"]), HashMap::new())
        .await
        .unwrap();
    let fake = fake_ip(&lab, "api.allowed.test");
    let stream = in_netns(&lab.sandbox.path(), move || {
        TcpStream::connect((fake, 80)).unwrap()
    })
    .unwrap();
    let mut s = stream;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    lab.egress.detach(&lab.sandbox_id);
    assert!(lab.egress.attached().is_empty());
    // The link disappears with the TUN fd, and the open connection is dead.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = lab
            .sandbox
            .command("ip")
            .args(["link", "show", "eth0"])
            .output()
            .await
            .unwrap();
        if !out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "eth0 still present after detach");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let w = s.write_all(b"GET / HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n");
    let r = s.read(&mut buf);
    assert!(
        w.is_err() || !matches!(r, Ok(n) if n > 0),
        "connection still alive after detach"
    );
    let events = lab
        .audit_until(Duration::from_secs(3), |ev| {
            has(ev, |e| e.protocol == "http" && e.allowed)
        })
        .await;
    assert!(
        has(&events, |e| e.protocol == "http"
            && e.allowed
            && e.bytes_in > 0),
        "{}",
        brief(&events)
    );
}
