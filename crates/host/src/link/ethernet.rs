//! The device adapter for a VM's NIC: QEMU's `-netdev stream` carries Ethernet frames, each
//! prefixed by its length (4 bytes, big-endian), while the userspace stack reads and writes IP
//! packets, as from the jail's TUN. [`ethernet_link`] bridges the two, so a VM sandbox gets the
//! same filter, stack, DNS, proxy, injection and audit trail as a jailed one (the egress proxy,
//! `bulkhead_egress`, which this crate knows nothing of).
//!
//! The adapter is the guest's only neighbour: it answers ARP for every address but the
//! guest's own with the gateway's MAC (so, as on a TUN, every packet reaches the stack, whose
//! filter decides), passes IPv4 to the stack, and drops everything else (IPv6, other
//! ethertypes, oversized frames).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::{GATEWAY_MAC, GUEST_MAC, MTU, SANDBOX_ADDR};

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
/// Frames larger than this are a broken or hostile peer: the link is closed.
const MAX_FRAME: usize = 64 * 1024;

/// What to do with one frame from the guest.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FromGuest<'a> {
    /// An IPv4 packet for the stack.
    Ip(&'a [u8]),
    /// A frame to send back to the guest (an ARP reply).
    Reply(Vec<u8>),
    Drop,
}

/// Classifies a frame from the guest (without its length prefix).
pub(crate) fn from_guest(frame: &[u8]) -> FromGuest<'_> {
    if frame.len() < ETH_HEADER {
        return FromGuest::Drop;
    }
    let payload = &frame[ETH_HEADER..];
    match u16::from_be_bytes([frame[12], frame[13]]) {
        ETHERTYPE_IPV4 if payload.len() <= MTU as usize => FromGuest::Ip(trim_padding(payload)),
        ETHERTYPE_ARP => arp_reply(payload).map_or(FromGuest::Drop, FromGuest::Reply),
        _ => FromGuest::Drop,
    }
}

/// The IPv4 packet without Ethernet padding after it (short frames may be padded to 60 bytes).
fn trim_padding(ip: &[u8]) -> &[u8] {
    match ip
        .get(2..4)
        .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    {
        Some(total) if (20..=ip.len()).contains(&total) => &ip[..total],
        _ => ip,
    }
}

/// The reply to an Ethernet/IPv4 ARP request for any address but the guest's own.
fn arp_reply(arp: &[u8]) -> Option<Vec<u8>> {
    // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4, op 1 (request).
    if arp.len() < 28 || arp[..8] != [0, 1, 8, 0, 6, 4, 0, 1] {
        return None;
    }
    let (sha, spa, tpa) = (&arp[8..14], &arp[14..18], &arp[24..28]);
    if Ipv4Addr::new(tpa[0], tpa[1], tpa[2], tpa[3]) == SANDBOX_ADDR {
        // The guest probing its own address (duplicate address detection): nobody else has it.
        return None;
    }
    let mut f = Vec::with_capacity(ETH_HEADER + 28);
    f.extend_from_slice(sha);
    f.extend_from_slice(&GATEWAY_MAC);
    f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    f.extend_from_slice(&GATEWAY_MAC);
    f.extend_from_slice(tpa);
    f.extend_from_slice(sha);
    f.extend_from_slice(spa);
    Some(f)
}

/// A length-prefixed Ethernet frame carrying `ip` to `dst`.
pub(crate) fn to_guest(dst: &[u8; 6], ip: &[u8]) -> Vec<u8> {
    let len = (ETH_HEADER + ip.len()) as u32;
    let mut f = Vec::with_capacity(4 + len as usize);
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(dst);
    f.extend_from_slice(&GATEWAY_MAC);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f.extend_from_slice(ip);
    f
}

fn prefixed(frame: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + frame.len());
    f.extend_from_slice(&(frame.len() as u32).to_be_bytes());
    f.extend_from_slice(frame);
    f
}

