//! The per-sandbox fake-IP pool: allowed names are answered with addresses from
//! 198.18.0.0/15, so the proxy learns the name back from the destination address. A leaf, so
//! the sandbox context can hold a pool without importing the DNS responder that fills it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use crate::config::{FAKE_IP_BASE, FAKE_IP_PREFIX_LEN};

pub(crate) const POOL_SIZE: u32 = 1 << (32 - FAKE_IP_PREFIX_LEN as u32);

/// Per-sandbox name ↔ fake IP mapping. Stable per name; when the pool wraps, the oldest
/// assignment is reused (131k names per sandbox before that happens).
#[derive(Debug, Default)]
pub(crate) struct FakePool {
    next: u32,
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
}

pub(crate) fn is_fake(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            (u32::from(v4) >> (32 - FAKE_IP_PREFIX_LEN))
                == (u32::from(FAKE_IP_BASE) >> (32 - FAKE_IP_PREFIX_LEN))
        }
        IpAddr::V6(_) => false,
    }
}

impl FakePool {
    pub fn assign(&mut self, name: &str) -> Ipv4Addr {
        if let Some(ip) = self.by_name.get(name) {
            return *ip;
        }
        // Skip .0 of the pool (network address) for readability of the mapping.
        self.next = if self.next + 1 >= POOL_SIZE {
            1
        } else {
            self.next + 1
        };
        let ip = Ipv4Addr::from(u32::from(FAKE_IP_BASE) + self.next);
        if let Some(old) = self.by_ip.insert(ip, name.to_string()) {
            self.by_name.remove(&old);
        }
        self.by_name.insert(name.to_string(), ip);
        ip
    }

    pub fn lookup(&self, ip: Ipv4Addr) -> Option<String> {
        self.by_ip.get(&ip).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_stable_and_wraps() {
        let mut p = FakePool::default();
        let a = p.assign("a.test");
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.assign("a.test"), a);
        let b = p.assign("b.test");
        assert_ne!(a, b);
        assert!(is_fake(IpAddr::V4(b)));
        assert!(is_fake("198.19.255.255".parse().unwrap()));
        assert!(!is_fake("198.20.0.1".parse().unwrap()));
        assert_eq!(p.lookup(b).as_deref(), Some("b.test"));
        p.next = POOL_SIZE - 1;
        let w = p.assign("c.test");
        assert_eq!(w, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.lookup(w).as_deref(), Some("c.test"));
        assert!(!p.by_name.contains_key("a.test"));
    }
}
