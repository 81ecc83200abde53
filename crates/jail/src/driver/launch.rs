//! Launcher I/O: run the launcher process with one request on stdin and read its one-line
//! reply (see [`crate::spec`]), with a deadline. Leaf module.

use std::ffi::OsString;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::spec::{LaunchReply, LaunchRequest};

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
}

/// Run `launcher` with `req` and wait at most `timeout` for its reply.
pub(super) async fn run_launcher(
    launcher: &[OsString],
    req: &LaunchRequest,
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
    let json = serde_json::to_vec(req).expect("launch request serialises");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin.write_all(&json).await.map_err(LaunchError::Send)?;
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
