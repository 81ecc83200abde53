//! A throwaway network lab for the integration tests and the benchmark (root only): a sandbox
//! network namespace wired to an [`Egress`] exactly as the jail driver does it, and an
//! "upstream" namespace reached over a veth pair in TEST-NET-3 (203.0.113.0/26, a /30 per lab)
//! running local HTTP and HTTPS test servers. Names reach the upstream only through the egress
//! `resolve_overrides` map, never by weakening the deny set. Everything is removed on drop.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nix::sched::{CloneFlags, setns};

use crate::{AuditEvent, AuditSink, Egress, EgressConfig, NetworkPolicy, SecretSource};

/// Why the lab cannot run here (not root, no TUN, no `ip`), or `None` if it can.
pub fn unavailable_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some(
            "not running as root (network namespaces and TUN need CAP_NET_ADMIN/CAP_SYS_ADMIN)"
                .into(),
        );
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("iproute2 `ip` is not installed".into()),
    }
}

fn ip_cmd(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A named network namespace (`ip netns add`), deleted on drop, with an optional
/// `/etc/netns/<name>/resolv.conf` that `ip netns exec` bind-mounts over /etc/resolv.conf.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn create(tag: &str) -> std::io::Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("bheg-{}-{n}-{tag}", std::process::id());
        ip_cmd(&["netns", "add", &name])?;
        Ok(Self { name })
    }
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }
    pub fn set_nameserver(&self, ns: Ipv4Addr) -> std::io::Result<()> {
        let dir = PathBuf::from(format!("/etc/netns/{}", self.name));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {ns}\noptions timeout:2 attempts:1\n"),
        )
    }
    /// `ip netns exec <ns> <program> <args>`.
    pub fn command(&self, program: &str) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c.kill_on_drop(true);
        c
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip_cmd(&["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.name));
    }
}

/// Runs `f` on a fresh thread inside the namespace at `ns_path`; sockets it creates stay in
/// that namespace when handed back.
pub fn in_netns<T: Send + 'static>(
    ns_path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let ns = std::fs::File::open(ns_path)?;
    std::thread::spawn(move || -> std::io::Result<T> {
        setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        Ok(f())
    })
    .join()
    .map_err(|_| std::io::Error::other("netns thread panicked"))?
}

/// Asks the sandbox's DNS (GATEWAY:53) for `name`'s A record from inside `ns_path`.
pub fn resolve_in_sandbox(ns_path: &Path, name: &str) -> std::io::Result<Option<Ipv4Addr>> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let mut m = Message::new(7, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.queries.push(Query::query(
        Name::from_ascii(format!("{name}.")).map_err(std::io::Error::other)?,
        RecordType::A,
    ));
    let q = m.to_vec().map_err(std::io::Error::other)?;
    in_netns(ns_path, move || -> std::io::Result<Option<Ipv4Addr>> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.send_to(&q, (crate::GATEWAY_ADDR, 53))?;
        let mut buf = [0u8; 1500];
        let n = s.recv(&mut buf)?;
        let r = Message::from_vec(&buf[..n]).map_err(std::io::Error::other)?;
        Ok(r.answers.iter().find_map(|a| match &a.data {
            RData::A(a) => Some(a.0),
            _ => None,
        }))
    })?
}

/// The upstream side: its own namespace, a veth pair with a /30 from 203.0.113.0/26.
pub struct UpstreamNet {
    pub ns: NetNs,
    /// Our end of the veth (a host address, hence in the deny set).
    pub host_addr: Ipv4Addr,
    /// The upstream servers' address.
    pub addr: Ipv4Addr,
}

impl UpstreamNet {
    pub fn create() -> std::io::Result<Self> {
        let ns = NetNs::create("up")?;
        // A /30 per lab so concurrent labs (parallel tests) never share a subnet; consecutive
        // slots from their own counter, so up to 16 labs at once never collide. Only the first
        // quarter of TEST-NET-3: our machines sit in TEST-NET-1 (eth0, gateway) and resolve
        // public names to 203.0.113.80 (a TLS-inspecting gateway) that a lab route must not
        // shadow; the SDK suites' lab uses TEST-NET-2.
        static SLOT: AtomicU32 = AtomicU32::new(0);
        let slot = (SLOT.fetch_add(1, Ordering::SeqCst) + std::process::id()) % 16;
        let base = u32::from(Ipv4Addr::new(203, 0, 113, 0)) + slot * 4;
        let host_addr = Ipv4Addr::from(base + 1);
        let addr = Ipv4Addr::from(base + 2);
        let host_if = format!("bhe{}h", slot + 100 * (std::process::id() % 100));
        let peer_if = "up0";
        ip_cmd(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", peer_if, "netns", &ns.name,
        ])?;
        ip_cmd(&["addr", "add", &format!("{host_addr}/30"), "dev", &host_if])?;
        ip_cmd(&["link", "set", &host_if, "up"])?;
        ip_cmd(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{addr}/30"),
            "dev",
            peer_if,
        ])?;
        ip_cmd(&["-n", &ns.name, "link", "set", peer_if, "up"])?;
        ip_cmd(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        // Deleting the namespace (NetNs::drop) deletes the veth pair with it.
        Ok(Self {
            ns,
            host_addr,
            addr,
        })
    }

    pub fn listen(&self, port: u16) -> std::io::Result<tokio::net::TcpListener> {
        let addr = SocketAddr::new(IpAddr::V4(self.addr), port);
        let l = in_netns(&self.ns.path(), move || std::net::TcpListener::bind(addr))??;
        l.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(l)
    }

    pub fn udp(&self, port: u16) -> std::io::Result<std::net::UdpSocket> {
        let addr = SocketAddr::new(IpAddr::V4(self.addr), port);
        in_netns(&self.ns.path(), move || std::net::UdpSocket::bind(addr))?
    }
}

