//! A sandbox's network link on the host's side, whichever driver runs it: the addresses both
//! ends use, the jail's TUN device inside the sandbox's network namespace
//! ([`open_tun_in_netns`]) and the microVM's NIC bridged to the same kind of packet descriptor
//! ([`ethernet_link`]). Either descriptor moves one IP packet per read or write; the driver
//! hands it out through `Driver::open_network` and the engine attaches it to the egress proxy.
//! Nothing here knows the proxy.

mod ethernet;
mod tun;

use std::net::Ipv4Addr;

pub use ethernet::ethernet_link;
pub use tun::{LinkError, open_tun_in_netns};

use crate::netif::Ipv4Link;

/// The sandbox's address on its `eth0`.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The link's peer: the egress proxy's userspace stack; DNS server for the sandbox
/// (`nameserver 10.200.0.1`).
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const PREFIX_LEN: u8 = 24;
pub const MTU: u16 = 1500;
/// The gateway's (the stack's) MAC: locally administered, unicast.
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0xc8, 0x00, 0x01];
/// The MAC the VMM gives the guest's NIC (QEMU's `mac=`); learned from frames as well.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xc8, 0x00, 0x02];

/// The sandbox's end of the link, as [`crate::netif::Netif::configure`] takes it.
pub const SANDBOX_LINK: Ipv4Link = Ipv4Link {
    addr: SANDBOX_ADDR,
    prefix: PREFIX_LEN,
    gateway: GATEWAY_ADDR,
    mtu: MTU,
};
