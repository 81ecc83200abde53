//! One Jupyter kernel process and the agent's ZeroMQ connection to it.
//!
//! Startup: reserve five loopback ports, write a connection file (HMAC-SHA256 key), spawn the
//! manifest's argv in its own session as the kernel user, connect shell (DEALER with the
//! session's identity), control (DEALER) and iopub (SUB), then repeat `kernel_info` until both
//! the reply and an iopub message for it arrived (a SUB socket drops what was published before
//! its subscription reached the kernel), and finally run a silent warm-up cell.
//!
//! Reader tasks turn incoming shell and iopub frames into [`KernelMessage`]s (content kept as
//! raw JSON, so unknown MIME types and odd payloads pass through untouched) on one channel; a
//! wait task reaps the process and publishes how it ended.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, InterruptRequest, JupyterMessage, KernelInfoRequest,
};
use jupyter_zmq_client::{Connection, DealerSendConnection, RawMessage};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::cell::{CellState, Channel, KernelMessage};
use super::manifest::{InterruptMode, LanguageSpec};
use crate::process::spawn::{Output, SpawnError, SpawnSpec, spawn};
use crate::users::Identity;

/// Lines of kernel stderr kept for error messages.
const STDERR_TAIL: usize = 20;
/// Messages buffered between the socket readers and the executor.
const CHANNEL_CAPACITY: usize = 1024;
/// Default settle time of Deno kernels.
const DENO_SETTLE: Duration = Duration::from_millis(20);
/// How long output already sent by a kernel that just died may take to arrive.
const EXIT_DRAIN: Duration = Duration::from_millis(100);

/// Errors starting or talking to a kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Reserving ports or writing the connection file failed.
    #[error("Could not prepare the kernel's connection file in {dir}")]
    Prepare {
        /// Runtime directory.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("Could not start the {language} kernel")]
    Spawn {
        /// Language.
        language: String,
        /// Cause.
        #[source]
        source: SpawnError,
    },
    /// The process exited before it answered.
    #[error("The {language} kernel exited during startup ({status}){stderr}")]
    ExitedDuringStartup {
        /// Language.
        language: String,
        /// How it ended.
        status: String,
        /// The end of its stderr, prefixed with ": ", or empty.
        stderr: String,
    },
    /// No `kernel_info_reply` in time.
    #[error(
        "The {language} kernel did not answer within {seconds} s{stderr} (is the template's kernel installed correctly?)"
    )]
    StartTimeout {
        /// Language.
        language: String,
        /// Timeout.
        seconds: u64,
        /// The end of its stderr, prefixed with ": ", or empty.
        stderr: String,
    },
    /// A ZeroMQ operation failed.
    #[error("ZeroMQ communication with the kernel failed")]
    Zmq(#[from] jupyter_zmq_client::RuntimeError),
    /// The process died.
    #[error("The kernel died ({0})")]
    Died(String),
    /// A helper cell did not finish in time.
    #[error("The kernel did not finish an internal cell within {0} s")]
    Timeout(u64),
}

impl KernelError {
    /// Whether the kernel exited because one of its ports was taken meanwhile.
    pub fn is_port_race(&self) -> bool {
        matches!(self, Self::ExitedDuringStartup { stderr, .. } if stderr.contains("Address already in use"))
    }
}

/// What the executor waits for.
#[derive(Debug)]
pub enum Event {
    /// A message.
    Message(KernelMessage),
    /// The process ended (description).
    Exited(String),
    /// Nothing happened within the wait.
    Idle,
}

/// What is needed to start a kernel.
pub struct StartSpec<'a> {
    /// Canonical language.
    pub language: &'a str,
    /// Manifest entry.
    pub spec: &'a LanguageSpec,
    /// Working directory.
    pub cwd: &'a Path,
    /// Complete environment.
    pub env: Vec<(String, String)>,
    /// Credentials.
    pub identity: Identity,
    /// Where connection files go.
    pub runtime_dir: &'a Path,
    /// Deadline for the first `kernel_info_reply`.
    pub start_timeout: Duration,
    /// Warm-up cell (empty: none).
    pub warmup: &'a str,
}

/// Signals the kernel's process group without owning the kernel (for restart/delete while an
/// execution holds it).
#[derive(Debug, Clone)]
pub struct KillHandle {
    pid: Pid,
    exit: watch::Receiver<Option<String>>,
}

