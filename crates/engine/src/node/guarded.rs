//! A byte stream to an agent that the engine can cut: a checkpoint needs every connection from
//! the host to the sandbox closed (CRIU cannot dump a socket whose peer lives in the host's
//! namespace), so streams handed to the routing proxy end when the sandbox's traffic token is
//! cancelled. A leaf.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::node::driver::AgentStream;

pub(crate) struct GuardedStream {
    inner: AgentStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl GuardedStream {
    pub(crate) fn new(inner: AgentStream, token: CancellationToken) -> Self {
        GuardedStream {
            inner,
            cut: Box::pin(token.cancelled_owned()),
        }
    }

    fn is_cut(&mut self, cx: &mut Context<'_>) -> bool {
        self.cut.as_mut().poll(cx).is_ready()
    }
}

fn cut_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the sandbox is being checkpointed (paused, snapshotted or forked)",
    )
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.is_cut(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.is_cut(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.is_cut(cx) {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_cut_ends_a_waiting_read() {
        let (a, mut b) = tokio::io::duplex(64);
        let token = CancellationToken::new();
        let mut g = GuardedStream::new(Box::new(a), token.clone());
        b.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        g.read_exact(&mut buf).await.unwrap();
        let pending = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            g.read(&mut buf).await
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        token.cancel();
        let r = pending.await.unwrap();
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
    }
}
