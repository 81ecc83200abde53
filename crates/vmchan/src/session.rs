//! One multiplexing session over a transport (the host's connection to QEMU's chardev socket,
//! or the guest's virtio-serial port). The host opens streams ([`HostSession::open`]); the guest
//! answers each by connecting a local stream to the agent ([`serve_guest`]). Each stream has a
//! credit window in each direction, so a stream whose reader is slow stalls only itself.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::ChanError;
use crate::frame::{Frame, HEADER_LEN, Kind, MAGIC, MAX_PAYLOAD};

/// Bytes a sender may have in flight per stream and direction before the receiver's credit.
pub const WINDOW: usize = 256 * 1024;

/// A local end of a stream: the agent connection in the guest, a duplex pipe on the host.
pub trait LocalIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> LocalIo for T {}
pub type Local = Box<dyn LocalIo>;

/// How the guest connects a stream the host opened (to the agent's listener).
pub type Acceptor =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<Local>> + Send>> + Send + Sync>;

enum Inbound {
    Data(Bytes),
    Eof,
}

struct Entry {
    inbound: mpsc::UnboundedSender<Inbound>,
    credit: Arc<Semaphore>,
}

struct Shared {
    out: mpsc::UnboundedSender<Frame>,
    streams: Mutex<HashMap<u32, Entry>>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Result<(), String>>>>,
    dead: AtomicBool,
}

impl Shared {
    fn new(out: mpsc::UnboundedSender<Frame>) -> Arc<Shared> {
        Arc::new(Shared {
            out,
            streams: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        })
    }

    fn send(&self, f: Frame) -> bool {
        self.out.send(f).is_ok()
    }

    /// Drops every stream (their pumps end) and fails every pending open.
    fn reset(&self) {
        for (_, e) in lock(&self.streams).drain() {
            e.credit.close();
        }
        lock(&self.pending).clear();
    }

