//! gzip adapters: a file streamed out compressed, and a request body decompressed as it
//! arrives. Both run flate2 on a blocking thread connected to the async side by channels; the
//! thread stops when the other side goes away.

use std::io::{self, Read, Write};

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Size of the chunks files are streamed in.
pub const CHUNK: usize = 64 << 10;

/// Collects written bytes into chunks sent over a channel.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send_buffer()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffer()
    }
}

/// Streams `file` gzip-compressed; compression runs on a blocking thread that stops when the
/// client goes away.
pub fn gzip_file(mut file: std::fs::File) -> ReceiverStream<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let mut encoder = flate2::write::GzEncoder::new(writer, flate2::Compression::default());
        let result = io::copy(&mut file, &mut encoder)
            .and_then(|_| encoder.finish())
            .and_then(|mut w| w.flush());
        if let Err(e) = result
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let _ = tx.blocking_send(Err(e));
        }
    });
    ReceiverStream::new(rx)
}

/// Adapts an async byte stream to `Read` for a blocking thread.
struct BlockingStreamReader {
    handle: tokio::runtime::Handle,
    stream: BoxStream<'static, io::Result<Bytes>>,
    current: Bytes,
}

impl Read for BlockingStreamReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.handle.block_on(self.stream.next()) {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Decompresses a gzip byte stream on a blocking thread.
pub fn gunzip_stream(
    input: BoxStream<'static, io::Result<Bytes>>,
) -> BoxStream<'static, io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(8);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let reader = BlockingStreamReader {
            handle,
            stream: input,
            current: Bytes::new(),
        };
        let mut decoder = flate2::read::MultiGzDecoder::new(reader);
        let mut buf = vec![0_u8; CHUNK];
        loop {
            match decoder.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(io::Error::new(
                        e.kind(),
                        format!("invalid gzip body: {e}"),
                    )));
                    break;
                }
            }
        }
    });
    ReceiverStream::new(rx).boxed()
}
