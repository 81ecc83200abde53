//! One `POST /execute`: a task that owns the execution and feeds NDJSON lines to the response
//! body through a channel, so the kernel is always left in order even when the client goes away.
//!
//! Order of work, all while holding the context's slot (executions are serialized):
//! 1. wait for the slot; if the client disconnects while waiting, give up without running;
//! 2. start a kernel if the context has none (first use after a death that could not restart);
//! 3. one silent cell applying changed sandbox variables and the request's `env_vars`;
//! 4. the user's cell, streamed: `number_of_executions`, `stdout`/`stderr`, `result`, the first
//!    `error`, `keepalive` after 5 s of silence, then `end_of_execution`;
//! 5. one silent cell restoring the variables the request changed.
//!
//! Client gone mid-cell: interrupt, wait up to [`INTERRUPT_GRACE`] for the cell to end (twice),
//! and if it still runs, kill the kernel and start a new one (state lost; logged). Kernel death:
//! `error` `ContextRestarting`, `end_of_execution`, then a fresh kernel.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::cell::{CellState, Channel, KernelMessage};
use super::kernel::{Event, Kernel, KernelError};
use super::output::{ErrorLine, Line, result_fields};
use super::{Context, Interpreter, Slot, snippets};

/// Silence after which a `keepalive` line is written.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long an interrupted cell may take to stop.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// Limit for the agent's own silent cells (environment changes).
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);

/// What the client asked to run.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// The user's code.
    pub code: String,
    /// Per-request environment variables.
    pub env_vars: BTreeMap<String, String>,
}

/// Starts the execution and returns the streaming response body.
pub fn start(interpreter: Arc<Interpreter>, context: Arc<Context>, request: ExecRequest) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut sink = Sink { tx, gone: false };
        run(&interpreter, &context, &request, &mut sink).await;
    });
    Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>))
}

/// The response side.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    gone: bool,
}

impl Sink {
    async fn send(&mut self, line: &Line) {
        if self.gone {
            return;
        }
        if self.tx.send(Bytes::from(line.to_ndjson())).await.is_err() {
            self.gone = true;
        }
    }

    fn is_gone(&self) -> bool {
        self.gone || self.tx.is_closed()
    }

    async fn finish_with_error(&mut self, error: ErrorLine) {
        self.send(&Line::Error(error)).await;
        self.send(&Line::EndOfExecution).await;
    }
}

/// How the user's cell ended.
enum Outcome {
    /// Normally (with or without an error line).
    Completed,
    /// The client left and the cell was interrupted (or the kernel was replaced).
    Abandoned,
    /// The kernel process died.
    Died(String),
    /// Talking to the kernel failed.
    Failed(KernelError),
}

async fn run(interpreter: &Interpreter, context: &Context, request: &ExecRequest, sink: &mut Sink) {
    let mut slot = tokio::select! {
        slot = context.slot.lock() => slot,
        () = sink.tx.closed() => {
            tracing::info!(context = context.id, "client left while the execution was queued; not running it");
            return;
        }
    };
    // The client may have left in the same instant the context became free.
    if sink.tx.is_closed() {
        tracing::info!(
            context = context.id,
            "client left while the execution was queued; not running it"
        );
        return;
    }
    if context.is_deleted() {
        sink.finish_with_error(ErrorLine::synthetic(
            "ContextDeleted",
            format!("Context {} was deleted", context.id),
        ))
        .await;
        return;
    }
    if let Err(e) = interpreter.ensure_kernel(context, &mut slot).await {
        sink.finish_with_error(ErrorLine::synthetic(
            "KernelStartError",
            crate::report::error_chain(&e),
        ))
        .await;
        return;
    }
    let globals = interpreter.state.settings().env_vars;
    let (prelude, restore) = env_plan(context, &mut slot, &globals, &request.env_vars);
    let Some(kernel) = slot.kernel.as_mut() else {
        return;
    };
    kernel.discard_pending();

    if let Some(prelude) = prelude {
        match kernel.run_silent(&prelude, HELPER_TIMEOUT).await {
            Ok(None) => {}
            Ok(Some(error)) => {
                sink.finish_with_error(error).await;
                restore_env(kernel, restore.as_deref()).await;
                return;
            }
            Err(KernelError::Died(status)) => {
                report_death(context, sink, &status).await;
                after_death(interpreter, context, &mut slot).await;
                return;
            }
            Err(e) => {
                sink.finish_with_error(ErrorLine::synthetic(
                    "EnvironmentError",
                    format!(
                        "Could not set the environment variables: {}",
                        crate::report::error_chain(&e)
                    ),
                ))
                .await;
                return;
            }
        }
    }

    let code = snippets::wrap_user_code(context.dialect(), &request.code);
    match stream_cell(kernel, &code, sink).await {
        Outcome::Completed => {
            sink.send(&Line::EndOfExecution).await;
            restore_env(kernel, restore.as_deref()).await;
        }
        Outcome::Abandoned => {
            if kernel.exited().is_some() {
                after_death(interpreter, context, &mut slot).await;
            } else {
                restore_env(kernel, restore.as_deref()).await;
            }
        }
        Outcome::Died(status) => {
            report_death(context, sink, &status).await;
            after_death(interpreter, context, &mut slot).await;
        }
        Outcome::Failed(e) => {
            sink.finish_with_error(ErrorLine::synthetic(
                "KernelError",
                crate::report::error_chain(&e),
            ))
            .await;
        }
    }
}

