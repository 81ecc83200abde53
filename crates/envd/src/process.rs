//! Messages of the `process.Process` service (contract: `proto/process/process.proto`).
//!
//! Types mirror the proto messages one to one. A message that is a single `oneof` is a struct
//! with one `Option<Enum>` field (`None` = no member set), with the nested types in a module named
//! after the message, as prost does (`process_event::Event`, `process_event::StartEvent`, ...).

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::json::{self, null_default};

/// Fully qualified service name.
pub const SERVICE: &str = "process.Process";

/// Method names of `process.Process`, with their kind.
pub mod method {
    /// Unary: [`super::ListRequest`] → [`super::ListResponse`].
    pub const LIST: &str = "List";
    /// Server stream: [`super::ConnectRequest`] → [`super::ConnectResponse`]*.
    pub const CONNECT: &str = "Connect";
    /// Server stream: [`super::StartRequest`] → [`super::StartResponse`]*.
    pub const START: &str = "Start";
    /// Unary: [`super::UpdateRequest`] → [`super::UpdateResponse`].
    pub const UPDATE: &str = "Update";
    /// Client stream: [`super::StreamInputRequest`]* → [`super::StreamInputResponse`].
    pub const STREAM_INPUT: &str = "StreamInput";
    /// Unary: [`super::SendInputRequest`] → [`super::SendInputResponse`].
    pub const SEND_INPUT: &str = "SendInput";
    /// Unary: [`super::SendSignalRequest`] → [`super::SendSignalResponse`].
    pub const SEND_SIGNAL: &str = "SendSignal";
    /// Unary: [`super::CloseStdinRequest`] → [`super::CloseStdinResponse`].
    pub const CLOSE_STDIN: &str = "CloseStdin";
}

/// The HTTP path of a method, e.g. `/process.Process/Start`.
pub fn path(method: &str) -> String {
    format!("/{SERVICE}/{method}")
}

/// What to run: command, arguments, extra environment and working directory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessConfig {
    /// Program to execute; looked up in `PATH` when it has no `/`.
    #[serde(deserialize_with = "null_default")]
    pub cmd: String,
    /// Arguments, not including the program name.
    #[serde(deserialize_with = "null_default")]
    pub args: Vec<String>,
    /// Environment variables added on top of the sandbox's environment.
    #[serde(deserialize_with = "null_default")]
    pub envs: BTreeMap<String, String>,
    /// Working directory; relative paths are resolved against the user's home.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// Pseudo-terminal settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Pty {
    /// Window size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<pty::Size>,
}

/// Nested messages of [`Pty`].
pub mod pty {
    use serde::{Deserialize, Serialize};

    /// Terminal window size in character cells.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    pub struct Size {
        /// Columns.
        #[serde(with = "crate::json::uint32")]
        pub cols: u32,
        /// Rows.
        #[serde(with = "crate::json::uint32")]
        pub rows: u32,
    }
}

/// Request of `List`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListRequest {}

/// A running process.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessInfo {
    /// How the process was started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    /// Process id inside the sandbox.
    #[serde(with = "json::uint32")]
    pub pid: u32,
    /// Tag given at start, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Response of `List`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListResponse {
    /// Running processes.
    #[serde(deserialize_with = "null_default")]
    pub processes: Vec<ProcessInfo>,
}

/// Request of `Start`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartRequest {
    /// What to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    /// Run under a pseudo-terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    /// A name to find the process by later (`Connect`, `SendInput`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Absent: stdin is an open pipe (backward compatible). `false`: stdin is `/dev/null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// Request of `Update` (PTY resize).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct UpdateRequest {
    /// Which process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// New PTY settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// Response of `Update`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateResponse {}

/// One event of a process's life; a stream is `start`, `data`*, `end`, with `keepalive`s.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessEvent {
    /// The event, `None` when no member is set.
    pub event: Option<process_event::Event>,
}

/// Nested messages of [`ProcessEvent`].
pub mod process_event {
    use bytes::Bytes;
    use serde::{Deserialize, Serialize};

    use crate::json::null_default;

