//! Where a pull may connect: the rules every connection of the registry client passes (the
//! registry, its token service, every redirect target), checked on the addresses a name
//! resolves to, so a reference, a `WWW-Authenticate` realm or a `Location` header cannot aim
//! the server at itself or at the operator's private network.
//!
//! A target is reachable when either the operator trusts it by name (`--registry-insecure
//! HOST[:PORT]`: plain HTTP and any address allowed, for a registry on loopback or the LAN),
//! or it is HTTPS and every address its name resolves to is public unicast. Data and DNS
//! only: the connection itself is made by [`super::guard`], to the addresses checked here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Docker Hub and the big public registries: the default `--registry-allow`.
pub const PUBLIC_REGISTRIES: &[&str] = &[
    "docker.io",
    "registry-1.docker.io",
    "index.docker.io",
    "ghcr.io",
    "quay.io",
    "gcr.io",
    "*.gcr.io",
    "*.pkg.dev",
    "public.ecr.aws",
    "mcr.microsoft.com",
    "registry.k8s.io",
];

/// Why a connection was refused (logged server-side; users see one generic message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0:?} is not a host[:port] target")]
    BadTarget(String),
    #[error("plain HTTP to {0} is not allowed (it is not listed in --registry-insecure)")]
    PlainHttp(String),
    #[error(
        "{target} resolves to {addr}, which is not a public address (list the host in \
         --registry-insecure to allow it)"
    )]
    NotPublic { target: String, addr: IpAddr },
    #[error("cannot resolve {target}: {reason}")]
    Dns { target: String, reason: String },
}

/// Why a `--registry-allow` / `--registry-insecure` entry is not a [`HostPattern`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    #[error("{0:?}: expected HOST or HOST:PORT (e.g. ghcr.io)")]
    Shape(String),
}

/// A `HOST[:PORT]` pattern of `--registry-allow` / `--registry-insecure`: `*` (any host),
/// `*.example.com` (any subdomain), or a host; without a port it matches every port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: String,
    port: Option<u16>,
}

impl HostPattern {
    pub fn parse(spec: &str) -> Result<HostPattern, HostPatternError> {
        let spec = spec.trim();
        if spec == "*" {
            return Ok(HostPattern {
                host: "*".into(),
                port: None,
            });
        }
        let shape = || HostPatternError::Shape(spec.to_owned());
        let (host, port) = split_authority(spec).ok_or_else(shape)?;
        if host.contains('/') || host.contains('@') || host.is_empty() {
            return Err(shape());
        }
        let host = match host.strip_prefix("*.") {
            Some(rest) => format!("*.{}", normalize_host(rest)),
            None => normalize_host(host),
        };
        Ok(HostPattern { host, port })
    }

    /// Whether `host` (already normalised) on `port` matches.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match self.host.strip_prefix("*.") {
            _ if self.host == "*" => true,
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => host == self.host,
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) if self.host.contains(':') => write!(f, "[{}]:{p}", self.host),
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// `host[:port]` or `[v6]:port` → (host without brackets, port). None when malformed.
pub fn split_authority(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            p => Some((host, Some(p.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, _)) if h.contains(':') => Some((s, None)),
        Some((h, p)) => Some((h, Some(p.parse().ok()?))),
        None => Some((s, None)),
    }
}

/// A host as the resolver and the URL parser see it: lower case, no trailing dot, and an
/// address in its canonical form (`2130706433`, `0177.0.0.1` and `0x7f.1` are all
/// `127.0.0.1` to `getaddrinfo` and to browsers' URL parsing, so they are to the rules too).
pub fn normalize_host(host: &str) -> String {
    let h = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if let Ok(v6) = h.parse::<Ipv6Addr>() {
        return v6.to_string();
    }
    match parse_inet_aton(&h) {
        Some(v4) => v4.to_string(),
        None => h,
    }
}

/// IPv4 in any form `inet_aton(3)` accepts: 1 to 4 parts, each decimal, octal (leading 0)
/// or hex (0x); the last part fills the remaining bytes.
pub fn parse_inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let n = if let Some(hex) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            if hex.is_empty() {
                0
            } else {
                u64::from_str_radix(hex, 16).ok()?
            }
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()?
        } else {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse::<u64>().ok()?
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    if head.iter().any(|n| *n > 255) {
        return None;
    }
    let last_bits = 8 * (4 - head.len() as u32);
    if *last >= 1u64 << last_bits {
        return None;
    }
    let mut v: u32 = 0;
    for (i, n) in head.iter().enumerate() {
        v |= (*n as u32) << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(v | *last as u32))
}