/// The silent cells before and after the user's code: sandbox-wide variables that changed since
/// the kernel last saw them (e.g. `/init` after a warm start), then the request's variables; and
/// the restoration of the request's variables to what the kernel had.
fn env_plan(
    context: &Context,
    slot: &mut Slot,
    globals: &BTreeMap<String, String>,
    request: &BTreeMap<String, String>,
) -> (Option<String>, Option<String>) {
    let dialect = context.dialect();
    let manifest_env = &context.spec.env;
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    if *globals != slot.globals {
        // The manifest's variables win over the sandbox's, as at kernel start.
        for (key, value) in globals {
            if !manifest_env.contains_key(key) && slot.globals.get(key) != Some(value) {
                changes.push((key.clone(), Some(value.clone())));
                slot.env.insert(key.clone(), value.clone());
            }
        }
        let removed: Vec<String> = slot
            .globals
            .keys()
            .filter(|k| !globals.contains_key(*k) && !manifest_env.contains_key(*k))
            .cloned()
            .collect();
        for key in removed {
            slot.env.remove(&key);
            changes.push((key, None));
        }
        slot.globals.clone_from(globals);
    }
    changes.extend(request.iter().map(|(k, v)| (k.clone(), Some(v.clone()))));
    let restore: Vec<(String, Option<String>)> = request
        .keys()
        .map(|k| (k.clone(), slot.env.get(k).cloned()))
        .collect();
    (
        snippets::env_changes(dialect, &changes),
        snippets::env_changes(dialect, &restore),
    )
}

async fn restore_env(kernel: &mut Kernel, restore: Option<&str>) {
    let Some(code) = restore else { return };
    match kernel.run_silent(code, HELPER_TIMEOUT).await {
        Ok(None) => {}
        Ok(Some(e)) => tracing::warn!(error = %e.value, "restoring environment variables failed"),
        Err(e) => {
            tracing::warn!(error = %crate::report::error_chain(&e), "restoring environment variables failed")
        }
    }
}

async fn report_death(context: &Context, sink: &mut Sink, status: &str) {
    let value = if context.is_restarting() {
        "Context was restarted".to_owned()
    } else {
        format!(
            "Context was restarted: the kernel died ({status}); its state is lost, rerun the code"
        )
    };
    tracing::warn!(
        context = context.id,
        status,
        "kernel died during an execution"
    );
    sink.finish_with_error(ErrorLine::synthetic("ContextRestarting", value))
        .await;
}

/// After the kernel died or was killed: start a new one unless a restart or delete is taking
/// care of the context. A failure leaves the slot empty; the next execution tries again.
async fn after_death(interpreter: &Interpreter, context: &Context, slot: &mut Slot) {
    slot.kernel = None;
    if context.is_restarting() || context.is_deleted() {
        return;
    }
    if let Err(e) = interpreter.start_kernel(context, slot).await {
        tracing::warn!(context = context.id, error = %crate::report::error_chain(&e), "could not restart a dead kernel");
    }
}

