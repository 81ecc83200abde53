//! Launcher I/O: hand one request to the launcher and read its one-line reply (see
//! [`crate::spec`]), with a deadline. Requests go to a long-lived launcher, the zygote (see
//! [`crate::zygote`]), started on first use and again after it died; when it cannot run, the
//! launcher is executed for the one request as before. Leaf module.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::spec::{LaunchReply, LaunchRequest};
use crate::zygote;

/// Why the launcher did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("Cannot run the jail launcher {program:?}: check the server's installation")]
    Spawn {
        program: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot send the launch request to the jail launcher")]
    Send(#[source] std::io::Error),
    #[error("Cannot wait for the jail launcher")]
    Wait(#[source] std::io::Error),
    #[error(
        "The jail launcher did not answer within {} s: the host may be overloaded; retry",
        .0.as_secs_f64()
    )]
    Timeout(Duration),
    #[error(
        "The jail launcher gave no reply ({status}); stderr: {stderr}: check that the launcher \
         and the server come from the same build"
    )]
    NoReply {
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// The launcher's own report (`<step>: <reason>`), as it came over its pipe.
    #[error("Sandbox setup failed: {0}")]
    Failed(String),
    #[error("Cannot create the idmapped template view: {0}")]
    Idmap(String),
    #[error(
        "The jail launcher answered {0:?}, which this request does not expect: check that the \
         launcher and the server come from the same build"
    )]
    Unexpected(LaunchReply),
    #[error("Jail slot {0} is already taken")]
    SlotTaken(u32),
    #[error(
        "The jail launcher gave no reply (its errors are in the server's log): check that the \
         launcher and the server come from the same build"
    )]
    NoAnswer,
}

/// The driver's launcher: the configured command, and the zygote it runs as.
pub(crate) struct Launcher {
    program: Vec<OsString>,
    zygote: Mutex<Option<Zygote>>,
}

/// A running zygote: our end of its request socket, and the process (killed when dropped).
struct Zygote {
    sock: OwnedFd,
    _child: tokio::process::Child,
}

impl Launcher {
    pub(crate) fn new(program: Vec<OsString>) -> Launcher {
        Launcher {
            program,
            zygote: Mutex::new(None),
        }
    }

    /// Run `req` and wait at most `timeout` for the reply.
    pub(crate) async fn run(
        &self,
        req: &LaunchRequest,
        timeout: Duration,
    ) -> Result<LaunchReply, LaunchError> {
        let json = serde_json::to_vec(req).expect("launch request serialises");
        match self.submit(&json) {
            Some(reply) => read_reply(reply, timeout).await,
            None => run_launcher(&self.program, &json, timeout).await,
        }
    }

    /// Hand `json` to the zygote (starting it if needed); returns the reply pipe's read end,
    /// or None when no zygote takes requests (the caller then executes the launcher).
    fn submit(&self, json: &[u8]) -> Option<OwnedFd> {
        if json.len() > zygote::MAX_REQUEST {
            return None;
        }
        let mut z = self.zygote.lock().expect("zygote lock poisoned");
        // Twice: a zygote that died since the last request is replaced once.
        for _ in 0..2 {
            if z.is_none() {
                match spawn_zygote(&self.program) {
                    Ok(started) => *z = Some(started),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the launcher zygote; executing the launcher per request");
                        return None;
                    }
                }
            }
            let sock = z.as_ref().expect("set above").sock.as_raw_fd();
            let (r, w) = match reply_pipe() {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot make a pipe for the launcher's reply");
                    return None;
                }
            };
            match zygote::send_with_fd(sock, json, w.as_raw_fd()) {
                Ok(()) => return Some(r),
                // Behind (its socket buffer is full): this one request is executed instead.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
                Err(e) => {
                    tracing::warn!(error = %e, "the launcher zygote is gone; starting a new one");
                    *z = None;
                }
            }
        }
        None
    }
}

fn spawn_zygote(program: &[OsString]) -> std::io::Result<Zygote> {
    let (ours, theirs) = zygote::seqpacket_pair()?;
    let child = tokio::process::Command::new(&program[0])
        .args(&program[1..])
        .arg(zygote::ZYGOTE_FLAG)
        .env_clear()
        .stdin(std::process::Stdio::from(theirs))
        .stdout(std::process::Stdio::null())
        // Its (and its request handlers') complaints go to the server's log.
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    Ok(Zygote {
        sock: ours,
        _child: child,
    })
}

/// A pipe for one reply (close-on-exec): our read end, which `read_reply` makes non-blocking
/// for the runtime, and the write end the request handler gets.
fn reply_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = std::io::pipe()?;
    Ok((r.into(), w.into()))
}

/// Read the reply until the handler closes the pipe (it exits after replying).
async fn read_reply(reply: OwnedFd, timeout: Duration) -> Result<LaunchReply, LaunchError> {
    let mut rx =
        tokio::net::unix::pipe::Receiver::from_owned_fd(reply).map_err(LaunchError::Wait)?;
    let mut out = Vec::new();
    tokio::time::timeout(timeout, rx.read_to_end(&mut out))
        .await
        .map_err(|_| LaunchError::Timeout(timeout))?
        .map_err(LaunchError::Wait)?;
    LaunchReply::parse(&String::from_utf8_lossy(&out)).ok_or(LaunchError::NoAnswer)
}

/// Execute `launcher` with the request `json` and wait at most `timeout` for its reply.
async fn run_launcher(
    launcher: &[OsString],
    json: &[u8],
    timeout: Duration,
) -> Result<LaunchReply, LaunchError> {
    let mut cmd = tokio::process::Command::new(&launcher[0]);
    cmd.args(&launcher[1..])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        program: launcher[0].clone(),
        source,
    })?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin.write_all(json).await.map_err(LaunchError::Send)?;
    drop(stdin);
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| LaunchError::Timeout(timeout))?
        .map_err(LaunchError::Wait)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    LaunchReply::parse(&stdout).ok_or_else(|| LaunchError::NoReply {
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}
