//! Creates the sandbox's `eth0` TUN link inside its network namespace (privileged).
//!
//! Runs on a dedicated short-lived thread that `setns(CLONE_NEWNET)`s into the target, so the
//! server's own threads never change namespace. Everything is done with plain ioctls on a socket
//! created inside the namespace (address, netmask, MTU, flags, default route): no netlink, no
//! external tools. The device, the socket's namespace and `/proc/sys/net` lookups all follow
//! the *calling thread's* network namespace.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::mem::{size_of, zeroed};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use crate::config::{GATEWAY_ADDR, MTU, PREFIX_LEN, SANDBOX_ADDR};
use crate::error::EgressError;

const IFNAME: &str = "eth0";

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
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; sockaddr is the generic view.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    req
}

fn tun_err(what: &str) -> EgressError {
    EgressError::Tun(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn ioctl_ifreq(
    sock: &OwnedFd,
    req: libc::Ioctl,
    ifr: &mut libc::ifreq,
    what: &str,
) -> Result<(), EgressError> {
    // SAFETY: `ifr` is a valid, initialised ifreq for the duration of the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), req as _, ifr as *mut libc::ifreq) };
    if rc < 0 { Err(tun_err(what)) } else { Ok(()) }
}

fn set_up(sock: &OwnedFd, name: &str) -> Result<(), EgressError> {
    let mut ifr = ifreq(name);
    ioctl_ifreq(sock, libc::SIOCGIFFLAGS, &mut ifr, "SIOCGIFFLAGS")?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl_ifreq(sock, libc::SIOCSIFFLAGS, &mut ifr, "SIOCSIFFLAGS")
}

/// Writes 1 to `/proc/sys/net/ipv6/conf/{default,all}/disable_ipv6`. `/proc/sys/net` is
/// resolved against the calling thread's network namespace (the kernel's net sysctl root looks
/// up `current->nsproxy->net_ns`), so after `setns` this affects only the target namespace; the
/// integration test verifies that from inside and outside. Returns whether IPv6 exists at all.
fn disable_ipv6() -> Result<bool, EgressError> {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return Ok(false);
    }
    for which in ["default", "all", "lo"] {
        let p = format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6");
        if !Path::new(&p).exists() {
            continue;
        }
        OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|mut f| f.write_all(b"1"))
            .map_err(|e| EgressError::Tun(format!("disabling IPv6 ({p}): {e}")))?;
    }
    Ok(true)
}

fn setup_in_current_netns() -> Result<OwnedFd, EgressError> {
    // Before creating eth0, so it never gets an IPv6 link-local address.
    disable_ipv6()?;

    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| EgressError::Tun(format!("open /dev/net/tun: {e}")))?;
    let tun: OwnedFd = tun.into();
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF takes a pointer to an initialised ifreq.
    let rc = unsafe {
        libc::ioctl(
            tun.as_raw_fd(),
            libc::TUNSETIFF as _,
            &mut ifr as *mut libc::ifreq,
        )
    };
    if rc < 0 {
        return Err(tun_err(
            "TUNSETIFF eth0 (is there already an eth0 in this namespace?)",
        ));
    }

    // SAFETY: plain socket(2) call; the result is checked and owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(tun_err("socket(AF_INET)"));
    }
    // SAFETY: `raw` is a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };

    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_addr = sockaddr_v4(SANDBOX_ADDR);
    ioctl_ifreq(&sock, libc::SIOCSIFADDR, &mut ifr, "SIOCSIFADDR")?;
    let mask = if PREFIX_LEN == 0 {
        0
    } else {
        u32::MAX << (32 - PREFIX_LEN as u32)
    };
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_netmask = sockaddr_v4(Ipv4Addr::from(mask));
    ioctl_ifreq(&sock, libc::SIOCSIFNETMASK, &mut ifr, "SIOCSIFNETMASK")?;
    let mut ifr = ifreq(IFNAME);
    ifr.ifr_ifru.ifru_mtu = MTU as libc::c_int;
    ioctl_ifreq(&sock, libc::SIOCSIFMTU, &mut ifr, "SIOCSIFMTU")?;
    set_up(&sock, IFNAME)?;
    // Loopback is the sandbox's own business, but a namespace without lo up surprises programs.
    set_up(&sock, "lo")?;

    // default dev eth0 (GATEWAY is on-link; a TUN has no neighbours to resolve).
    let dev = CString::new(IFNAME).expect("static name");
    // SAFETY: RtEntry is POD; zero is valid for every field.
    let mut rt: RtEntry = unsafe { zeroed() };
    rt.rt_dst = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_v4(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_v4(GATEWAY_ADDR);
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
        return Err(tun_err("SIOCADDRT default via 10.200.0.1 dev eth0"));
    }
    debug_assert_eq!(size_of::<libc::sockaddr_in>(), size_of::<libc::sockaddr>());
    Ok(tun)
}

/// Creates `eth0` (TUN, IPv4 `SANDBOX_ADDR/PREFIX_LEN`, MTU, up, default route) inside the network
/// namespace at `netns_path` (e.g. `/proc/<pid>/ns/net` or `/run/netns/<name>`), disables IPv6
/// there, and returns the non-blocking TUN fd. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN).
pub fn open_tun_in_netns(netns_path: &Path) -> Result<OwnedFd, EgressError> {
    let path: PathBuf = netns_path.to_path_buf();
    let ns = File::open(&path).map_err(|e| EgressError::Netns {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let thread_path = path.clone();
    std::thread::Builder::new()
        .name("egress-netns".into())
        .spawn(move || {
            // Only this thread enters the namespace; it exits right after, so no pooled thread
            // of the server is ever left in a sandbox's namespace.
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| EgressError::Netns {
                path: thread_path,
                message: format!("setns: {e}"),
            })?;
            setup_in_current_netns()
        })
        .map_err(EgressError::Io)?
        .join()
        .map_err(|_| EgressError::Netns {
            path,
            message: "namespace setup thread panicked".into(),
        })?
}
