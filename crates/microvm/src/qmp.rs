//! A minimal QMP client (QEMU's JSON control protocol on the slot's `qmp.sock`): one
//! connection per command sequence, which is all freeze and thaw need; [`Blocking`] for the
//! snapshot and restore sequences, which pass file descriptors.

use std::io;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Longest a QMP exchange may take (QEMU answers at once unless it is gone).
const ANSWER: Duration = Duration::from_secs(10);

/// Runs `commands` (name, arguments) in order; returns the last command's `return` value.
pub async fn execute(socket: &Path, commands: &[(&str, Value)]) -> io::Result<Value> {
    tokio::time::timeout(ANSWER, run(socket, commands))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "QEMU's QMP did not answer"))?
}

async fn run(socket: &Path, commands: &[(&str, Value)]) -> io::Result<Value> {
    let stream = UnixStream::connect(socket).await?;
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    // The greeting, then capabilities negotiation, then the commands.
    next_message(&mut lines).await?;
    let mut last = Value::Null;
    let all = std::iter::once(("qmp_capabilities", Value::Null))
        .chain(commands.iter().map(|(name, args)| (*name, args.clone())));
    for (name, args) in all {
        let mut req = json!({ "execute": name });
        if !args.is_null() {
            req["arguments"] = args;
        }
        w.write_all(format!("{req}\n").as_bytes()).await?;
        last = loop {
            let msg = next_message(&mut lines).await?;
            if let Some(ret) = msg.get("return") {
                break ret.clone();
            }
            if let Some(err) = msg.get("error") {
                return Err(io::Error::other(format!("QMP {name} failed: {err}")));
            }
            // Asynchronous events (STOP, RESUME, ...) come in between; skip them.
        };
    }
    Ok(last)
}

async fn next_message(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
) -> io::Result<Value> {
    let line = lines
        .next_line()
        .await?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "QMP connection closed"))?;
    serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A blocking QMP connection for the snapshot and restore sequences, which pass file
/// descriptors (`getfd` with `SCM_RIGHTS`): QEMU's seccomp filter forbids the `exec:` migration
/// URIs, and it never opens the snapshot files itself. Run it off the async runtime.
pub struct Blocking {
    stream: std::os::unix::net::UnixStream,
    reader: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl Blocking {
    /// Connects (retrying while QEMU creates the socket, up to `wait`) and negotiates.
    pub fn connect(socket: &Path, wait: Duration) -> io::Result<Blocking> {
        let deadline = std::time::Instant::now() + wait;
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        stream.set_read_timeout(Some(ANSWER))?;
        let reader = std::io::BufReader::new(stream.try_clone()?);
        let mut q = Blocking { stream, reader };
        q.message()?;
        q.execute("qmp_capabilities", Value::Null)?;
        Ok(q)
    }

    fn message(&mut self) -> io::Result<Value> {
        use std::io::BufRead;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "QMP connection closed",
            ));
        }
        serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn answer(&mut self, name: &str) -> io::Result<Value> {
        loop {
            let msg = self.message()?;
            if let Some(ret) = msg.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = msg.get("error") {
                return Err(io::Error::other(format!("QMP {name} failed: {err}")));
            }
        }
    }

    fn request(name: &str, args: Value) -> Vec<u8> {
        let mut req = json!({ "execute": name });
        if !args.is_null() {
            req["arguments"] = args;
        }
        format!("{req}\n").into_bytes()
    }

    pub fn execute(&mut self, name: &str, args: Value) -> io::Result<Value> {
        use std::io::Write;
        self.stream.write_all(&Self::request(name, args))?;
        self.answer(name)
    }

    /// Hands `fd` to QEMU under `name` (`getfd`), for a later `fd:NAME` migration URI.
    pub fn pass_fd(&mut self, fd: std::os::fd::BorrowedFd<'_>, name: &str) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let data = Self::request("getfd", json!({ "fdname": name }));
        let fds = [fd.as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(&data)];
        let sent = nix::sys::socket::sendmsg::<()>(
            self.stream.as_raw_fd(),
            &iov,
            &cmsg,
            nix::sys::socket::MsgFlags::empty(),
            None,
        )
        .map_err(io::Error::from)?;
        if sent != data.len() {
            return Err(io::Error::other("QMP getfd: short write"));
        }
        self.answer("getfd").map(|_| ())
    }

    /// Polls `command` every 2 ms until `done` says the answer is final, up to `limit`.
    pub fn poll(
        &mut self,
        command: &str,
        limit: Duration,
        mut done: impl FnMut(&Value) -> io::Result<bool>,
    ) -> io::Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let v = self.execute(command, Value::Null)?;
            if done(&v)? {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("QEMU's {command} did not reach the expected state: {v}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