impl KillHandle {
    /// SIGKILL to the kernel's process group, unless it is known to be gone.
    pub fn kill(&self) {
        if self.exit.borrow().is_none() {
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
    }
}

/// The kernel process and what belongs to it; dropping it kills the process group.
struct Process {
    language: String,
    pid: Pid,
    exit: watch::Receiver<Option<String>>,
    connection_file: PathBuf,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    tasks: Vec<JoinHandle<()>>,
    stderr_task: Option<JoinHandle<()>>,
}

impl Drop for Process {
    fn drop(&mut self) {
        // Kill the whole group: the kernel and whatever user code started in it. The wait task
        // keeps running until the process is reaped.
        KillHandle {
            pid: self.pid,
            exit: self.exit.clone(),
        }
        .kill();
        for task in self.tasks.iter().chain(&self.stderr_task) {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.connection_file);
    }
}

impl Process {
    fn exited(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    async fn startup_failure(&self, status: Option<String>, seconds: u64) -> KernelError {
        let status = status.or_else(|| self.exited());
        if status.is_some() {
            // The exit may be seen before the last stderr lines were read; they explain it.
            let deadline = Instant::now() + Duration::from_millis(300);
            while self.stderr_task.as_ref().is_some_and(|t| !t.is_finished())
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let tail = self
            .stderr_tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        let stderr = if tail.is_empty() {
            String::new()
        } else {
            format!(": {tail}")
        };
        match status {
            Some(status) => KernelError::ExitedDuringStartup {
                language: self.language.clone(),
                status,
                stderr,
            },
            None => KernelError::StartTimeout {
                language: self.language.clone(),
                seconds,
                stderr,
            },
        }
    }
}

/// A running kernel.
pub struct Kernel {
    process: Process,
    shell: DealerSendConnection,
    control: DealerSendConnection,
    messages: mpsc::Receiver<KernelMessage>,
    interrupt_mode: InterruptMode,
    /// Quiet time after a cell's end before it counts as finished (see [`CellState`]).
    settle: Duration,
}

fn exit_description(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(9)) => {
                "killed by SIGKILL, e.g. by the out-of-memory killer or a restart".to_owned()
            }
            (None, Some(sig)) => format!(
                "killed by signal {}",
                Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.as_str().to_owned())
            ),
            (None, None) => "ended".to_owned(),
        },
        Err(e) => format!("could not wait for it: {e}"),
    }
}

fn parse_raw(raw: &RawMessage, channel: Channel) -> Option<KernelMessage> {
    let header: Value = serde_json::from_slice(raw.jparts.first()?).ok()?;
    let parent: Value = serde_json::from_slice(raw.jparts.get(1)?).unwrap_or(Value::Null);
    let content: Value = serde_json::from_slice(raw.jparts.get(3)?).ok()?;
    Some(KernelMessage {
        channel,
        msg_type: header.get("msg_type")?.as_str()?.to_owned(),
        parent_id: parent
            .get("msg_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        date: header
            .get("date")
            .and_then(Value::as_str)
            .map(str::to_owned),
        content,
    })
}

async fn read_loop<S: zeromq::SocketRecv>(
    mut conn: Connection<S>,
    channel: Channel,
    tx: mpsc::Sender<KernelMessage>,
) {
    loop {
        let frames = match conn.socket.recv().await {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(?channel, error = %e, "kernel socket closed");
                return;
            }
        };
        match RawMessage::from_multipart(frames, &conn.mac) {
            Ok(raw) => {
                if let Some(message) = parse_raw(&raw, channel)
                    && tx.send(message).await.is_err()
                {
                    return;
                }
            }
            Err(e) => tracing::warn!(?channel, error = %e, "dropped an invalid kernel message"),
        }
    }
}

