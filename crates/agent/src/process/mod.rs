//! The `process.Process` service.
//!
//! Life of a process started by `Start`:
//!
//! 1. A slot is reserved in the [`table::ProcessTable`] (the per-sandbox cap), the process is
//!    spawned ([`spawn`]) in its own session with the user's credentials, and the `Start`
//!    stream subscribes to its events before any output is read, so none is missed.
//! 2. A supervisor task starts one pump per output (stdout + stderr, or the PTY) that publishes
//!    `data` events as soon as bytes arrive, and waits for the process to exit.
//! 3. After the exit it lets the pumps drain what is left (bounded by [`DRAIN_GRACE`], because a
//!    background child may keep the pipe open forever), then publishes exactly one `end` event
//!    and moves the process to the exit history.
//!
//! If the `Start` request carried `Connect-Timeout-Ms`, a timer kills the process group at the
//! deadline whether or not the client is still connected (the SDK's `commands.run(timeout=…)`
//! relies on it). A client that disconnects only drops its subscription: the process keeps
//! running, as in E2B, until it ends or is killed.

pub mod io;
pub mod spawn;
pub mod status;
pub mod table;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bulkhead_envd::process::process_event::Event;
use bulkhead_envd::process::process_event::data_event::Output as OutputEvent;
use bulkhead_envd::process::{
    self as proto, ProcessEvent, ProcessSelector, StartRequest, process_input, process_selector,
    stream_input_request,
};
use bulkhead_envd::{Code, ConnectError};
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use self::io::InputError;
use self::spawn::{Output, SpawnError, SpawnSpec};
use self::table::{Found, ProcessHandle, Subscribe, Subscription, TableError};
use crate::connect::{self, CallContext};
use crate::paths;
use crate::state::SharedState;
use crate::users::User;