    /// The `event` oneof.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// The process started.
        Start(StartEvent),
        /// Output.
        Data(DataEvent),
        /// The process ended.
        End(EndEvent),
        /// Nothing happened; keeps idle connections open.
        Keepalive(KeepAlive),
    }

    /// The process started.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    pub struct StartEvent {
        /// Process id inside the sandbox.
        #[serde(with = "crate::json::uint32")]
        pub pid: u32,
    }

    /// A chunk of output.
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    pub struct DataEvent {
        /// The `output` oneof.
        pub output: Option<Output>,
    }

    /// The `output` oneof of [`DataEvent`].
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Output {
        /// Bytes written to stdout.
        Stdout(Bytes),
        /// Bytes written to stderr.
        Stderr(Bytes),
        /// Bytes written to the PTY.
        Pty(Bytes),
    }

    crate::proto_oneof!(DataEvent.output: Output {
        Stdout(Bytes) = "stdout" with crate::json::bytes_b64,
        Stderr(Bytes) = "stderr" with crate::json::bytes_b64,
        Pty(Bytes) = "pty" with crate::json::bytes_b64,
    });

    /// The process ended.
    #[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    pub struct EndEvent {
        /// Exit code, or -1 when the process was killed by a signal.
        #[serde(with = "crate::json::int32", alias = "exit_code")]
        pub exit_code: i32,
        /// Whether the process exited normally (as opposed to by a signal).
        #[serde(deserialize_with = "null_default")]
        pub exited: bool,
        /// Go's `ProcessState.String()`, e.g. `exit status 1` or `signal: killed`.
        #[serde(deserialize_with = "null_default")]
        pub status: String,
        /// Error text when the process did not end successfully.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
    }

    /// Keepalive.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

crate::proto_oneof!(ProcessEvent.event: process_event::Event {
    Start(process_event::StartEvent) = "start" with crate::json::plain,
    Data(process_event::DataEvent) = "data" with crate::json::plain,
    End(process_event::EndEvent) = "end" with crate::json::plain,
    Keepalive(process_event::KeepAlive) = "keepalive" with crate::json::plain,
});

impl ProcessEvent {
    /// A `start` event.
    pub fn start(pid: u32) -> Self {
        Self {
            event: Some(process_event::Event::Start(process_event::StartEvent {
                pid,
            })),
        }
    }

    /// A `data` event.
    pub fn data(output: process_event::Output) -> Self {
        Self {
            event: Some(process_event::Event::Data(process_event::DataEvent {
                output: Some(output),
            })),
        }
    }

    /// An `end` event.
    pub fn end(end: process_event::EndEvent) -> Self {
        Self {
            event: Some(process_event::Event::End(end)),
        }
    }

    /// A `keepalive` event.
    pub fn keepalive() -> Self {
        Self {
            event: Some(process_event::Event::Keepalive(process_event::KeepAlive {})),
        }
    }
}

/// Response of `Start`: one event.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartResponse {
    /// The event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

/// Response of `Connect`: one event.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConnectResponse {
    /// The event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

/// Request of `SendInput`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SendInputRequest {
    /// Which process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// What to write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// Response of `SendInput`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SendInputResponse {}

/// Input for a process: stdin bytes or PTY bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessInput {
    /// The `input` oneof.
    pub input: Option<process_input::Input>,
}

/// Nested types of [`ProcessInput`].
pub mod process_input {
    use bytes::Bytes;

    /// The `input` oneof.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Input {
        /// Bytes for the stdin pipe.
        Stdin(Bytes),
        /// Bytes typed into the PTY.
        Pty(Bytes),
    }
}

crate::proto_oneof!(ProcessInput.input: process_input::Input {
    Stdin(Bytes) = "stdin" with crate::json::bytes_b64,
    Pty(Bytes) = "pty" with crate::json::bytes_b64,
});

impl ProcessInput {
    /// Stdin input.
    pub fn stdin(data: impl Into<Bytes>) -> Self {
        Self {
            input: Some(process_input::Input::Stdin(data.into())),
        }
    }

    /// PTY input.
    pub fn pty(data: impl Into<Bytes>) -> Self {
        Self {
            input: Some(process_input::Input::Pty(data.into())),
        }
    }
}

/// A client-streamed input message: `start` (selects the process) first, then `data`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamInputRequest {
    /// The `event` oneof.
    pub event: Option<stream_input_request::Event>,
}

/// Nested messages of [`StreamInputRequest`].
pub mod stream_input_request {
    use serde::{Deserialize, Serialize};

    /// The `event` oneof.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// Selects the process; must come first.
        Start(StartEvent),
        /// Input.
        Data(DataEvent),
        /// Keepalive.
        Keepalive(KeepAlive),
    }

    /// Selects the process.
    #[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    pub struct StartEvent {
        /// Which process.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub process: Option<super::ProcessSelector>,
    }

    /// Input.
    #[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(default, rename_all = "camelCase")]
    pub struct DataEvent {
        /// What to write.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub input: Option<super::ProcessInput>,
    }

    /// Keepalive.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

crate::proto_oneof!(StreamInputRequest.event: stream_input_request::Event {
    Start(stream_input_request::StartEvent) = "start" with crate::json::plain,
    Data(stream_input_request::DataEvent) = "data" with crate::json::plain,
    Keepalive(stream_input_request::KeepAlive) = "keepalive" with crate::json::plain,
});

/// Response of `StreamInput`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamInputResponse {}