/// True for an address the public internet routes to one host: not loopback, private
/// (RFC 1918), CGNAT, link-local, unique-local, multicast, unspecified, documentation,
/// benchmarking or reserved. IPv6 forms that embed an IPv4 address (mapped, compatible,
/// NAT64, 6to4) are judged by the embedded address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network", 0.0.0.0
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    if ip.is_unspecified() || ip.is_loopback() {
        return false;
    }
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible): the IPv4 address is what is reached.
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return is_public_v4(embedded(s[6], s[7]));
    }
    // NAT64 well-known prefix 64:ff9b::/96; the local-use 64:ff9b:1::/48 is private.
    if s[0] == 0x64 && s[1] == 0xff9b {
        return s[2] == 0 && s[3..6] == [0, 0, 0] && is_public_v4(embedded(s[6], s[7]));
    }
    // 6to4 2002:V4ADDR::/48.
    if s[0] == 0x2002 {
        return is_public_v4(embedded(s[1], s[2]));
    }
    !((s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // discard 100::/64
        || (s[0] == 0x2001 && s[1] < 0x200) // IETF protocols 2001::/23 (Teredo included)
        || (s[0] == 0x2001 && s[1] == 0xdb8)) // documentation
}

/// The operator's connection rules for one pull.
#[derive(Debug, Clone, Default)]
pub struct ConnectPolicy {
    /// `--registry-insecure`: reachable over plain HTTP and at any address.
    pub insecure: Vec<HostPattern>,
}

impl ConnectPolicy {
    /// True when `host:port` is trusted by name (plain HTTP, private addresses).
    pub fn is_insecure(&self, host: &str, port: u16) -> bool {
        let host = normalize_host(host);
        self.insecure.iter().any(|p| p.matches(&host, port))
    }

    /// Checks the target without DNS (scheme, trust); the addresses come later.
    pub fn check_scheme(&self, https: bool, host: &str, port: u16) -> Result<(), Refusal> {
        if !https && !self.is_insecure(host, port) {
            return Err(Refusal::PlainHttp(format!(
                "{}:{port}",
                normalize_host(host)
            )));
        }
        Ok(())
    }

    /// Checks addresses `host` resolved to: all public unless the host is trusted.
    pub fn check_addrs(&self, host: &str, port: u16, addrs: &[SocketAddr]) -> Result<(), Refusal> {
        if self.is_insecure(host, port) {
            return Ok(());
        }
        match addrs.iter().find(|a| !is_public(a.ip())) {
            Some(bad) => Err(Refusal::NotPublic {
                target: format!("{}:{port}", normalize_host(host)),
                addr: bad.ip(),
            }),
            None => Ok(()),
        }
    }