/// How long output may still be read after the process exited, when something else (a
/// background child) keeps its stdout/stderr or terminal open.
pub const DRAIN_GRACE: Duration = Duration::from_millis(100);
/// Default terminal size when `Start` asks for a PTY without a size.
const DEFAULT_PTY_SIZE: (u16, u16) = (80, 24);
/// `PATH` for processes when neither the agent's environment nor `/init` provide one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Errors of the process service.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The request lacks the process to start.
    #[error("The request must contain `process` with a non-empty `cmd`")]
    MissingCommand,
    /// The request lacks a selector.
    #[error("The request must select a process by `pid` or `tag`")]
    MissingSelector,
    /// No process with that pid.
    #[error(
        "Process with pid {0} not found (it may have exited; list running ones with `sandbox.commands.list()`)"
    )]
    PidNotFound(u32),
    /// No process with that tag.
    #[error(
        "Process with tag {0:?} not found (it may have exited; list running ones with `sandbox.commands.list()`)"
    )]
    TagNotFound(String),
    /// The process exited, so it takes no more input or signals.
    #[error("Process {0} has already exited")]
    Exited(u32),
    /// The working directory does not exist.
    #[error("cwd '{}' does not exist", .0.display())]
    CwdMissing(PathBuf),
    /// The working directory path is invalid.
    #[error(transparent)]
    Path(#[from] paths::PathError),
    /// Cap reached.
    #[error(transparent)]
    Full(#[from] TableError),
    /// Spawning failed.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// Input or resize failed.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The signal is not one the API allows.
    #[error("Unsupported signal: only SIGNAL_SIGTERM and SIGNAL_SIGKILL can be sent")]
    BadSignal,
    /// Sending the signal failed.
    #[error("Sending the signal to process {pid} failed")]
    Signal {
        /// Process id.
        pid: u32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// `Update` without `pty.size`.
    #[error("The request must contain `pty.size` with the new terminal size")]
    MissingSize,
    /// `StreamInput` data before `start`.
    #[error("The first message of StreamInput must be `start` selecting the process")]
    StreamNotStarted,
}

impl ProcessError {
    /// The Connect error sent to the client.
    pub fn to_connect(&self) -> ConnectError {
        let code = match self {
            ProcessError::MissingCommand
            | ProcessError::MissingSelector
            | ProcessError::CwdMissing(_)
            | ProcessError::Path(_)
            | ProcessError::BadSignal
            | ProcessError::MissingSize
            | ProcessError::StreamNotStarted => Code::InvalidArgument,
            ProcessError::PidNotFound(_)
            | ProcessError::TagNotFound(_)
            | ProcessError::Exited(_) => Code::NotFound,
            ProcessError::Full(_) => Code::ResourceExhausted,
            ProcessError::Spawn(SpawnError::PermissionDenied { .. }) => Code::PermissionDenied,
            ProcessError::Spawn(SpawnError::Pty(_) | SpawnError::Other { .. }) => Code::Internal,
            ProcessError::Spawn(_) => Code::InvalidArgument,
            ProcessError::Input(
                InputError::IsPty(_)
                | InputError::NotPty(_)
                | InputError::CloseOnPty(_)
                | InputError::StdinClosed(_),
            ) => Code::FailedPrecondition,
            ProcessError::Input(_) | ProcessError::Signal { .. } => Code::Internal,
        };
        ConnectError::new(code, crate::report::error_chain(self))
    }
}

impl From<ProcessError> for ConnectError {
    fn from(e: ProcessError) -> Self {
        e.to_connect()
    }
}

fn find(state: &SharedState, selector: Option<&ProcessSelector>) -> Result<Found, ProcessError> {
    match selector.and_then(|s| s.selector.as_ref()) {
        Some(process_selector::Selector::Pid(pid)) => state
            .processes
            .by_pid(*pid)
            .ok_or(ProcessError::PidNotFound(*pid)),
        Some(process_selector::Selector::Tag(tag)) => state
            .processes
            .by_tag(tag)
            .ok_or_else(|| ProcessError::TagNotFound(tag.clone())),
        None => Err(ProcessError::MissingSelector),
    }
}

fn find_running(
    state: &SharedState,
    selector: Option<&ProcessSelector>,
) -> Result<Arc<ProcessHandle>, ProcessError> {
    match find(state, selector)? {
        Found::Running(h) => Ok(h),
        Found::Exited(rec) => Err(ProcessError::Exited(rec.pid)),
    }
}

fn agent_path() -> String {
    std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.to_owned())
}

/// The environment of a new process: a clean base, then the sandbox-wide variables, then the
/// request's own (later entries win).
pub fn build_env(
    user: &User,
    cwd: &std::path::Path,
    global: &BTreeMap<String, String>,
    request: &BTreeMap<String, String>,
    pty: bool,
) -> Vec<(String, String)> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_owned(), agent_path());
    env.insert("HOME".to_owned(), user.home.to_string_lossy().into_owned());
    env.insert("USER".to_owned(), user.name.clone());
    env.insert("LOGNAME".to_owned(), user.name.clone());
    env.insert("SHELL".to_owned(), user.shell.clone());
    env.insert("PWD".to_owned(), cwd.to_string_lossy().into_owned());
    env.extend(global.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    if pty {
        env.entry("TERM".to_owned())
            .or_insert_with(|| "xterm-256color".to_owned());
    }
    env.into_iter().collect()
}

fn to_start_response(event: ProcessEvent) -> proto::StartResponse {
    proto::StartResponse { event: Some(event) }
}

fn to_connect_response(event: ProcessEvent) -> proto::ConnectResponse {
    proto::ConnectResponse { event: Some(event) }
}

/// Events of a subscription until (and including) `end`.
fn subscription_stream(
    sub: Subscription,
) -> futures::stream::BoxStream<'static, Result<ProcessEvent, ConnectError>> {
    futures::stream::unfold((sub, false), |(mut sub, done)| async move {
        if done {
            return None;
        }
        match sub.events.recv().await {
            Some(event) => {
                let is_end = matches!(event.event, Some(Event::End(_)));
                Some((Ok(event), (sub, is_end)))
            }
            None => Some((
                Err(ConnectError::internal(
                    "The process's event stream closed before the process ended",
                )),
                (sub, true),
            )),
        }
    })
    .boxed()
}

