//! The task set that runs one sandbox's userspace stack over its TUN fd: TCP goes to the proxy,
//! UDP to GATEWAY:53 to the DNS responder, everything else is dropped by the device filter.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use ipstack::{IpStack, IpStackConfig, IpStackStream, IpStackUdpStream, TcpConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::MTU;
use crate::device::TunDevice;
use crate::dns;
use crate::proxy;
use crate::sandbox::Sandbox;

/// Starts the stack on the current runtime; everything stops when `cancel` fires.
pub(crate) fn spawn(
    sb: Arc<Sandbox>,
    fd: OwnedFd,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let dev = TunDevice::new(fd, sb.clone())?;
    let mut cfg = IpStackConfig::default();
    cfg.mtu(MTU).map_err(std::io::Error::other)?;
    cfg.udp_timeout(Duration::from_secs(10));
    let mut tcp = TcpConfig::default();
    // Idle connections (HTTP keep-alive pools) are kept for a while before being reset.
    tcp.timeout = Duration::from_secs(300);
    // Our side of TIME_WAIT only delays the audit event of server-closed connections.
    tcp.two_msl = Duration::from_secs(1);
    cfg.with_tcp_config(tcp);
    let mut stack = IpStack::new(cfg, dev);
    let tracker = TaskTracker::new();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                s = stack.accept() => s,
            };
            match next {
                Ok(IpStackStream::Tcp(tcp)) => {
                    let (sb, c) = (sb.clone(), cancel.clone());
                    tracker.spawn(async move {
                        tokio::select! {
                            _ = c.cancelled() => {}
                            _ = proxy::handle_tcp(sb, tcp, c.clone()) => {}
                        }
                    });
                }
                Ok(IpStackStream::Udp(udp)) => {
                    let (sb, c) = (sb.clone(), cancel.clone());
                    tracker.spawn(async move {
                        tokio::select! {
                            _ = c.cancelled() => {}
                            _ = serve_dns(sb, udp) => {}
                        }
                    });
                }
                // The device filter already dropped other traffic; anything else is ignored.
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %sb.id, error = %e, "egress stack stopped");
                    break;
                }
            }
        }
        tracker.close();
        // Dropping the stack aborts its device loop, which closes the TUN fd.
        drop(stack);
        tracker.wait().await;
        tracing::debug!(sandbox = %sb.id, "egress stack detached");
    });
    Ok(())
}

async fn serve_dns(sb: Arc<Sandbox>, mut udp: IpStackUdpStream) {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = match udp.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(resp) = dns::answer(&sb, &buf[..n]).await
            && udp.write_all(&resp).await.is_err()
        {
            break;
        }
    }
}