/// What the echo servers saw: one entry per request, headers as `name: value` lines.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// An HTTP/1.1 server that answers every request with `host=<Host>` plus the request headers
/// (so tests can see injected values), optionally over TLS.
pub fn spawn_echo_server(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    seen: Seen,
) {
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                break;
            };
            let _ = tcp.set_nodelay(true);
            let (tls, seen) = (tls.clone(), seen.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let mut text = format!(
                            "host={}\n",
                            req.headers()
                                .get("host")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                        );
                        for (k, v) in req.headers() {
                            text.push_str(&format!("{k}: {}\n", v.to_str().unwrap_or("<binary>")));
                        }
                        seen.lock().unwrap().push(text.clone());
                        let _ = req.into_body().collect().await;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(text))))
                    }
                });
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(cfg) => {
                        if let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                            let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
}

/// A throwaway CA and a server config with a leaf for `names`, for the upstream HTTPS server.
pub fn test_tls(names: &[&str]) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress test upstream CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .expect("server config");
    (ca_cert.pem(), Arc::new(cfg))
}

/// Audit sink backed by a channel.
pub struct ChannelAudit(pub Mutex<mpsc::Sender<AuditEvent>>);
impl AuditSink for ChannelAudit {
    fn record(&self, event: AuditEvent) {
        let _ = self.0.lock().expect("audit lock").send(event);
    }
}

/// The secret scope (team) a lab's secrets belong to; a policy must name it to use them.
pub const LAB_SECRET_SCOPE: &str = "lab-team";

/// Secret source backed by a map (secret name → value) of [`LAB_SECRET_SCOPE`]'s secrets;
/// every other scope has none.
pub struct MapSecrets(pub HashMap<String, String>);
#[async_trait::async_trait]
impl SecretSource for MapSecrets {
    async fn resolve(&self, scope: &str, reference: &str) -> Option<String> {
        if scope != LAB_SECRET_SCOPE {
            return None;
        }
        self.0.get(reference).cloned()
    }
}

/// Names every lab maps to its upstream (through `resolve_overrides`).
pub const LAB_NAMES: &[&str] = &[
    "api.allowed.test",
    "x.wild.test",
    "y.wild.test",
    "denied.test",
    "inject.allowed.test",
    "bench.test",
];
/// Allowed by name in tests but resolving to loopback: must stay unreachable.
pub const LOOPBACK_NAME: &str = "loop.allowed.test";

/// Everything wired: upstream servers on :80 (HTTP) and :443 (HTTPS), an Egress with the lab's
/// overrides, and a sandbox namespace attached as `sandbox_id`.
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub upstream: UpstreamNet,
    pub sandbox: NetNs,
    pub egress: Arc<Egress>,
    pub audit: mpsc::Receiver<AuditEvent>,
    pub seen: Seen,
    /// PEM file of the upstream test CA (for curl --cacert on pass-through HTTPS).
    pub upstream_ca: PathBuf,
    /// PEM file of the egress CA (for curl --cacert on injection domains).
    pub egress_ca: PathBuf,
    pub sandbox_id: String,
}

impl Lab {
    pub async fn start(
        policy: NetworkPolicy,
        secrets: HashMap<String, String>,
    ) -> std::io::Result<Lab> {
        let dir = tempfile::tempdir()?;
        let upstream = UpstreamNet::create()?;
        let seen: Seen = Arc::default();
        spawn_echo_server(upstream.listen(80)?, None, seen.clone());
        let (ca_pem, tls) = test_tls(LAB_NAMES);
        spawn_echo_server(upstream.listen(443)?, Some(tls), seen.clone());
        let upstream_ca = dir.path().join("upstream-ca.pem");
        std::fs::write(&upstream_ca, ca_pem)?;

        let mut overrides: HashMap<String, Vec<IpAddr>> = LAB_NAMES
            .iter()
            .map(|n| (n.to_string(), vec![IpAddr::V4(upstream.addr)]))
            .collect();
        overrides.insert(LOOPBACK_NAME.into(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        let (tx, audit) = mpsc::channel();
        let cfg = EgressConfig {
            state_dir: dir.path().join("state"),
            allow_private: false,
            resolve_overrides: overrides,
            upstream_extra_roots: vec![upstream_ca.clone()],
        };
        let egress = Egress::new(
            cfg,
            Arc::new(MapSecrets(secrets)),
            Arc::new(ChannelAudit(Mutex::new(tx))),
        )
        .map_err(std::io::Error::other)?;
        let egress_ca = dir.path().join("egress-ca.pem");
        std::fs::write(&egress_ca, egress.ca_cert_pem())?;

        let sandbox = NetNs::create("sb")?;
        sandbox.set_nameserver(crate::GATEWAY_ADDR)?;
        let tun = crate::open_tun_in_netns(&sandbox.path()).map_err(std::io::Error::other)?;
        let sandbox_id = format!("sb-{}", sandbox.name);
        egress
            .attach(&sandbox_id, tun, policy)
            .map_err(std::io::Error::other)?;
        Ok(Lab {
            dir,
            upstream,
            sandbox,
            egress,
            audit,
            seen,
            upstream_ca,
            egress_ca,
            sandbox_id,
        })
    }

    /// Drains audit events, waiting up to `wait` until the events collected so far satisfy `pred`.
    pub async fn audit_until(
        &self,
        wait: Duration,
        pred: impl Fn(&[AuditEvent]) -> bool,
    ) -> Vec<AuditEvent> {
        let deadline = std::time::Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            while let Ok(e) = self.audit.try_recv() {
                out.push(e);
            }
            if pred(&out) || std::time::Instant::now() >= deadline {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.egress.detach(&self.sandbox_id);
    }
}