crate::proto_enum! {
    /// Signals a client may send.
    pub enum Signal {
        /// Not set.
        Unspecified = 0 => "SIGNAL_UNSPECIFIED",
        /// `SIGTERM`.
        Sigterm = 15 => "SIGNAL_SIGTERM",
        /// `SIGKILL`.
        Sigkill = 9 => "SIGNAL_SIGKILL",
    }
}

/// Request of `SendSignal`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SendSignalRequest {
    /// Which process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    /// Which signal.
    pub signal: Signal,
}

/// Response of `SendSignal`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SendSignalResponse {}

/// Request of `CloseStdin`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CloseStdinRequest {
    /// Which process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// Response of `CloseStdin`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CloseStdinResponse {}

/// Request of `Connect`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConnectRequest {
    /// Which process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// Selects a process by pid or by tag.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessSelector {
    /// The `selector` oneof.
    pub selector: Option<process_selector::Selector>,
}

/// Nested types of [`ProcessSelector`].
pub mod process_selector {
    /// The `selector` oneof.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Selector {
        /// By process id.
        Pid(u32),
        /// By tag.
        Tag(String),
    }
}

crate::proto_oneof!(ProcessSelector.selector: process_selector::Selector {
    Pid(u32) = "pid" with crate::json::uint32,
    Tag(String) = "tag" with crate::json::plain,
});

impl ProcessSelector {
    /// Selects by pid.
    pub fn pid(pid: u32) -> Self {
        Self {
            selector: Some(process_selector::Selector::Pid(pid)),
        }
    }

    /// Selects by tag.
    pub fn tag(tag: impl Into<String>) -> Self {
        Self {
            selector: Some(process_selector::Selector::Tag(tag.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::process_event::{EndEvent, Event, Output};
    use super::*;

    #[test]
    fn start_request_as_sent_by_the_sdks() {
        let req: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}},
            "stdin": false,
            "someFutureField": {"x": 1}
        }))
        .unwrap();
        let process = req.process.unwrap();
        assert_eq!(process.cmd, "/bin/bash");
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(process.envs["A"], "1");
        assert_eq!(process.cwd, None);
        assert_eq!(req.stdin, Some(false));
        assert_eq!(req.pty, None);

        let req: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": null, "envs": null, "cwd": "/tmp"},
            "pty": {"size": {"cols": "80", "rows": 24}},
            "tag": "t"
        }))
        .unwrap();
        assert_eq!(
            req.pty.unwrap().size.unwrap(),
            pty::Size { cols: 80, rows: 24 }
        );
        assert_eq!(req.stdin, None);
    }

    #[test]
    fn events_serialize_with_oneof_member_names() {
        let ev = StartResponse {
            event: Some(ProcessEvent::data(Output::Stdout(Bytes::from_static(
                b"hi\n",
            )))),
        };
        assert_eq!(
            serde_json::to_value(&ev).unwrap(),
            json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        let end = ProcessEvent::end(EndEvent {
            exit_code: -1,
            exited: false,
            status: "signal: killed".into(),
            error: Some("signal: killed".into()),
        });
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"end": {"exitCode": -1, "exited": false, "status": "signal: killed", "error": "signal: killed"}})
        );
        assert_eq!(
            serde_json::to_value(ProcessEvent::keepalive()).unwrap(),
            json!({"keepalive": {}})
        );
        assert_eq!(
            serde_json::to_value(ProcessEvent::default()).unwrap(),
            json!({})
        );
    }

    #[test]
    fn oneof_parsing_is_lenient_but_rejects_two_members() {
        let ev: ProcessEvent =
            serde_json::from_value(json!({"end": {"exit_code": 2}, "other": 1})).unwrap();
        assert!(matches!(
            ev.event,
            Some(Event::End(EndEvent { exit_code: 2, .. }))
        ));
        let ev: ProcessEvent = serde_json::from_value(json!({"start": null})).unwrap();
        assert_eq!(ev.event, None);
        assert!(serde_json::from_value::<ProcessSelector>(json!({"pid": 1, "tag": "x"})).is_err());
        let sel: ProcessSelector = serde_json::from_value(json!({"pid": "42"})).unwrap();
        assert_eq!(sel, ProcessSelector::pid(42));
    }

    #[test]
    fn signals_accept_names_and_numbers() {
        let req: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}))
                .unwrap();
        assert_eq!(req.signal, Signal::Sigkill);
        let req: SendSignalRequest = serde_json::from_value(json!({"signal": 15})).unwrap();
        assert_eq!(req.signal, Signal::Sigterm);
        let req: SendSignalRequest = serde_json::from_value(json!({"signal": "SIGHUP"})).unwrap();
        assert_eq!(req.signal, Signal::Unspecified);
        assert_eq!(
            serde_json::to_value(&SendSignalRequest {
                process: Some(ProcessSelector::tag("t")),
                signal: Signal::Sigterm
            })
            .unwrap(),
            json!({"process": {"tag": "t"}, "signal": "SIGNAL_SIGTERM"})
        );
    }
}