/// `Start`.
pub async fn start(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    let request: StartRequest = match connect::read_stream_request(&headers, body).await {
        Ok(r) => r,
        Err(response) => return *response,
    };
    let ctx = match CallContext::from_headers(&headers) {
        Ok(ctx) => ctx,
        Err(e) => return connect::stream_error_response(&e),
    };
    let (user, _) = match state.rpc_user(&headers) {
        Ok(u) => u,
        Err(e) => return connect::stream_error_response(&e),
    };
    match start_process(&state, &user, request, &ctx) {
        Ok((pid, sub)) => {
            let events = subscription_stream(sub)
                .map(|r| r.map(to_start_response))
                .boxed();
            connect::server_stream(
                &ctx,
                vec![to_start_response(ProcessEvent::start(pid))],
                events,
                || to_start_response(ProcessEvent::keepalive()),
            )
        }
        Err(e) => {
            tracing::info!(error = %crate::report::error_chain(&e), "start failed");
            connect::stream_error_response(&e.to_connect())
        }
    }
}

fn start_process(
    state: &SharedState,
    user: &User,
    request: StartRequest,
    ctx: &CallContext,
) -> Result<(u32, Subscription), ProcessError> {
    let config = request
        .process
        .filter(|p| !p.cmd.is_empty())
        .ok_or(ProcessError::MissingCommand)?;
    let reservation = state.processes.reserve()?;
    let settings = state.settings();
    let cwd = paths::resolve(
        config.cwd.as_deref().unwrap_or(""),
        &user.home,
        settings.default_workdir.as_deref(),
    )?;
    if !cwd.is_dir() {
        return Err(ProcessError::CwdMissing(cwd));
    }
    let pty = request.pty.map(|p| {
        p.size.map_or(DEFAULT_PTY_SIZE, |s| {
            (
                u16::try_from(s.cols)
                    .ok()
                    .filter(|c| *c > 0)
                    .unwrap_or(DEFAULT_PTY_SIZE.0),
                u16::try_from(s.rows)
                    .ok()
                    .filter(|r| *r > 0)
                    .unwrap_or(DEFAULT_PTY_SIZE.1),
            )
        })
    });
    let env = build_env(user, &cwd, &settings.env_vars, &config.envs, pty.is_some());
    let spawned = spawn::spawn(SpawnSpec {
        program: config.cmd.clone(),
        args: config.args.clone(),
        env,
        cwd,
        identity: user.identity(),
        stdin_pipe: request.stdin.unwrap_or(true),
        pty,
    })?;
    let pid = spawned.pid;
    let handle = Arc::new(ProcessHandle::new(
        pid,
        state.processes.next_seq(),
        config,
        request.tag,
        spawned.input,
    ));
    let Subscribe::Live(subscription) = handle.subscribe() else {
        unreachable!("a process that was just spawned has not ended");
    };
    reservation.commit(Arc::clone(&handle));
    tracing::debug!(pid, user = %user.name, "process started");

    if let Some(deadline) = ctx.deadline {
        let handle = Arc::clone(&handle);
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    tracing::debug!(pid = handle.pid, "deadline passed, killing the process group");
                    if let Err(e) = handle.signal_group(libc::SIGKILL) {
                        tracing::warn!(pid = handle.pid, error = %e, "killing at the deadline failed");
                    }
                }
                () = handle.wait_reaped() => {}
            }
        });
    }
    tokio::spawn(supervise(
        Arc::clone(&state.processes),
        handle,
        spawned.child,
        spawned.output,
    ));
    Ok((pid, subscription))
}