    /// Resolves `host:port` and checks everything: the addresses to connect to (only these:
    /// connecting by name again would let a second DNS answer differ from the checked one).
    pub async fn resolve(
        &self,
        https: bool,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        self.check_scheme(https, host, port)?;
        let target = format!("{}:{port}", normalize_host(host));
        let name = normalize_host(host);
        let addrs: Vec<SocketAddr> = match name.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|e| Refusal::Dns {
                    target: target.clone(),
                    reason: e.to_string(),
                })?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(Refusal::Dns {
                target,
                reason: "no addresses".into(),
            });
        }
        self.check_addrs(host, port, &addrs)?;
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn public_and_non_public_addresses() {
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "104.16.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
        for private in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.255.254",
            "10.0.0.5",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "203.0.113.9",
            "224.0.0.251",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "2002:7f00:1::1",
            "2002:a00:1::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
        ] {
            assert!(!is_public(ip(private)), "{private}");
        }
    }

    #[test]
    fn numeric_hosts_normalise_as_the_resolver_reads_them() {
        for (raw, want) in [
            ("2130706433", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("[::1]", "::1"),
            ("[::ffff:7f00:1]", "::ffff:127.0.0.1"),
            ("LocalHost.", "localhost"),
            ("Registry.Example.COM", "registry.example.com"),
        ] {
            assert_eq!(normalize_host(raw), want, "{raw}");
        }
        // Not addresses: names, and numbers out of range.
        for name in [
            "1.2.3.4.5",
            "256.1.1.1",
            "08.1.1.1",
            "1.2.3.4a",
            "4294967296",
            "a.0x1",
        ] {
            assert_eq!(parse_inet_aton(name), None, "{name}");
        }
    }

    #[test]
    fn authorities_split_host_and_port() {
        assert_eq!(split_authority("ghcr.io"), Some(("ghcr.io", None)));
        assert_eq!(split_authority("r:5000"), Some(("r", Some(5000))));
        assert_eq!(split_authority("[::1]:443"), Some(("::1", Some(443))));
        assert_eq!(split_authority("[::1]"), Some(("::1", None)));
        assert_eq!(split_authority("::1"), Some(("::1", None)));
        assert_eq!(split_authority("r:x"), None);
        assert_eq!(split_authority("[::1]x"), None);
    }

    #[test]
    fn patterns_match_hosts_ports_and_subdomains() {
        let p = |s| HostPattern::parse(s).unwrap();
        assert!(p("ghcr.io").matches("ghcr.io", 443));
        assert!(!p("ghcr.io").matches("evil-ghcr.io", 443));
        assert!(p("127.0.0.1:5000").matches("127.0.0.1", 5000));
        assert!(!p("127.0.0.1:5000").matches("127.0.0.1", 5001));
        assert!(p("*.pkg.dev").matches("europe-docker.pkg.dev", 443));
        assert!(!p("*.pkg.dev").matches("pkg.dev", 443));
        assert!(!p("*.pkg.dev").matches("pkg.dev.evil.com", 443));
        assert!(p("*").matches("anything.example", 1));
        // Numeric spellings of one address are one host.
        assert!(p("127.0.0.1").matches(&normalize_host("2130706433"), 80));
        assert!(p("[::1]:5000").matches("::1", 5000));
        assert_eq!(p("[::1]:5000").to_string(), "[::1]:5000");
        for bad in ["", "a/b", "u@h", "h:port"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            HostPattern::parse(" a/b ").unwrap_err().to_string(),
            r#""a/b": expected HOST or HOST:PORT (e.g. ghcr.io)"#
        );
    }

    #[tokio::test]
    async fn connections_go_to_checked_public_addresses_or_trusted_hosts_only() {
        let open = ConnectPolicy::default();
        // Loopback in every spelling, the unspecified address and names resolving to loopback.
        for (host, port) in [
            ("127.0.0.1", 443),
            ("2130706433", 443),
            ("0177.0.0.1", 443),
            ("localhost", 443),
            ("[::1]", 443),
            ("::ffff:127.0.0.1", 443),
            ("0.0.0.0", 443),
            ("169.254.169.254", 443),
            ("10.1.2.3", 443),
        ] {
            let e = open.resolve(true, host, port).await.unwrap_err();
            assert!(matches!(e, Refusal::NotPublic { .. }), "{host}: {e}");
        }
        // Plain HTTP anywhere untrusted, public or not.
        let e = open.resolve(false, "8.8.8.8", 80).await.unwrap_err();
        assert!(matches!(e, Refusal::PlainHttp(_)), "{e}");
        // A public literal needs no DNS and passes.
        assert_eq!(
            open.resolve(true, "8.8.8.8", 443).await.unwrap(),
            vec!["8.8.8.8:443".parse().unwrap()]
        );

        let trusted = ConnectPolicy {
            insecure: vec![HostPattern::parse("127.0.0.1:5000").unwrap()],
        };
        assert!(trusted.resolve(false, "127.0.0.1", 5000).await.is_ok());
        assert!(trusted.resolve(false, "2130706433", 5000).await.is_ok());
        // The same host on another port is not trusted.
        assert!(trusted.resolve(false, "127.0.0.1", 5001).await.is_err());
        assert!(trusted.resolve(true, "127.0.0.1", 5001).await.is_err());
        assert!(trusted.resolve(true, "localhost", 5000).await.is_err());
    }
}