/// Bridges `vm` (a connection to QEMU's `-netdev stream` socket) to a new packet socket and
/// returns the other end: it reads and writes one IP packet per call, like the jail's TUN fd,
/// so it goes to the egress proxy (`bulkhead_egress::Egress::attach`) as is. Must be called inside a tokio runtime.
///
/// The bridge lives as long as the returned end: closing it (detach) closes the connection to
/// QEMU and finishes the returned task; when QEMU goes away first, the returned end stays open
/// and silent until closed (the stack never sees an end of file it cannot handle).
pub fn ethernet_link(vm: UnixStream) -> io::Result<(OwnedFd, tokio::task::JoinHandle<()>)> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let ours = register(ours)?;
    Ok((theirs, tokio::spawn(bridge(vm, ours))))
}

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd always returns the same open fd from as_raw_fd and stays open until
    // the AsyncFd (its owner) is dropped.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

async fn bridge(vm: UnixStream, packets: AsyncFd<OwnedFd>) {
    let (mut vm_r, mut vm_w) = vm.into_split();
    let mut guest_mac = GUEST_MAC;
    let mut vm_open = true;
    let mut buf = vec![0u8; MTU as usize + 64];
    loop {
        tokio::select! {
            frame = read_frame(&mut vm_r), if vm_open => match frame {
                Ok(frame) => {
                    if frame.len() >= 12 {
                        guest_mac.copy_from_slice(&frame[6..12]);
                    }
                    match from_guest(&frame) {
                        // A full queue drops the packet, as a NIC would; TCP retransmits.
                        FromGuest::Ip(ip) => {
                            let _ = nix::unistd::write(packets.get_ref().as_fd(), ip);
                        }
                        FromGuest::Reply(f) => {
                            if vm_w.write_all(&prefixed(&f)).await.is_err() {
                                vm_open = false;
                            }
                        }
                        FromGuest::Drop => {}
                    }
                }
                Err(_) => vm_open = false,
            },
            ready = packets.readable() => {
                let Ok(mut guard) = ready else { return };
                match guard.try_io(|fd| {
                    nix::unistd::read(fd.get_ref().as_fd(), &mut buf).map_err(io::Error::from)
                }) {
                    // The stack's end was closed (detach): dropping `vm_w` disconnects QEMU.
                    Ok(Ok(0)) | Ok(Err(_)) => return,
                    Ok(Ok(n)) => {
                        if vm_open && vm_w.write_all(&to_guest(&guest_mac, &buf[..n])).await.is_err() {
                            vm_open = false;
                        }
                    }
                    Err(_would_block) => {}
                }
            }
        }
    }
}

