//! A minimal QMP client (QEMU's JSON control protocol on the slot's `qmp.sock`): one
//! connection per command sequence, which is all freeze and thaw need.

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
