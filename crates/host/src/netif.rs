//! Network interfaces and routes of the calling thread's network namespace, by `ioctl` on an
//! `AF_INET` datagram socket: address, netmask, MTU, flags, the default route, and TUN devices.
//! The one copy of what the jail's sandbox init (loopback), the sandbox link
//! ([`crate::link::open_tun_in_netns`]) and the microVM guest's agent (its `eth0` and loopback)
//! do to a link: no netlink, no external tools.
//!
//! The socket, the interfaces it names and the device `/dev/net/tun` creates all belong to the
//! network namespace of the thread that opens them.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

/// What failed, on which interface.
#[derive(Debug, thiserror::Error)]
#[error("{op} {ifname}")]
pub struct NetifError {
    /// The request (`SIOCSIFADDR`, `TUNSETIFF`, ...).
    pub op: &'static str,
    pub ifname: String,
    #[source]
    pub source: io::Error,
}

/// An IPv4 link: address and prefix, MTU, default gateway (on-link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Link {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub mtu: u16,
}

/// The netmask of a prefix length (`24` → `255.255.255.0`; above 32 counts as 32).
pub fn netmask(prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(
        u32::MAX
            .checked_shl(32 - u32::from(prefix.min(32)))
            .unwrap_or(0),
    )
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

fn sockaddr_v4(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    const _: () = assert!(size_of::<libc::sockaddr_in>() == size_of::<libc::sockaddr>());
    // SAFETY: sockaddr_in and sockaddr have the same size (checked above); sockaddr is the
    // generic view of the same bytes.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// The requests this module makes, each with the argument type the kernel reads for it.
enum Request<'a> {
    Ifreq(libc::Ioctl, &'a mut libc::ifreq),
    AddRoute(&'a mut RtEntry),
}

/// The one `ioctl` of this module.
fn ioctl(fd: &impl AsRawFd, req: Request<'_>) -> io::Result<()> {
    let rc = match req {
        // SAFETY: every ifreq request of this module (SIOC[GS]IF*, TUNSETIFF) reads and writes
        // one `struct ifreq`, which `ifr` is, valid and exclusively borrowed for the call.
        Request::Ifreq(r, ifr) => unsafe {
            libc::ioctl(fd.as_raw_fd(), r as _, ifr as *mut libc::ifreq)
        },
        // SAFETY: SIOCADDRT reads one `struct rtentry`; `rt` and the device name it points to
        // are borrowed for the call.
        Request::AddRoute(rt) => unsafe {
            libc::ioctl(fd.as_raw_fd(), libc::SIOCADDRT as _, rt as *mut RtEntry)
        },
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A `struct ifreq` naming `ifname` (truncated to `IFNAMSIZ - 1` bytes), everything else zero.
fn ifreq(ifname: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let room = req.ifr_name.len() - 1;
    for (dst, src) in req
        .ifr_name
        .iter_mut()
        .zip(ifname.as_bytes().iter().take(room))
    {
        *dst = *src as libc::c_char;
    }
    req
}

/// A control socket of the calling thread's network namespace, for the requests below.
pub struct Netif {
    sock: OwnedFd,
}

impl Netif {
    pub fn open() -> Result<Netif, NetifError> {
        let sock = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| NetifError {
            op: "socket(AF_INET)",
            ifname: String::new(),
            source: e.into(),
        })?;
        Ok(Netif { sock })
    }

    fn ifreq(
        &self,
        op: &'static str,
        ifname: &str,
        r: libc::Ioctl,
        ifr: &mut libc::ifreq,
    ) -> Result<(), NetifError> {
        ioctl(&self.sock, Request::Ifreq(r, ifr)).map_err(|source| NetifError {
            op,
            ifname: ifname.into(),
            source,
        })
    }

    /// `ip addr add ADDR dev IFNAME` (the interface's one IPv4 address).
    pub fn set_addr(&self, ifname: &str, addr: Ipv4Addr) -> Result<(), NetifError> {
        let mut ifr = ifreq(ifname);
        ifr.ifr_ifru.ifru_addr = sockaddr_v4(addr);
        self.ifreq("SIOCSIFADDR", ifname, libc::SIOCSIFADDR, &mut ifr)
    }

    /// The netmask of the interface's address, as a prefix length.
    pub fn set_prefix(&self, ifname: &str, prefix: u8) -> Result<(), NetifError> {
        let mut ifr = ifreq(ifname);
        ifr.ifr_ifru.ifru_netmask = sockaddr_v4(netmask(prefix));
        self.ifreq("SIOCSIFNETMASK", ifname, libc::SIOCSIFNETMASK, &mut ifr)
    }

    pub fn set_mtu(&self, ifname: &str, mtu: u16) -> Result<(), NetifError> {
        let mut ifr = ifreq(ifname);
        ifr.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        self.ifreq("SIOCSIFMTU", ifname, libc::SIOCSIFMTU, &mut ifr)
    }

    /// `ip link set IFNAME up` (`IFF_UP | IFF_RUNNING` added to its flags).
    pub fn up(&self, ifname: &str) -> Result<(), NetifError> {
        let mut ifr = ifreq(ifname);
        self.ifreq("SIOCGIFFLAGS", ifname, libc::SIOCGIFFLAGS, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        ifr.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        self.ifreq("SIOCSIFFLAGS", ifname, libc::SIOCSIFFLAGS, &mut ifr)
    }

    /// `ip route add default via GATEWAY dev IFNAME`.
    pub fn add_default_route(&self, ifname: &str, gateway: Ipv4Addr) -> Result<(), NetifError> {
        let err = |source| NetifError {
            op: "SIOCADDRT default route",
            ifname: ifname.into(),
            source,
        };
        let dev = CString::new(ifname).map_err(|e| err(io::Error::other(e)))?;
        let mut rt = RtEntry {
            rt_pad1: 0,
            rt_dst: sockaddr_v4(Ipv4Addr::UNSPECIFIED),
            rt_gateway: sockaddr_v4(gateway),
            rt_genmask: sockaddr_v4(Ipv4Addr::UNSPECIFIED),
            rt_flags: (libc::RTF_UP | libc::RTF_GATEWAY) as libc::c_ushort,
            rt_pad2: 0,
            rt_pad3: 0,
            rt_pad4: std::ptr::null_mut(),
            rt_metric: 0,
            rt_dev: dev.as_ptr().cast_mut(),
            rt_mtu: 0,
            rt_window: 0,
            rt_irtt: 0,
        };
        ioctl(&self.sock, Request::AddRoute(&mut rt)).map_err(err)
    }

    /// Address, netmask, MTU, up, and the default route via the link's gateway.
    pub fn configure(&self, ifname: &str, link: &Ipv4Link) -> Result<(), NetifError> {
        self.set_addr(ifname, link.addr)?;
        self.set_prefix(ifname, link.prefix)?;
        self.set_mtu(ifname, link.mtu)?;
        self.up(ifname)?;
        self.add_default_route(ifname, link.gateway)
    }
}

/// Bring `lo` up (a fresh network namespace has it down).
pub fn loopback_up() -> Result<(), NetifError> {
    Netif::open()?.up("lo")
}

/// A TUN device (IP packets, no packet information header) named `ifname`, created in the
/// calling thread's network namespace; the returned descriptor is non-blocking. The device
/// lives while the descriptor is open.
pub fn create_tun(ifname: &str) -> Result<OwnedFd, NetifError> {
    let err = |op, source| NetifError {
        op,
        ifname: ifname.into(),
        source,
    };
    let tun: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| err("open /dev/net/tun for", e))?
        .into();
    let mut ifr = ifreq(ifname);
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    ioctl(&tun, Request::Ifreq(libc::TUNSETIFF, &mut ifr)).map_err(|e| err("TUNSETIFF", e))?;
    Ok(tun)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_make_netmasks() {
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(32), Ipv4Addr::BROADCAST);
        assert_eq!(netmask(15), Ipv4Addr::new(255, 254, 0, 0));
        assert_eq!(netmask(0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(netmask(40), Ipv4Addr::BROADCAST);
    }

    #[test]
    fn interface_names_are_nul_terminated_and_truncated() {
        let r = ifreq("a-very-long-interface-name");
        assert_eq!(r.ifr_name[r.ifr_name.len() - 1], 0);
        assert_eq!(r.ifr_name[0], b'a' as libc::c_char);
        assert_eq!(ifreq("lo").ifr_name[2], 0);
    }

    #[test]
    fn the_route_entry_has_the_kernels_layout() {
        // x86_64: 8 + 3 * 16 + 2 + 2 + 4 (pad) + 8 + 2 + 6 (pad) + 8 + 8 + 8 + 2 + 6 (pad).
        assert_eq!(size_of::<RtEntry>(), 120);
    }

    #[test]
    fn errors_name_the_request_and_the_interface() {
        let e = NetifError {
            op: "SIOCSIFMTU",
            ifname: "eth0".into(),
            source: io::Error::from_raw_os_error(libc::ENODEV),
        };
        assert_eq!(e.to_string(), "SIOCSIFMTU eth0");
    }
}
