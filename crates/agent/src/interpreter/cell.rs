//! The kernel's messages and when a cell is finished: the messages of one execution, observed
//! until the kernel is idle, has replied and has been quiet for its settle time.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

/// How long an idle cell may wait for its `execute_reply` before it is considered done.
const REPLY_GRACE: Duration = Duration::from_millis(500);

/// Which socket a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// Replies to our requests.
    Shell,
    /// Broadcast output.
    Iopub,
}

/// A message from the kernel, content as raw JSON.
#[derive(Debug, Clone)]
pub struct KernelMessage {
    /// Socket.
    pub channel: Channel,
    /// `header.msg_type`.
    pub msg_type: String,
    /// `parent_header.msg_id`, if any.
    pub parent_id: Option<String>,
    /// `header.date` as sent.
    pub date: Option<String>,
    /// `content`.
    pub content: Value,
}

/// Tracks when a cell is finished: `status: idle` on iopub plus its `execute_reply` (or a short
/// grace period after idle, for kernels that reply late or not at all), and then `settle` without
/// further messages of the cell (for kernels that publish output after idle).
#[derive(Debug)]
pub struct CellState {
    settle: Duration,
    idle_at: Option<Instant>,
    last_message_at: Instant,
    /// The `execute_reply` content, once seen.
    pub reply: Option<Value>,
    /// The first error.
    pub error: Option<super::output::ErrorLine>,
}

impl CellState {
    /// A cell that just started, on a kernel with this settle time.
    pub fn new(settle: Duration) -> Self {
        Self {
            settle,
            idle_at: None,
            last_message_at: Instant::now(),
            reply: None,
            error: None,
        }
    }

    /// Records a message that belongs to this cell.
    pub fn observe(&mut self, message: &KernelMessage) {
        self.last_message_at = Instant::now();
        match (message.channel, message.msg_type.as_str()) {
            (Channel::Iopub, "status")
                if message
                    .content
                    .get("execution_state")
                    .and_then(Value::as_str)
                    == Some("idle") =>
            {
                self.idle_at.get_or_insert_with(Instant::now);
            }
            (Channel::Iopub, "error") if self.error.is_none() => {
                self.error = Some(super::output::ErrorLine::from_content(&message.content));
            }
            (Channel::Shell, "execute_reply") => {
                if self.error.is_none() {
                    match message.content.get("status").and_then(Value::as_str) {
                        Some("error") => {
                            self.error =
                                Some(super::output::ErrorLine::from_content(&message.content));
                        }
                        Some("abort" | "aborted") => {
                            self.error = Some(super::output::ErrorLine::synthetic(
                                "ExecutionAborted",
                                "Execution was aborted",
                            ));
                        }
                        _ => {}
                    }
                }
                self.reply = Some(message.content.clone());
            }
            _ => {}
        }
    }

    /// Whether the cell is over.
    pub fn done(&self) -> bool {
        self.idle_at
            .is_some_and(|at| self.reply.is_some() || at.elapsed() >= REPLY_GRACE)
            && self.last_message_at.elapsed() >= self.settle
    }

    /// How long to wait for the next event before checking again.
    pub fn wait_hint(&self) -> Duration {
        match self.idle_at {
            Some(at) => {
                let reply = if self.reply.is_some() {
                    Duration::ZERO
                } else {
                    REPLY_GRACE.saturating_sub(at.elapsed())
                };
                reply.max(self.settle.saturating_sub(self.last_message_at.elapsed()))
            }
            None => Duration::from_secs(3600),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(channel: Channel, msg_type: &str, content: Value) -> KernelMessage {
        KernelMessage {
            channel,
            msg_type: msg_type.to_owned(),
            parent_id: Some("m".to_owned()),
            date: None,
            content,
        }
    }

    #[test]
    fn a_cell_ends_with_idle_and_its_reply() {
        let mut cell = CellState::new(Duration::ZERO);
        assert!(!cell.done());
        cell.observe(&message(
            Channel::Iopub,
            "status",
            json!({"execution_state": "busy"}),
        ));
        cell.observe(&message(
            Channel::Iopub,
            "error",
            json!({"ename": "E1", "evalue": "first", "traceback": []}),
        ));
        cell.observe(&message(
            Channel::Iopub,
            "status",
            json!({"execution_state": "idle"}),
        ));
        assert!(!cell.done(), "waits for the reply");
        assert!(cell.wait_hint() <= REPLY_GRACE);
        cell.observe(&message(
            Channel::Shell,
            "execute_reply",
            json!({"status": "error", "ename": "E2", "evalue": "second"}),
        ));
        assert!(cell.done());
        assert_eq!(
            cell.error.as_ref().unwrap().name,
            "E1",
            "the first error wins"
        );
    }

    #[test]
    fn aborted_cells_and_settle_time() {
        let mut cell = CellState::new(Duration::from_millis(50));
        cell.observe(&message(
            Channel::Shell,
            "execute_reply",
            json!({"status": "aborted"}),
        ));
        cell.observe(&message(
            Channel::Iopub,
            "status",
            json!({"execution_state": "idle"}),
        ));
        assert!(!cell.done(), "settling");
        assert!(cell.wait_hint() > Duration::ZERO);
        std::thread::sleep(Duration::from_millis(60));
        assert!(cell.done());
        assert_eq!(cell.error.unwrap().name, "ExecutionAborted");
    }
}