async fn supervise(
    table: Arc<table::ProcessTable>,
    handle: Arc<ProcessHandle>,
    mut child: tokio::process::Child,
    output: Output,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let pumps = match output {
        Output::Pipes(stdout, stderr) => vec![
            tokio::spawn(pump_pipe(
                stdout,
                OutputEvent::Stdout,
                Arc::clone(&handle),
                stop_rx.clone(),
            )),
            tokio::spawn(pump_pipe(
                stderr,
                OutputEvent::Stderr,
                Arc::clone(&handle),
                stop_rx.clone(),
            )),
        ],
        Output::Pty(master) => vec![tokio::spawn(pump_pty(
            master,
            Arc::clone(&handle),
            stop_rx.clone(),
        ))],
    };
    let status = child.wait().await;
    handle.mark_reaped();
    let mut pumps = std::pin::pin!(futures::future::join_all(pumps));
    if tokio::time::timeout(DRAIN_GRACE, pumps.as_mut())
        .await
        .is_err()
    {
        stop_tx.send_replace(true);
        pumps.await;
    }
    let end = match &status {
        Ok(s) => status::end_event(*s),
        Err(e) => status::wait_failed_event(e),
    };
    tracing::debug!(pid = handle.pid, status = %end.status, "process ended");
    table.record_exit(&handle, end.clone());
    handle.finish(end).await;
}

async fn pump_pipe<R>(
    mut reader: R,
    kind: fn(Bytes) -> OutputEvent,
    handle: Arc<ProcessHandle>,
    mut stop: watch::Receiver<bool>,
) where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut buf = vec![0_u8; 32 << 10];
    loop {
        // `biased`: data already in the pipe is read even after the stop signal.
        let n = tokio::select! {
            biased;
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        handle
            .publish(ProcessEvent::data(kind(Bytes::copy_from_slice(&buf[..n]))))
            .await;
    }
}

async fn pump_pty(
    master: Arc<io::PtyMaster>,
    handle: Arc<ProcessHandle>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = vec![0_u8; 16 << 10];
    loop {
        let n = tokio::select! {
            biased;
            read = master.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        handle
            .publish(ProcessEvent::data(OutputEvent::Pty(
                Bytes::copy_from_slice(&buf[..n]),
            )))
            .await;
    }
}

/// `Connect`: re-attach to a running process (or get the end of a recently exited one).
pub async fn connect_process(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    let request: proto::ConnectRequest = match connect::read_stream_request(&headers, body).await {
        Ok(r) => r,
        Err(response) => return *response,
    };
    let ctx = match CallContext::from_headers(&headers) {
        Ok(ctx) => ctx,
        Err(e) => return connect::stream_error_response(&e),
    };
    let keepalive = || to_connect_response(ProcessEvent::keepalive());
    let ended = |pid: u32, end| {
        vec![
            to_connect_response(ProcessEvent::start(pid)),
            to_connect_response(ProcessEvent::end(end)),
        ]
    };
    match find(&state, request.process.as_ref()) {
        Ok(Found::Running(handle)) => match handle.subscribe() {
            Subscribe::Live(sub) => {
                let events = subscription_stream(sub)
                    .map(|r| r.map(to_connect_response))
                    .boxed();
                connect::server_stream(
                    &ctx,
                    vec![to_connect_response(ProcessEvent::start(handle.pid))],
                    events,
                    keepalive,
                )
            }
            Subscribe::Ended(end) => connect::server_stream(
                &ctx,
                ended(handle.pid, end),
                futures::stream::empty().boxed(),
                keepalive,
            ),
        },
        Ok(Found::Exited(record)) => connect::server_stream(
            &ctx,
            ended(record.pid, record.end),
            futures::stream::empty().boxed(),
            keepalive,
        ),
        Err(e) => connect::stream_error_response(&e.to_connect()),
    }
}

/// `List`.
pub async fn list(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(&headers, body, |_: proto::ListRequest, _| async move {
        Ok(proto::ListResponse {
            processes: state.processes.running().iter().map(|h| h.info()).collect(),
        })
    })
    .await
}

async fn deliver_input(
    handle: &ProcessHandle,
    input: Option<proto::ProcessInput>,
) -> Result<(), ProcessError> {
    match input.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(data)) => {
            handle.input.write_stdin(handle.pid, &data).await?
        }
        Some(process_input::Input::Pty(data)) => handle.input.write_pty(handle.pid, &data).await?,
        None => {}
    }
    Ok(())
}

/// `SendInput`.
pub async fn send_input(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::SendInputRequest, _| async move {
            let handle = find_running(&state, req.process.as_ref())?;
            deliver_input(&handle, req.input).await?;
            Ok(proto::SendInputResponse {})
        },
    )
    .await
}