    /// Registers stream `id` and starts moving bytes between `local` and the peer.
    fn attach(self: &Arc<Self>, id: u32, local: Local) {
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(WINDOW));
        lock(&self.streams).insert(
            id,
            Entry {
                inbound: tx,
                credit: credit.clone(),
            },
        );
        tokio::spawn(pump(self.clone(), id, local, credit, rx));
    }

    fn dispatch(self: &Arc<Self>, f: Frame, acceptor: Option<&Acceptor>) {
        match f.kind {
            Kind::Hello => self.reset(),
            Kind::Open => match acceptor {
                Some(acceptor) => {
                    let connect = acceptor();
                    let shared = self.clone();
                    tokio::spawn(async move {
                        match connect.await {
                            Ok(local) => {
                                shared.attach(f.stream, local);
                                shared.send(Frame::new(Kind::OpenOk, f.stream, Bytes::new()));
                            }
                            Err(e) => {
                                let why = format!("the agent did not accept the stream: {e}");
                                shared.send(Frame::new(Kind::Refuse, f.stream, why.into_bytes()));
                            }
                        }
                    });
                }
                None => {
                    self.send(Frame::new(
                        Kind::Refuse,
                        f.stream,
                        &b"the host does not accept streams"[..],
                    ));
                }
            },
            Kind::OpenOk | Kind::Refuse => {
                if let Some(tx) = lock(&self.pending).remove(&f.stream) {
                    let r = if f.kind == Kind::OpenOk {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&f.payload).into_owned())
                    };
                    let _ = tx.send(r);
                }
            }
            Kind::Data => {
                if let Some(e) = lock(&self.streams).get(&f.stream) {
                    let _ = e.inbound.send(Inbound::Data(f.payload));
                }
            }
            Kind::Credit => {
                if let (Some(e), Some(n)) = (lock(&self.streams).get(&f.stream), f.credit_amount())
                {
                    e.credit.add_permits(n as usize);
                }
            }
            Kind::Eof => {
                if let Some(e) = lock(&self.streams).get(&f.stream) {
                    let _ = e.inbound.send(Inbound::Eof);
                }
            }
            Kind::Close => {
                if let Some(e) = lock(&self.streams).remove(&f.stream) {
                    e.credit.close();
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Moves one stream's bytes until both directions ended or the stream is aborted.
async fn pump(
    shared: Arc<Shared>,
    id: u32,
    local: Local,
    credit: Arc<Semaphore>,
    mut inbound: mpsc::UnboundedReceiver<Inbound>,
) {
    let (mut lr, mut lw) = tokio::io::split(local);
    let up = {
        let shared = shared.clone();
        let credit = credit.clone();
        async move {
            let mut buf = vec![0u8; MAX_PAYLOAD];
            loop {
                let n = match lr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                match credit.acquire_many(n as u32).await {
                    Ok(p) => p.forget(),
                    Err(_) => return,
                }
                let data = Bytes::copy_from_slice(&buf[..n]);
                if !shared.send(Frame::new(Kind::Data, id, data)) {
                    return;
                }
            }
            shared.send(Frame::new(Kind::Eof, id, Bytes::new()));
        }
    };
    // Returns true when the stream was aborted (by the peer, a reset, or a local write error).
    let down = {
        let shared = shared.clone();
        async move {
            while let Some(m) = inbound.recv().await {
                match m {
                    Inbound::Data(b) => {
                        if lw.write_all(&b).await.is_err() {
                            shared.send(Frame::new(Kind::Close, id, Bytes::new()));
                            return true;
                        }
                        shared.send(Frame::credit(id, b.len() as u32));
                    }
                    Inbound::Eof => {
                        let _ = lw.shutdown().await;
                        return false;
                    }
                }
            }
            let _ = lw.shutdown().await;
            true
        }
    };
    tokio::pin!(up, down);
    tokio::select! {
        () = &mut up => { (&mut down).await; }
        aborted = &mut down => if !aborted { (&mut up).await; },
    }
    // Forget the stream unless a reset already replaced it with a new one under the same id.
    let mut streams = lock(&shared.streams);
    if streams
        .get(&id)
        .is_some_and(|e| Arc::ptr_eq(&e.credit, &credit))
    {
        streams.remove(&id);
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut rx: mpsc::UnboundedReceiver<Frame>, mut w: W) {
    let mut buf = BytesMut::new();
    while let Some(f) = rx.recv().await {
        f.encode(&mut buf);
        // Batch what is already queued into one write.
        while buf.len() < WINDOW {
            match rx.try_recv() {
                Ok(f) => f.encode(&mut buf),
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
}

/// The host's side of a session. Dropping it ends the session.
pub struct HostSession {
    shared: Arc<Shared>,
    next_id: AtomicU32,
    tasks: [JoinHandle<()>; 2],
}

impl HostSession {
    /// Starts a session over a fresh transport connection. `session_id` should differ from
    /// any earlier session's (the guest may still hold frames of an old one); stream ids are
    /// derived from it.
    pub fn start<R, W>(r: R, w: W, session_id: u64) -> HostSession
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Shared::new(tx);
        shared.send(Frame::new(
            Kind::Hello,
            0,
            session_id.to_be_bytes().to_vec(),
        ));
        let writer = tokio::spawn(write_loop(rx, w));
        let reader = {
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = read_loop(&shared, r, None).await {
                    // Expected when the VM stops; the next connect opens a new session.
                    tracing::debug!("agent channel closed: {e}");
                }
                shared.dead.store(true, Ordering::SeqCst);
                shared.reset();
            })
        };
        // Stream ids of different sessions should not meet; 0 is the session's own.
        let first = (session_id as u32 & 0x7fff_ffff).max(1);
        HostSession {
            shared,
            next_id: AtomicU32::new(first),
            tasks: [writer, reader],
        }
    }

    /// False once the transport has closed; open a new session then.
    pub fn is_alive(&self) -> bool {
        !self.shared.dead.load(Ordering::SeqCst) && !self.tasks[1].is_finished()
    }

    /// Opens a stream to the agent; the returned pipe carries its bytes.
    pub async fn open(&self) -> Result<DuplexStream, ChanError> {
        let mut id = self.next_id.fetch_add(1, Ordering::SeqCst);
        if id == 0 {
            id = self.next_id.fetch_add(1, Ordering::SeqCst);
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, tx);
        if self.shared.dead.load(Ordering::SeqCst)
            || !self.shared.send(Frame::new(Kind::Open, id, Bytes::new()))
        {
            lock(&self.shared.pending).remove(&id);
            return Err(ChanError::Closed);
        }
        match rx.await {
            Ok(Ok(())) => {
                let (ours, theirs) = tokio::io::duplex(WINDOW);
                self.shared.attach(id, Box::new(theirs));
                Ok(ours)
            }
            Ok(Err(why)) => Err(ChanError::Refused(why)),
            Err(_) => Err(ChanError::Closed),
        }
    }
}

impl Drop for HostSession {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.shared.reset();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: &Arc<Shared>,
    mut r: R,
    acceptor: Option<&Acceptor>,
) -> Result<(), ChanError> {
    let mut buf = BytesMut::with_capacity(2 * MAX_PAYLOAD);
    loop {
        loop {
            match Frame::decode(&mut buf) {
                Ok(Some(f)) => shared.dispatch(f, acceptor),
                Ok(None) => break,
                // The guest resynchronises on the next HELLO (a host that died mid-frame left
                // a partial one); the host has no such recovery and reconnects.
                Err(e) if acceptor.is_some() => {
                    tracing::warn!("agent channel: {e}; waiting for the host's next session");
                    shared.reset();
                    skip_to_hello(&mut buf);
                    if buf.is_empty() || Frame::decode(&mut buf.clone()).is_err() {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if r.read_buf(&mut buf).await.map_err(ChanError::Io)? == 0 {
            return Ok(());
        }
    }
}

/// Drops bytes up to the next HELLO header (or keeps the tail that could start one).
fn skip_to_hello(buf: &mut BytesMut) {
    let mut hello = Vec::with_capacity(HEADER_LEN);
    hello.extend_from_slice(&MAGIC.to_be_bytes());
    hello.push(Kind::Hello as u8);
    hello.extend_from_slice(&0u32.to_be_bytes());
    hello.extend_from_slice(&8u32.to_be_bytes());
    let at = buf
        .windows(HEADER_LEN)
        .skip(1)
        .position(|w| w == hello.as_slice())
        .map(|p| p + 1);
    let drop = at.unwrap_or_else(|| buf.len().saturating_sub(HEADER_LEN - 1));
    let _ = buf.split_to(drop);
}

/// Serves the guest's side of sessions over one transport until it reports end of file (the
/// host disconnected; a virtio-serial port then reads 0) or fails. Every stream the host
/// opens is connected with `acceptor`. The caller loops to wait for the host's next session.
pub async fn serve_guest<R, W>(r: R, w: W, acceptor: Acceptor) -> Result<(), ChanError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Shared::new(tx);
    let writer = tokio::spawn(write_loop(rx, w));
    let r = read_loop(&shared, r, Some(&acceptor)).await;
    shared.reset();
    writer.abort();
    r
}