fn text_of(content: &Value, key: &str) -> String {
    content
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The line a message of the user's cell produces, if any (after `cell` has observed it).
fn line_for(message: &KernelMessage, cell: &CellState, error_sent: &mut bool) -> Option<Line> {
    let timestamp = || {
        message
            .date
            .clone()
            .unwrap_or_else(|| chrono::Utc::now().to_rfc3339())
    };
    match (message.channel, message.msg_type.as_str()) {
        (Channel::Iopub, "stream") => {
            let text = text_of(&message.content, "text");
            Some(match message.content.get("name").and_then(Value::as_str) {
                Some("stderr") => Line::Stderr {
                    text,
                    timestamp: timestamp(),
                },
                _ => Line::Stdout {
                    text,
                    timestamp: timestamp(),
                },
            })
        }
        (Channel::Iopub, kind @ ("display_data" | "execute_result")) => {
            match message.content.get("data") {
                Some(Value::Object(bundle)) => Some(Line::Result(result_fields(
                    bundle,
                    kind == "execute_result",
                ))),
                _ => None,
            }
        }
        (Channel::Iopub, "execute_input") => message
            .content
            .get("execution_count")
            .and_then(Value::as_i64)
            .map(Line::NumberOfExecutions),
        // `error` on iopub or an `execute_reply` with an error: only the first is reported.
        _ => match &cell.error {
            Some(error) if !*error_sent => {
                *error_sent = true;
                Some(Line::Error(error.clone()))
            }
            _ => None,
        },
    }
}

/// Runs the user's cell and streams its output.
async fn stream_cell(kernel: &mut Kernel, code: &str, sink: &mut Sink) -> Outcome {
    let id = match kernel.execute(code, false).await {
        Ok(id) => id,
        Err(e) => return Outcome::Failed(e),
    };
    let mut cell = CellState::new(kernel.settle());
    let mut error_sent = false;
    let mut last_write = Instant::now();
    loop {
        if cell.done() {
            return Outcome::Completed;
        }
        if sink.is_gone() {
            return abandon(kernel, &id, &mut cell).await;
        }
        let wait = cell
            .wait_hint()
            .min(KEEPALIVE_INTERVAL.saturating_sub(last_write.elapsed()));
        let event = tokio::select! {
            event = kernel.next_event(wait) => event,
            () = sink.tx.closed() => continue,
        };
        let message = match event {
            Event::Message(m) if m.parent_id.as_deref() == Some(id.as_str()) => m,
            Event::Message(_) => continue,
            Event::Exited(status) => {
                // Output the cell produced just before the process died (e.g. a print before
                // `os._exit`) may still be on its way.
                for m in kernel.drain_after_exit().await {
                    if m.parent_id.as_deref() == Some(id.as_str()) {
                        cell.observe(&m);
                        if let Some(line) = line_for(&m, &cell, &mut error_sent) {
                            sink.send(&line).await;
                        }
                    }
                }
                return Outcome::Died(status);
            }
            Event::Idle => {
                if last_write.elapsed() >= KEEPALIVE_INTERVAL {
                    sink.send(&Line::Keepalive).await;
                    last_write = Instant::now();
                }
                continue;
            }
        };
        cell.observe(&message);
        if let Some(line) = line_for(&message, &cell, &mut error_sent) {
            sink.send(&line).await;
            last_write = Instant::now();
        }
    }
}

/// The client left during the cell: interrupt it and wait for it to end, so the next execution
/// finds an idle kernel with its state intact. A cell that ignores interrupts costs the kernel.
async fn abandon(kernel: &mut Kernel, id: &str, cell: &mut CellState) -> Outcome {
    tracing::info!("client left during an execution; interrupting the kernel");
    for _attempt in 0..2 {
        kernel.interrupt().await;
        let deadline = Instant::now() + INTERRUPT_GRACE;
        while !cell.done() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match kernel.next_event(cell.wait_hint().min(left)).await {
                Event::Message(m) if m.parent_id.as_deref() == Some(id) => cell.observe(&m),
                Event::Message(_) | Event::Idle => {}
                Event::Exited(status) => {
                    tracing::warn!(status, "the kernel died while being interrupted");
                    return Outcome::Abandoned;
                }
            }
        }
        if cell.done() {
            return Outcome::Abandoned;
        }
    }
    tracing::warn!("the abandoned cell ignored two interrupts; killing the kernel");
    kernel.kill_handle().kill();
    // Wait for the reap so the caller sees the kernel as exited and replaces it.
    loop {
        if let Event::Exited(_) = kernel.next_event(Duration::from_secs(5)).await {
            return Outcome::Abandoned;
        }
    }
}