/// `StreamInput`: a client stream of `start` then `data`/`keepalive` messages.
pub async fn stream_input(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    let mut stream = match connect::ClientStream::new(&headers, body) {
        Ok(s) => s,
        Err(response) => return *response,
    };
    let result: Result<(), ConnectError> = async {
        let mut target: Option<Arc<ProcessHandle>> = None;
        while let Some(message) = stream.next::<proto::StreamInputRequest>().await? {
            match message.event {
                Some(stream_input_request::Event::Start(start)) => {
                    target = Some(find_running(&state, start.process.as_ref())?);
                }
                Some(stream_input_request::Event::Data(data)) => {
                    let handle = target.as_ref().ok_or(ProcessError::StreamNotStarted)?;
                    deliver_input(handle, data.input).await?;
                }
                Some(stream_input_request::Event::Keepalive(_)) | None => {}
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => connect::stream_single(&proto::StreamInputResponse {}),
        Err(e) => connect::stream_error_response(&e),
    }
}

/// `SendSignal`: SIGTERM or SIGKILL to the process group.
pub async fn send_signal(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::SendSignalRequest, _| async move {
            let signal = match req.signal() {
                proto::Signal::Sigkill => libc::SIGKILL,
                proto::Signal::Sigterm => libc::SIGTERM,
                proto::Signal::Unspecified => return Err(ProcessError::BadSignal.into()),
            };
            let handle = find_running(&state, req.process.as_ref())?;
            handle
                .signal_group(signal)
                .map_err(|source| ProcessError::Signal {
                    pid: handle.pid,
                    source,
                })?;
            Ok(proto::SendSignalResponse {})
        },
    )
    .await
}

/// `Update`: resize the PTY.
pub async fn update(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(&headers, body, |req: proto::UpdateRequest, _| async move {
        let handle = find_running(&state, req.process.as_ref())?;
        let size = req
            .pty
            .and_then(|p| p.size)
            .ok_or(ProcessError::MissingSize)?;
        let cols = u16::try_from(size.cols).unwrap_or(u16::MAX);
        let rows = u16::try_from(size.rows).unwrap_or(u16::MAX);
        handle
            .input
            .resize(handle.pid, cols, rows)
            .map_err(ProcessError::from)?;
        Ok(proto::UpdateResponse {})
    })
    .await
}

/// `CloseStdin`.
pub async fn close_stdin(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::CloseStdinRequest, _| async move {
            let handle = find_running(&state, req.process.as_ref())?;
            handle
                .input
                .close_stdin(handle.pid)
                .await
                .map_err(ProcessError::from)?;
            Ok(proto::CloseStdinResponse {})
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_layers() {
        let user = User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
            shell: "/bin/bash".into(),
            groups: vec![1000],
        };
        let global = BTreeMap::from([
            ("A".to_owned(), "global".to_owned()),
            ("B".to_owned(), "g".to_owned()),
        ]);
        let request = BTreeMap::from([
            ("A".to_owned(), "request".to_owned()),
            ("HOME".to_owned(), "/x".to_owned()),
        ]);
        let env: BTreeMap<_, _> =
            build_env(&user, std::path::Path::new("/tmp"), &global, &request, true)
                .into_iter()
                .collect();
        assert_eq!(env["A"], "request");
        assert_eq!(env["B"], "g");
        assert_eq!(env["HOME"], "/x");
        assert_eq!(env["USER"], "user");
        assert_eq!(env["LOGNAME"], "user");
        assert_eq!(env["SHELL"], "/bin/bash");
        assert_eq!(env["PWD"], "/tmp");
        assert_eq!(env["TERM"], "xterm-256color");
        assert!(env.contains_key("PATH"));
        let plain: BTreeMap<_, _> = build_env(
            &user,
            std::path::Path::new("/"),
            &BTreeMap::new(),
            &BTreeMap::new(),
            false,
        )
        .into_iter()
        .collect();
        assert!(!plain.contains_key("TERM"));
    }
}