async fn read_frame(r: &mut tokio::net::unix::OwnedReadHalf) -> io::Result<Vec<u8>> {
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!(
            "frame of {len} bytes from the VM"
        )));
    }
    let mut frame = vec![0u8; len];
    r.read_exact(&mut frame).await?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::GATEWAY_ADDR;

    fn arp_request(tpa: Ipv4Addr) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&SANDBOX_ADDR.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa.octets());
        f
    }

    #[test]
    fn arp_for_the_gateway_is_answered_with_its_mac() {
        let FromGuest::Reply(r) = from_guest(&arp_request(GATEWAY_ADDR)) else {
            panic!("no reply")
        };
        assert_eq!(&r[..6], &GUEST_MAC);
        assert_eq!(&r[6..12], &GATEWAY_MAC);
        assert_eq!(&r[12..14], &ETHERTYPE_ARP.to_be_bytes());
        let arp = &r[14..];
        assert_eq!(&arp[6..8], &[0, 2], "a reply");
        assert_eq!(&arp[8..14], &GATEWAY_MAC);
        assert_eq!(&arp[14..18], &GATEWAY_ADDR.octets());
        assert_eq!(&arp[18..24], &GUEST_MAC);
        assert_eq!(&arp[24..28], &SANDBOX_ADDR.octets());
        // Other on-link addresses go to the stack too (its filter refuses them)...
        assert!(matches!(
            from_guest(&arp_request(Ipv4Addr::new(10, 200, 0, 9))),
            FromGuest::Reply(_)
        ));
        // ...but the guest's own address is never claimed.
        assert_eq!(from_guest(&arp_request(SANDBOX_ADDR)), FromGuest::Drop);
    }

    #[test]
    fn ipv4_passes_and_everything_else_is_dropped() {
        let mut f = GATEWAY_MAC.to_vec();
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let mut ip = vec![0x45, 0, 0, 21];
        ip.extend_from_slice(&[0; 16]);
        ip.push(7);
        f.extend_from_slice(&ip);
        assert_eq!(from_guest(&f), FromGuest::Ip(&ip));
        // Padding after the packet is not part of it.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 9]);
        assert_eq!(from_guest(&padded), FromGuest::Ip(&ip));
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        assert_eq!(from_guest(&f), FromGuest::Drop, "IPv6");
        assert_eq!(from_guest(&f[..10]), FromGuest::Drop, "runt");
        let mut big = f[..14].to_vec();
        big[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        big.resize(14 + MTU as usize + 1, 0);
        assert_eq!(from_guest(&big), FromGuest::Drop, "over the MTU");
    }

    #[test]
    fn packets_to_the_guest_are_framed_with_a_length_prefix() {
        let f = to_guest(&GUEST_MAC, b"abc");
        assert_eq!(&f[..4], &17u32.to_be_bytes());
        assert_eq!(&f[4..10], &GUEST_MAC);
        assert_eq!(&f[10..16], &GATEWAY_MAC);
        assert_eq!(&f[16..18], &[8, 0]);
        assert_eq!(&f[18..], b"abc");
    }

    /// The bridge end to end: a fake VMM on one side of a stream, the packet end on the other.
    #[tokio::test]
    async fn bridge_moves_packets_both_ways_and_closes_with_the_stack_end() {
        let (vmm, host) = UnixStream::pair().unwrap();
        let (packets, bridge) = ethernet_link(host).unwrap();
        let (mut vr, mut vw) = vmm.into_split();
        // Guest → stack: an IPv4 frame arrives as a bare packet.
        let mut f = GATEWAY_MAC.to_vec();
        f.extend_from_slice(&GUEST_MAC);
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(b"hello stack");
        vw.write_all(&prefixed(&f)).await.unwrap();
        let afd = register(packets).unwrap();
        let mut buf = [0u8; 64];
        let n = loop {
            let mut g = afd.readable().await.unwrap();
            if let Ok(r) = g.try_io(|fd| {
                nix::unistd::read(fd.get_ref().as_fd(), &mut buf).map_err(io::Error::from)
            }) {
                break r.unwrap();
            }
        };
        assert_eq!(&buf[..n], b"hello stack");
        // ARP is answered on the stream.
        vw.write_all(&prefixed(&arp_request(GATEWAY_ADDR)))
            .await
            .unwrap();
        let len = vr.read_u32().await.unwrap() as usize;
        let mut reply = vec![0; len];
        vr.read_exact(&mut reply).await.unwrap();
        assert_eq!(&reply[12..14], &ETHERTYPE_ARP.to_be_bytes());
        // Stack → guest: a packet becomes a frame to the learned MAC.
        nix::unistd::write(afd.get_ref().as_fd(), b"hello guest").unwrap();
        let len = vr.read_u32().await.unwrap() as usize;
        let mut frame = vec![0; len];
        vr.read_exact(&mut frame).await.unwrap();
        assert_eq!(&frame[..6], &GUEST_MAC);
        assert_eq!(&frame[14..], b"hello guest");
        // Closing the stack's end disconnects the VMM.
        drop(afd);
        let mut rest = Vec::new();
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), vr.read_to_end(&mut rest))
            .await
            .expect("the bridge closes the stream")
            .unwrap();
        assert_eq!(n, 0);
        bridge.await.unwrap();
    }
}
