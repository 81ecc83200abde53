//! The jail's link: `eth0`, a TUN device created inside the sandbox's network namespace
//! (privileged).
//!
//! Runs on a dedicated short-lived thread that `setns(CLONE_NEWNET)`s into the target, so the
//! server's own threads never change namespace. The device, the control socket
//! ([`crate::netif`]) and `/proc/sys/net` lookups all follow the *calling thread's* network
//! namespace.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use super::SANDBOX_LINK;
use crate::netif::{self, Netif, NetifError};

const IFNAME: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("network namespace {path}")]
    Netns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("creating the sandbox's eth0 TUN link (needs root/CAP_NET_ADMIN and /dev/net/tun)")]
    Tun(#[source] NetifError),
    #[error("disabling IPv6 ({path})")]
    Ipv6 {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Writes 1 to `/proc/sys/net/ipv6/conf/{default,all,lo}/disable_ipv6`. `/proc/sys/net` is
/// resolved against the calling thread's network namespace (the kernel's net sysctl root looks
/// up `current->nsproxy->net_ns`), so after `setns` this affects only the target namespace; the
/// egress crate's integration test verifies that from inside and outside.
fn disable_ipv6() -> Result<(), LinkError> {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return Ok(());
    }
    for which in ["default", "all", "lo"] {
        let path = format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6");
        if !Path::new(&path).exists() {
            continue;
        }
        OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"1"))
            .map_err(|source| LinkError::Ipv6 { path, source })?;
    }
    Ok(())
}

fn setup_in_current_netns() -> Result<OwnedFd, LinkError> {
    // Before creating eth0, so it never gets an IPv6 link-local address.
    disable_ipv6()?;
    let tun = netif::create_tun(IFNAME).map_err(LinkError::Tun)?;
    let nif = Netif::open().map_err(LinkError::Tun)?;
    // The gateway is on-link; a TUN has no neighbours to resolve.
    nif.configure(IFNAME, &SANDBOX_LINK)
        .map_err(LinkError::Tun)?;
    // Loopback is the sandbox's own business, but a namespace without lo up surprises programs.
    nif.up("lo").map_err(LinkError::Tun)?;
    Ok(tun)
}

/// Creates `eth0` (TUN, IPv4 [`super::SANDBOX_ADDR`]/[`super::PREFIX_LEN`], MTU, up, default
/// route via [`super::GATEWAY_ADDR`]) inside the network namespace at `netns_path` (e.g.
/// `/proc/<pid>/ns/net` or `/run/netns/<name>`), disables IPv6 there, and returns the
/// non-blocking TUN fd. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN).
pub fn open_tun_in_netns(netns_path: &Path) -> Result<OwnedFd, LinkError> {
    let path: PathBuf = netns_path.to_path_buf();
    let ns = File::open(&path).map_err(|source| LinkError::Netns {
        path: path.clone(),
        source,
    })?;
    let thread_path = path.clone();
    let thread = std::thread::Builder::new()
        .name("sandbox-netns".into())
        .spawn(move || {
            // Only this thread enters the namespace; it exits right after, so no pooled thread
            // of the server is ever left in a sandbox's namespace.
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| LinkError::Netns {
                path: thread_path,
                source: e.into(),
            })?;
            setup_in_current_netns()
        })
        .map_err(|source| LinkError::Netns {
            path: path.clone(),
            source,
        })?;
    thread.join().map_err(|_| LinkError::Netns {
        path,
        source: io::Error::other("the namespace setup thread panicked"),
    })?
}
