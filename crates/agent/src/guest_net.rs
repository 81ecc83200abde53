//! The guest's `eth0` (guest mode), configured like the jail's sandbox link
//! (`bulkhead_egress::open_tun_in_netns`): IPv6 off, one IPv4 address, the MTU, up, a default
//! route via the gateway, and `/etc/resolv.conf` naming the gateway as the only nameserver.
//! The host hands the values over on the kernel command line as
//! `BULKHEAD_GUEST_NET=ADDR/PREFIX,GATEWAY,MTU` (an environment variable of pid 1).
//!
//! The link's only peer is the host's egress stack (QEMU's NIC socket bridged to it), and only
//! while the sandbox's policy lets anything out; `ignore_routes_with_linkdown` makes connects
//! fail at once ("network unreachable") while the NIC has no carrier. Leaf module: plain
//! ioctls, no netlink, no tools from the template.

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const IFNAME: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum GuestNetError {
    #[error(
        "BULKHEAD_GUEST_NET={0:?} is not ADDR/PREFIX,GATEWAY,MTU: start the VM with the microvm driver"
    )]
    Spec(String),
    #[error(
        "Could not configure the guest's eth0 ({what}): does the guest kernel have CONFIG_VIRTIO_NET?"
    )]
    Ioctl {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
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

    fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::MAX
                .checked_shl(32 - u32::from(self.prefix))
                .unwrap_or(0),
        )
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
    let sock = inet_socket()?;
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_addr = sockaddr_v4(net.addr);
    ioctl(&sock, libc::SIOCSIFADDR, &mut ifr, "SIOCSIFADDR")?;
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_netmask = sockaddr_v4(net.netmask());
    ioctl(&sock, libc::SIOCSIFNETMASK, &mut ifr, "SIOCSIFNETMASK")?;
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_mtu = libc::c_int::from(net.mtu);
    ioctl(&sock, libc::SIOCSIFMTU, &mut ifr, "SIOCSIFMTU")?;
    let mut ifr = ifreq(IFNAME);
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut ifr, "SIOCGIFFLAGS")?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl(&sock, libc::SIOCSIFFLAGS, &mut ifr, "SIOCSIFFLAGS")?;
    default_route(&sock, net.gateway)?;
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

fn inet_socket() -> Result<OwnedFd, GuestNetError> {
    // SAFETY: plain socket(2); the result is checked and owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(GuestNetError::Ioctl {
            what: "socket(AF_INET)",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; sockaddr is the generic view.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    req
}

fn ioctl(
    sock: &OwnedFd,
    req: libc::Ioctl,
    ifr: &mut libc::ifreq,
    what: &'static str,
) -> Result<(), GuestNetError> {
    // SAFETY: `ifr` is a valid, initialised ifreq for the duration of the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), req as _, ifr as *mut libc::ifreq) };
    if rc < 0 {
        return Err(GuestNetError::Ioctl {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// `struct rtentry` from the kernel's uapi `<linux/route.h>` (not exported by libc for glibc).
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// `ip route add default via GATEWAY dev eth0`.
fn default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> Result<(), GuestNetError> {
    let dev = CString::new(IFNAME).unwrap_or_default();
    // SAFETY: RtEntry is POD; zero is valid for every field.
    let mut rt: RtEntry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_v4(gateway);
    rt.rt_flags = (libc::RTF_UP | libc::RTF_GATEWAY) as libc::c_ushort;
    rt.rt_dev = dev.as_ptr() as *mut libc::c_char;
    // SAFETY: `rt` and the device name it points to outlive the call.
    let rc = unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCADDRT as _,
            &mut rt as *mut RtEntry,
        )
    };
    if rc < 0 {
        return Err(GuestNetError::Ioctl {
            what: "SIOCADDRT default route",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
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
        assert_eq!(n.netmask(), Ipv4Addr::new(255, 255, 255, 0));
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
