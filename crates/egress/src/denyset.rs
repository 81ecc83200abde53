//! The fixed deny set: destinations no sandbox may reach unless the operator opts in
//! (`EgressConfig::allow_private`): loopback, private, link-local (cloud metadata), CGNAT,
//! multicast/reserved, their IPv6 equivalents, and the host's own addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;

const FIXED: &[(&str, &str)] = &[
    ("0.0.0.0/8", "this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "cgnat"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "ietf-protocol"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/96", "ipv4-compatible"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local-nat64"),
    ("100::/64", "discard"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
];

/// Maps IPv4-mapped IPv6 (`::ffff:a.b.c.d`) to IPv4 so one rule covers both spellings.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// IPv4 addresses embedded in translation prefixes (NAT64 well-known prefix, 6to4); a denied
/// IPv4 address must stay denied when spelled through them.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|x| *x == 0) {
        return Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

/// A snapshot of the deny set (fixed ranges + the host's addresses at snapshot time).
#[derive(Debug)]
pub struct DenySet {
    fixed: Vec<(IpNet, &'static str)>,
    host: Vec<IpAddr>,
}

impl DenySet {
    /// Only the fixed ranges (tests, and the fallback when interfaces cannot be listed).
    pub fn fixed_only() -> Self {
        Self::with_host_addrs(Vec::new())
    }

    pub fn with_host_addrs(host: Vec<IpAddr>) -> Self {
        let fixed = FIXED
            .iter()
            .map(|(n, name)| (n.parse::<IpNet>().expect("static CIDR"), *name))
            .collect();
        let host = host.into_iter().map(canonical_ip).collect();
        Self { fixed, host }
    }

    /// The name of the deny range containing `ip`, if any.
    pub fn matches(&self, ip: IpAddr) -> Option<&'static str> {
        let ip = canonical_ip(ip);
        if let Some((_, name)) = self.fixed.iter().find(|(n, _)| n.contains(&ip)) {
            return Some(name);
        }
        if self.host.contains(&ip) {
            return Some("host-address");
        }
        if let IpAddr::V6(v6) = ip
            && let Some(v4) = embedded_v4(v6)
        {
            return self.matches(IpAddr::V4(v4));
        }
        None
    }
}

/// Lists the host's interface addresses (in the calling thread's network namespace).
pub fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)? {
        let Some(addr) = ifa.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Caches the deny set and refreshes the host-address part when older than `max_age`, so
/// addresses added at runtime (DHCP renewals, new interfaces) are covered promptly.
pub(crate) struct DenyCache {
    max_age: Duration,
    state: Mutex<(Instant, Arc<DenySet>)>,
}

impl DenyCache {
    pub fn new(max_age: Duration) -> Self {
        let set = Arc::new(Self::load());
        Self {
            max_age,
            state: Mutex::new((Instant::now(), set)),
        }
    }

    fn load() -> DenySet {
        match host_addresses() {
            Ok(addrs) => DenySet::with_host_addrs(addrs),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list host addresses; deny set has fixed ranges only");
                DenySet::fixed_only()
            }
        }
    }

    pub fn get(&self) -> Arc<DenySet> {
        let mut st = self.state.lock().expect("deny cache lock");
        if st.0.elapsed() > self.max_age {
            *st = (Instant::now(), Arc::new(Self::load()));
        }
        st.1.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn fixed_ranges() {
        let d = DenySet::fixed_only();
        for denied in [
            "127.0.0.1",
            "127.8.9.10",
            "10.200.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.251",
            "255.255.255.255",
            "198.18.0.5",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "fc00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "2002:7f00:1::1",
        ] {
            assert!(d.matches(ip(denied)).is_some(), "{denied} should be denied");
        }
        for ok in [
            "203.0.113.10",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:203.0.113.10",
            "64:ff9b::cb00:710a",
        ] {
            assert!(d.matches(ip(ok)).is_none(), "{ok} should not be denied");
        }
        assert_eq!(d.matches(ip("169.254.169.254")), Some("link-local"));
    }

    #[test]
    fn host_addresses_are_denied() {
        let addrs = host_addresses().unwrap();
        assert!(addrs.contains(&ip("127.0.0.1")), "{addrs:?}");
        let d = DenySet::with_host_addrs(vec![ip("203.0.113.77")]);
        assert_eq!(d.matches(ip("203.0.113.77")), Some("host-address"));
        assert_eq!(d.matches(ip("::ffff:203.0.113.77")), Some("host-address"));
        assert!(d.matches(ip("203.0.113.78")).is_none());
        // Every real host address is denied by a fresh cache.
        let cache = DenyCache::new(Duration::from_secs(1));
        for a in addrs {
            assert!(cache.get().matches(a).is_some(), "{a}");
        }
    }
}
