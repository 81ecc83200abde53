//! The host↔guest agent channel of the microvm driver: many byte streams multiplexed over
//! one virtio-serial port.
//!
//! The engine expects [`Driver::connect`](https://docs.rs/) to give it a fresh byte stream to
//! the agent for every request, as a Unix socket would. A VM without `vhost-vsock` (absent on
//! many hosts, this one included) has no such socket, but QEMU maps a virtio-serial port to a
//! host Unix socket with no host kernel support. That is one stream; this crate runs a small
//! framed protocol over it ([`frame`]) with per-stream credit windows ([`session`]):
//!
//! - the host ([`HostSession`]) opens streams; each becomes a [`tokio::io::DuplexStream`];
//! - the guest ([`serve_guest`], run by `bulkhead-agent` in guest mode) connects each stream to
//!   the agent's own Unix socket inside the guest.
//!
//! A new host connection (a restarted server adopting the VM) starts with a HELLO frame that
//! makes the guest drop the previous session's streams.

pub mod frame;
pub mod session;

pub use session::{Acceptor, HostSession, Local, LocalIo, WINDOW, serve_guest};

#[derive(Debug, thiserror::Error)]
pub enum ChanError {
    #[error("The agent channel lost framing ({0}); reconnect to start a new session")]
    Desync(String),
    #[error("The agent channel is closed (the VM stopped or the session was replaced)")]
    Closed,
    #[error("The guest refused the stream: {0}")]
    Refused(String),
    #[error("The agent channel failed")]
    Io(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An acceptor whose every stream is an echo server (reads until EOF, writes back).
    fn echo_acceptor() -> Acceptor {
        Arc::new(|| {
            Box::pin(async {
                let (a, mut b) = tokio::io::duplex(1024);
                tokio::spawn(async move {
                    let mut all = Vec::new();
                    b.read_to_end(&mut all).await.unwrap();
                    b.write_all(&all).await.unwrap();
                    b.shutdown().await.unwrap();
                });
                Ok(Box::new(a) as Local)
            })
        })
    }

    fn pair(acceptor: Acceptor, session_id: u64) -> HostSession {
        let (host, guest) = tokio::io::duplex(64 * 1024);
        let (gr, gw) = tokio::io::split(guest);
        tokio::spawn(serve_guest(gr, gw, acceptor));
        let (hr, hw) = tokio::io::split(host);
        HostSession::start(hr, hw, session_id)
    }

    #[tokio::test]
    async fn concurrent_streams_carry_more_than_a_window_each() {
        let s = Arc::new(pair(echo_acceptor(), 42));
        let mut tasks = Vec::new();
        for i in 0..8u8 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut st = s.open().await.unwrap();
                // More than the credit window, so credit must flow back for it to finish.
                let data: Vec<u8> = (0..3 * WINDOW).map(|j| (j as u8) ^ i).collect();
                let (mut r, mut w) = tokio::io::split(&mut st);
                let write = async {
                    w.write_all(&data).await.unwrap();
                    w.shutdown().await.unwrap();
                };
                let mut back = Vec::new();
                let read = r.read_to_end(&mut back);
                let ((), n) = tokio::join!(write, read);
                n.unwrap();
                assert!(back == data, "stream {i} came back different");
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("streams finish")
                .unwrap();
        }
        assert!(s.is_alive());
    }

    #[tokio::test]
    async fn a_refusing_guest_fails_the_open_and_a_closed_transport_too() {
        let refuse: Acceptor =
            Arc::new(|| Box::pin(async { Err(std::io::Error::other("agent not listening yet")) }));
        let s = pair(refuse, 7);
        match s.open().await {
            Err(ChanError::Refused(why)) => assert!(why.contains("agent not listening"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }

        let (host, guest) = tokio::io::duplex(1024);
        let (hr, hw) = tokio::io::split(host);
        let s = HostSession::start(hr, hw, 9);
        drop(guest);
        assert!(matches!(s.open().await, Err(ChanError::Closed)));
        assert!(!s.is_alive());
    }

    #[tokio::test]
    async fn the_guest_drops_old_streams_at_a_new_hello_even_after_garbage() {
        // One guest transport, two host sessions in a row (a restarted server), with a torn
        // frame of the first in between.
        let (host, guest) = tokio::io::duplex(64 * 1024);
        let (gr, gw) = tokio::io::split(guest);
        tokio::spawn(serve_guest(gr, gw, echo_acceptor()));
        let (hr, mut hw) = tokio::io::split(host);
        hw.write_all(&[0xB1, 0x7E, 5, 0, 0]).await.unwrap();
        // A fresh HostSession on the same pipe, as after a reconnect.
        let s = HostSession::start(hr, hw, 1234);
        let mut st = s.open().await.unwrap();
        st.write_all(b"hello").await.unwrap();
        st.shutdown().await.unwrap();
        let mut back = String::new();
        st.read_to_string(&mut back).await.unwrap();
        assert_eq!(back, "hello");
    }
}
