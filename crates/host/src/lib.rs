//! Host primitives both sandbox drivers (the jail and the microvm driver) use, so that neither
//! depends on the other nor on the egress proxy:
//!
//! - [`sys`]: thin wrappers over syscalls libc does not wrap (the new mount API, pidfds) and
//!   small `/proc` parsers;
//! - [`cgroup`]: per-sandbox cgroups, v1 and v2 behind one trait; [`freezer`]: freezing one;
//! - [`netif`]: interfaces and routes by ioctl (address, MTU, up, default route, TUN devices),
//!   also used by the guest agent for its `eth0`;
//! - [`link`]: a sandbox's network link on the host (the jail's TUN in the sandbox's network
//!   namespace, the microVM NIC's Ethernet bridge) and its addresses.

pub mod cgroup;
pub mod freezer;
pub mod link;
pub mod netif;
pub mod sys;