/// Waits until something accepts TCP connections on `port` (the kernel bound its sockets), so the
/// ZeroMQ connects do not sit in their exponential back-off.
async fn wait_for_port(
    port: u16,
    exit: &mut watch::Receiver<Option<String>>,
    deadline: Instant,
) -> Result<(), Option<String>> {
    loop {
        if let Some(status) = exit.borrow().clone() {
            return Err(Some(status));
        }
        if Instant::now() >= deadline {
            return Err(None);
        }
        if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

impl Kernel {
    /// Starts a kernel and waits until it is ready (and warmed up).
    pub async fn start(start: StartSpec<'_>) -> Result<Self, KernelError> {
        let began = Instant::now();
        let language = start.language.to_owned();
        let prepare = |source| KernelError::Prepare {
            dir: start.runtime_dir.to_owned(),
            source,
        };
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (ports, listeners) = jupyter_zmq_client::peek_ports_with_listeners(ip, 5)
            .await
            .map_err(|e| prepare(std::io::Error::other(e)))?;
        let info = ConnectionInfo {
            transport: jupyter_protocol::connection_info::Transport::TCP,
            ip: ip.to_string(),
            stdin_port: ports[0],
            control_port: ports[1],
            hb_port: ports[2],
            shell_port: ports[3],
            iopub_port: ports[4],
            signature_scheme: "hmac-sha256".to_owned(),
            key: uuid::Uuid::new_v4().simple().to_string(),
            kernel_name: Some(language.clone()),
        };
        let connection_file =
            write_connection_file(start.runtime_dir, &info, &start.identity).map_err(prepare)?;

        let argv = start.spec.command(&connection_file);
        let spawned = spawn(SpawnSpec {
            program: argv[0].clone(),
            args: argv[1..].to_vec(),
            env: start.env,
            cwd: start.cwd.to_owned(),
            identity: start.identity,
            stdin_pipe: false,
            pty: None,
        });
        // The kernel binds these ports as its first action; holding them any longer would make
        // that fail.
        drop(listeners);
        let spawned = match spawned {
            Ok(s) => s,
            Err(source) => {
                let _ = std::fs::remove_file(&connection_file);
                return Err(KernelError::Spawn { language, source });
            }
        };
        let pid = Pid::from_raw(i32::try_from(spawned.pid).unwrap_or(i32::MAX));
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut tasks = Vec::new();
        let mut stderr_task = None;
        if let Output::Pipes(stdout, stderr) = spawned.output {
            tasks.push(tokio::spawn(log_lines(stdout, language.clone(), None)));
            stderr_task = Some(tokio::spawn(log_lines(
                stderr,
                language.clone(),
                Some(Arc::clone(&stderr_tail)),
            )));
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let mut child = spawned.child;
        // Not in `tasks`: it must outlive the kernel handle to reap the process.
        tokio::spawn(async move {
            let status = child.wait().await;
            exit_tx.send_replace(Some(exit_description(status)));
        });

        let mut process = Process {
            language: language.clone(),
            pid,
            exit: exit_rx,
            connection_file,
            stderr_tail,
            tasks,
            stderr_task,
        };
        let deadline = began + start.start_timeout;
        let seconds = start.start_timeout.as_secs();
        let mut exit = process.exit.clone();
        // Kernels bind their sockets one after another (ipykernel: iopub first), so wait for
        // every port we connect to.
        for port in [info.iopub_port, info.shell_port, info.control_port] {
            if let Err(status) = wait_for_port(port, &mut exit, deadline).await {
                return Err(process.startup_failure(status, seconds).await);
            }
        }
        let mut session = uuid::Uuid::new_v4().to_string();
        let info_ref = &info;
        let connect = |session: String| async move {
            let info = info_ref;
            let session = session.as_str();
            let identity = jupyter_zmq_client::peer_identity_for_session(session)?;
            tokio::try_join!(
                jupyter_zmq_client::create_client_shell_connection_with_identity(
                    info, session, identity
                ),
                jupyter_zmq_client::create_client_control_connection(info, session),
                jupyter_zmq_client::create_client_iopub_connection(info, "", session),
            )
        };
        // A kernel still setting up a socket can reset the ZMQ handshake; retry until the
        // deadline instead of failing the context (seen under load on cold starts).
        let (shell, control, iopub) = loop {
            let attempt = tokio::select! {
                r = connect(session.clone()) => r,
                () = tokio::time::sleep_until(deadline.into()) => {
                    return Err(process.startup_failure(None, seconds).await);
                }
            };
            match attempt {
                Ok(sockets) => break sockets,
                Err(e) => {
                    if Instant::now() >= deadline || process.exit.borrow().is_some() {
                        return Err(e.into());
                    }
                    tracing::debug!(language, error = %e, "kernel handshake failed; retrying");
                    // A fresh identity: the kernel's ROUTER may still hold the old one.
                    session = uuid::Uuid::new_v4().to_string();
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        };
        let (shell_send, shell_recv) = shell.split();
        let (control_send, control_recv) = control.split();
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        process.tasks.push(tokio::spawn(read_loop(
            shell_recv,
            Channel::Shell,
            tx.clone(),
        )));
        process
            .tasks
            .push(tokio::spawn(read_loop(iopub, Channel::Iopub, tx)));
        // Interrupt replies are not needed, but must be consumed.
        process.tasks.push(tokio::spawn(async move {
            let mut control_recv = control_recv;
            while zeromq::SocketRecv::recv(&mut control_recv.socket)
                .await
                .is_ok()
            {}
        }));
        let mut kernel = Self {
            process,
            shell: shell_send,
            control: control_send,
            messages: rx,
            interrupt_mode: start.spec.interrupt_mode,
            settle: Duration::ZERO,
        };

        let implementation = kernel.handshake(deadline, seconds).await?;
        kernel.settle = match start.spec.settle_ms {
            Some(ms) => Duration::from_millis(ms),
            // Deno (2.9) publishes `execute_result` concurrently with `status: idle`: about one
            // cell in ten had its result arrive ~1 ms after idle. Wait a little for stragglers.
            None if implementation.to_ascii_lowercase().contains("deno") => DENO_SETTLE,
            None => Duration::ZERO,
        };
        let ready = began.elapsed();
        if !start.warmup.is_empty() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match kernel
                .run_silent(start.warmup, remaining.max(Duration::from_secs(5)))
                .await
            {
                Ok(None) => {}
                Ok(Some(e)) => {
                    tracing::warn!(language, error = %e.value, "the kernel's warm-up cell failed")
                }
                Err(KernelError::Died(status)) => {
                    return Err(kernel.process.startup_failure(Some(status), seconds).await);
                }
                Err(e) => return Err(e),
            }
        }
        tracing::info!(
            language,
            pid = pid.as_raw(),
            ready_ms = ready.as_millis(),
            warm_ms = began.elapsed().as_millis(),
            "kernel started"
        );
        Ok(kernel)
    }

    /// Returns the kernel's `implementation` name.
    async fn handshake(&mut self, deadline: Instant, seconds: u64) -> Result<String, KernelError> {
        loop {
            let request: JupyterMessage = KernelInfoRequest {}.into();
            let id = request.header.msg_id.clone();
            self.shell.send(request).await?;
            let (mut replied, mut broadcast) = (false, false);
            let mut implementation = String::new();
            let mut give_up_at = deadline;
            while !(replied && broadcast) {
                let wait = give_up_at.saturating_duration_since(Instant::now());
                match self.next_event(wait).await {
                    Event::Message(m) if m.parent_id.as_deref() == Some(id.as_str()) => {
                        match m.channel {
                            Channel::Shell => {
                                replied = true;
                                implementation = m
                                    .content
                                    .get("implementation")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_owned();
                                // The reply came, so the kernel runs; give the subscription a
                                // moment before asking again.
                                give_up_at =
                                    (Instant::now() + Duration::from_millis(300)).min(deadline);
                            }
                            Channel::Iopub => broadcast = true,
                        }
                    }
                    Event::Message(_) => {}
                    Event::Exited(status) => {
                        return Err(self.process.startup_failure(Some(status), seconds).await);
                    }
                    Event::Idle if Instant::now() >= deadline => {
                        return Err(self.process.startup_failure(None, seconds).await);
                    }
                    Event::Idle => break,
                }
            }
            if replied && broadcast {
                return Ok(implementation);
            }
        }
    }

    /// Quiet time after a cell's end before it counts as finished.
    pub fn settle(&self) -> Duration {
        self.settle
    }

    /// A handle that can kill this kernel from elsewhere.
    pub fn kill_handle(&self) -> KillHandle {
        KillHandle {
            pid: self.process.pid,
            exit: self.process.exit.clone(),
        }
    }

    /// How the process ended, if it has.
    pub fn exited(&self) -> Option<String> {
        self.process.exited()
    }

    /// The next message, the process's end, or [`Event::Idle`] after `wait`.
    pub async fn next_event(&mut self, wait: Duration) -> Event {
        let message = tokio::select! {
            biased;
            m = self.messages.recv() => m,
            status = self.process.exit.wait_for(Option::is_some) => {
                let status = status.ok().and_then(|s| s.clone()).unwrap_or_else(|| "ended".to_owned());
                return Event::Exited(status);
            }
            () = tokio::time::sleep(wait) => return Event::Idle,
        };
        match message {
            Some(m) => Event::Message(m),
            // The readers only stop when the sockets fail, i.e. the kernel is gone.
            None => Event::Exited(self.wait_exit().await),
        }
    }

    async fn wait_exit(&mut self) -> String {
        match self.process.exit.wait_for(Option::is_some).await {
            Ok(s) => s.clone().unwrap_or_default(),
            Err(_) => "ended".to_owned(),
        }
    }

    /// After the process ended: the messages it sent before dying that are still on their way.
    pub async fn drain_after_exit(&mut self) -> Vec<KernelMessage> {
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + EXIT_DRAIN;
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, self.messages.recv()).await {
            out.push(m);
        }
        out
    }

    /// Throws away messages of earlier cells that are still queued.
    pub fn discard_pending(&mut self) {
        while self.messages.try_recv().is_ok() {}
    }

    /// Sends an `execute_request`; returns its message id.
    pub async fn execute(&mut self, code: &str, silent: bool) -> Result<String, KernelError> {
        let request: JupyterMessage = ExecuteRequest {
            code: code.to_owned(),
            silent,
            store_history: !silent,
            user_expressions: None,
            allow_stdin: false,
            stop_on_error: true,
        }
        .into();
        let id = request.header.msg_id.clone();
        self.shell.send(request).await?;
        Ok(id)
    }

    /// Interrupts the running cell the way the kernelspec asks.
    pub async fn interrupt(&mut self) {
        match self.interrupt_mode {
            InterruptMode::Message => {
                let request: JupyterMessage = InterruptRequest {}.into();
                if let Err(e) = self.control.send(request).await {
                    tracing::warn!(error = %e, "could not send interrupt_request");
                }
            }
            InterruptMode::Signal => {
                if self.exited().is_none()
                    && let Err(e) = killpg(self.process.pid, Signal::SIGINT)
                {
                    tracing::warn!(error = %e, "could not send SIGINT to the kernel");
                }
            }
        }
    }

    /// Runs a cell silently and waits for it; returns its first error. On timeout the kernel is
    /// interrupted.
    pub async fn run_silent(
        &mut self,
        code: &str,
        timeout: Duration,
    ) -> Result<Option<super::output::ErrorLine>, KernelError> {
        let id = self.execute(code, true).await?;
        let deadline = Instant::now() + timeout;
        let mut cell = CellState::new(self.settle);
        while !cell.done() {
            let wait = cell
                .wait_hint()
                .min(deadline.saturating_duration_since(Instant::now()));
            match self.next_event(wait).await {
                Event::Message(m) if m.parent_id.as_deref() == Some(id.as_str()) => {
                    cell.observe(&m);
                }
                Event::Message(_) => {}
                Event::Exited(status) => return Err(KernelError::Died(status)),
                Event::Idle if Instant::now() >= deadline => {
                    self.interrupt().await;
                    return Err(KernelError::Timeout(timeout.as_secs()));
                }
                Event::Idle => {}
            }
        }
        Ok(cell.error)
    }
}

fn write_connection_file(
    dir: &Path,
    info: &ConnectionInfo,
    identity: &Identity,
) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)?;
    // Others need to traverse it to reach their own files; nobody may list it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    let path = dir.join(format!("kernel-{}.json", uuid::Uuid::new_v4().simple()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(&serde_json::to_vec(info).map_err(std::io::Error::other)?)?;
    drop(file);
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&path, Some(identity.uid), Some(identity.gid))?;
    }
    Ok(path)
}

async fn log_lines<R: tokio::io::AsyncRead + Unpin>(
    reader: R,
    language: String,
    tail: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(language, "kernel: {line}");
        if let Some(tail) = &tail {
            let mut tail = tail
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if tail.len() == STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_races_are_recognised() {
        let race = KernelError::ExitedDuringStartup {
            language: "python".into(),
            status: "exit status 1".into(),
            stderr: ": zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:4')"
                .into(),
        };
        assert!(race.is_port_race());
        let other = KernelError::ExitedDuringStartup {
            language: "python".into(),
            status: "exit status 1".into(),
            stderr: ": ModuleNotFoundError".into(),
        };
        assert!(!other.is_port_race());
    }
}
