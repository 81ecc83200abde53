//! The guest's `eth0` (guest mode), configured like the jail's sandbox link
//! (`bulkhead_host::link::open_tun_in_netns`, with the same interface code,
//! [`bulkhead_host::netif`]): IPv6 off, one IPv4 address, the MTU, up, a default
//! route via the gateway, and `/etc/resolv.conf` naming the gateway as the only nameserver.
//! The host hands the values over on the kernel command line as
//! `BULKHEAD_GUEST_NET=ADDR/PREFIX,GATEWAY,MTU` (an environment variable of pid 1).
//!
//! The link's only peer is the host's egress stack (QEMU's NIC socket bridged to it), and only
//! while the sandbox's policy lets anything out; `ignore_routes_with_linkdown` makes connects
//! fail at once ("network unreachable") while the NIC has no carrier. No netlink, no tools
//! from the template.

use std::net::Ipv4Addr;
use std::path::Path;

use bulkhead_host::netif::{Ipv4Link, Netif, NetifError};

const IFNAME: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum GuestNetError {
    #[error(
        "BULKHEAD_GUEST_NET={0:?} is not ADDR/PREFIX,GATEWAY,MTU: start the VM with the microvm driver"
    )]
    Spec(String),
    #[error("Could not configure the guest's eth0: does the guest kernel have CONFIG_VIRTIO_NET?")]
    Ioctl(#[source] NetifError),
    #[error("Could not write {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the host asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestNet {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub mtu: u16,
}

impl GuestNet {
    pub fn parse(s: &str) -> Result<GuestNet, GuestNetError> {
        let bad = || GuestNetError::Spec(s.to_string());
        let mut parts = s.split(',');
        let (addr, prefix) = parts
            .next()
            .and_then(|a| a.split_once('/'))
            .ok_or_else(bad)?;
        let net = GuestNet {
            addr: addr.parse().map_err(|_| bad())?,
            prefix: prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?,
            gateway: parts.next().and_then(|g| g.parse().ok()).ok_or_else(bad)?,
            mtu: parts
                .next()
                .and_then(|m| m.parse().ok())
                .filter(|m| *m >= 576)
                .ok_or_else(bad)?,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(net)
    }

    fn link(&self) -> Ipv4Link {
        Ipv4Link {
            addr: self.addr,
            prefix: self.prefix,
            gateway: self.gateway,
            mtu: self.mtu,
        }
    }
}

/// `resolv.conf` naming the gateway, as the jail writes it.
pub fn resolv_conf(gateway: Ipv4Addr) -> String {
    format!("nameserver {gateway}\noptions timeout:2 attempts:1\n")
}

/// Configures `eth0` and `/etc/resolv.conf` from `BULKHEAD_GUEST_NET`; does nothing without
/// it. Runs in pid 1 after `/proc` is mounted.
pub fn configure() -> Result<(), GuestNetError> {
    let Ok(spec) = std::env::var("BULKHEAD_GUEST_NET") else {
        return Ok(());
    };
    let net = GuestNet::parse(&spec)?;
    // Before eth0 goes up, so it never gets an IPv6 address (the stack speaks IPv4 only).
    for which in ["all", "default", IFNAME] {
        write_sysctl(
            &format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6"),
            "1",
        )?;
    }
    write_sysctl(
        &format!("/proc/sys/net/ipv4/conf/{IFNAME}/ignore_routes_with_linkdown"),
        "1",
    )?;
    Netif::open()
        .and_then(|nif| nif.configure(IFNAME, &net.link()))
        .map_err(GuestNetError::Ioctl)?;
    write_resolv_conf(Path::new("/etc/resolv.conf"), net.gateway)
}

/// A regular file replacing whatever the template has there (often a symlink into
/// systemd-resolved's directory); it lands in the overlay's writable layer.
fn write_resolv_conf(path: &Path, gateway: Ipv4Addr) -> Result<(), GuestNetError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| GuestNetError::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    std::fs::write(path, resolv_conf(gateway))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)))
        .map_err(err)
}

fn write_sysctl(path: &str, value: &str) -> Result<(), GuestNetError> {
    std::fs::write(path, value).map_err(|source| GuestNetError::Write {
        path: path.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_spec_parses_and_bad_ones_say_what_is_expected() {
        let n = GuestNet::parse("10.200.0.2/24,10.200.0.1,1500").unwrap();
        assert_eq!(n.addr, Ipv4Addr::new(10, 200, 0, 2));
        assert_eq!(n.gateway, Ipv4Addr::new(10, 200, 0, 1));
        assert_eq!((n.prefix, n.mtu), (24, 1500));
        assert_eq!(
            bulkhead_host::netif::netmask(n.prefix),
            Ipv4Addr::new(255, 255, 255, 0)
        );
        for bad in [
            "",
            "10.200.0.2,10.200.0.1,1500",
            "10.200.0.2/33,10.200.0.1,1500",
            "10.200.0.2/24,gw,1500",
            "10.200.0.2/24,10.200.0.1",
            "10.200.0.2/24,10.200.0.1,100",
            "10.200.0.2/24,10.200.0.1,1500,x",
        ] {
            let e = GuestNet::parse(bad).unwrap_err().to_string();
            assert!(e.contains("ADDR/PREFIX,GATEWAY,MTU"), "{bad}: {e}");
        }
    }

    #[test]
    fn resolv_conf_replaces_a_template_symlink_with_a_file_naming_the_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let path = etc.join("resolv.conf");
        std::os::unix::fs::symlink("/run/systemd/resolve/stub-resolv.conf", &path).unwrap();
        write_resolv_conf(&path, Ipv4Addr::new(10, 200, 0, 1)).unwrap();
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "nameserver 10.200.0.1\noptions timeout:2 attempts:1\n"
        );
    }
}
