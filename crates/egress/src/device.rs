//! Async wrapper over the TUN fd with a packet filter in front of the userspace stack. The
//! filter drops everything the stack must never see (IPv6, fragments, spoofed sources, UDP other
//! than DNS to the gateway, ICMP, other protocols) and answers SYNs to denied destinations with
//! an immediate RST, so denied connects fail fast with "connection refused".

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::{GATEWAY_ADDR, SANDBOX_ADDR};

#[derive(Debug, PartialEq)]
pub(crate) enum Action {
    Pass,
    Drop,
    /// Write this packet back to the sandbox (a RST) and drop the original.
    Reply(Vec<u8>),
}

/// Decides, synchronously, whether a new TCP connection may reach the proxy at all.
pub(crate) trait SynFilter: Send + Sync + 'static {
    /// `None` = pass to the stack; `Some(rule)` = refuse with RST (and audit `rule`).
    fn check_syn(&self, dst: std::net::SocketAddrV4) -> Option<String>;
}

pub(crate) fn classify<F: SynFilter + ?Sized>(pkt: &[u8], filter: &F) -> Action {
    let Ok(sliced) = SlicedPacket::from_ip(pkt) else {
        return Action::Drop;
    };
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
        return Action::Drop;
    };
    let h = ip.header();
    if h.source_addr() != SANDBOX_ADDR || h.is_fragmenting_payload() {
        return Action::Drop;
    }
    let dst = h.destination_addr();
    match &sliced.transport {
        Some(TransportSlice::Tcp(tcp)) => {
            if tcp.syn() && !tcp.ack() && !tcp.rst() {
                let sa = std::net::SocketAddrV4::new(dst, tcp.destination_port());
                if filter.check_syn(sa).is_some() {
                    return rst_for_syn(
                        dst,
                        SANDBOX_ADDR,
                        tcp.destination_port(),
                        tcp.source_port(),
                        tcp.sequence_number(),
                    );
                }
            }
            Action::Pass
        }
        Some(TransportSlice::Udp(udp)) if dst == GATEWAY_ADDR && udp.destination_port() == 53 => {
            Action::Pass
        }
        _ => Action::Drop,
    }
}

fn rst_for_syn(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    sport: u16,
    dport: u16,
    syn_seq: u32,
) -> Action {
    let builder = PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .tcp(sport, dport, 0, 0)
        .rst()
        .ack(syn_seq.wrapping_add(1));
    let mut out = Vec::with_capacity(builder.size(0));
    match builder.write(&mut out, &[]) {
        Ok(()) => Action::Reply(out),
        Err(_) => Action::Drop,
    }
}

pub(crate) struct TunDevice<F: SynFilter> {
    fd: AsyncFd<OwnedFd>,
    filter: Arc<F>,
}

impl<F: SynFilter> TunDevice<F> {
    /// `fd` must be non-blocking (as returned by `open_tun_in_netns`). Needs a runtime context.
    pub fn new(fd: OwnedFd, filter: Arc<F>) -> io::Result<Self> {
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io::Error::from)?;
        // SAFETY: an OwnedFd always returns the same open fd from as_raw_fd and stays open until
        // the AsyncFd (its owner) is dropped.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { fd, filter })
    }

    /// Best-effort immediate write (RSTs): a full queue just drops it and the client retries.
    fn write_now(&self, pkt: &[u8]) {
        let _ = nix::unistd::write(self.fd.get_ref().as_fd(), pkt);
    }
}

impl<F: SynFilter> AsyncRead for TunDevice<F> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &*self;
        loop {
            let mut guard = ready!(this.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let res = guard.try_io(|inner| {
                nix::unistd::read(inner.get_ref().as_fd(), unfilled).map_err(io::Error::from)
            });
            match res {
                Ok(Ok(n)) => match classify(&unfilled[..n], this.filter.as_ref()) {
                    Action::Pass => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Action::Drop => continue,
                    Action::Reply(p) => {
                        this.write_now(&p);
                        continue;
                    }
                },
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl<F: SynFilter> AsyncWrite for TunDevice<F> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &*self;
        loop {
            let mut guard = ready!(this.fd.poll_write_ready(cx))?;
            match guard.try_io(|inner| {
                nix::unistd::write(inner.get_ref().as_fd(), data).map_err(io::Error::from)
            }) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    struct DenyPort(u16);
    impl SynFilter for DenyPort {
        fn check_syn(&self, dst: SocketAddrV4) -> Option<String> {
            (dst.port() == self.0).then(|| "denied".to_string())
        }
    }

    fn tcp_syn(src: Ipv4Addr, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
        let b = PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
            .tcp(40000, dport, 1000, 64000)
            .syn();
        let mut v = Vec::new();
        b.write(&mut v, &[]).unwrap();
        v
    }

    #[test]
    fn filter_rules() {
        let f = DenyPort(25);
        let other = Ipv4Addr::new(203, 0, 113, 10);
        assert_eq!(
            classify(&tcp_syn(SANDBOX_ADDR, other, 80), &f),
            Action::Pass
        );
        // Spoofed source.
        assert_eq!(
            classify(&tcp_syn(Ipv4Addr::new(10, 200, 0, 3), other, 80), &f),
            Action::Drop
        );
        // Denied SYN → RST|ACK back to the sandbox, acking the SYN.
        let Action::Reply(rst) = classify(&tcp_syn(SANDBOX_ADDR, other, 25), &f) else {
            panic!()
        };
        let s = SlicedPacket::from_ip(&rst).unwrap();
        let Some(TransportSlice::Tcp(t)) = s.transport else {
            panic!()
        };
        assert!(t.rst() && t.ack());
        assert_eq!(t.acknowledgment_number(), 1001);
        assert_eq!((t.source_port(), t.destination_port()), (25, 40000));
        // UDP: only DNS to the gateway.
        let udp = |dst: Ipv4Addr, port: u16| {
            let b = PacketBuilder::ipv4(SANDBOX_ADDR.octets(), dst.octets(), 64).udp(5555, port);
            let mut v = Vec::new();
            b.write(&mut v, b"x").unwrap();
            v
        };
        assert_eq!(classify(&udp(GATEWAY_ADDR, 53), &f), Action::Pass);
        assert_eq!(classify(&udp(GATEWAY_ADDR, 123), &f), Action::Drop);
        assert_eq!(classify(&udp(other, 53), &f), Action::Drop);
        // IPv6 and ICMP dropped.
        let b = PacketBuilder::ipv6([0xfd; 16], [0xfe; 16], 64).udp(1, 53);
        let mut v6 = Vec::new();
        b.write(&mut v6, b"x").unwrap();
        assert_eq!(classify(&v6, &f), Action::Drop);
        let b = PacketBuilder::ipv4(SANDBOX_ADDR.octets(), GATEWAY_ADDR.octets(), 64)
            .icmpv4_echo_request(1, 1);
        let mut icmp = Vec::new();
        b.write(&mut icmp, b"ping").unwrap();
        assert_eq!(classify(&icmp, &f), Action::Drop);
        assert_eq!(classify(b"junk", &f), Action::Drop);
    }
}
