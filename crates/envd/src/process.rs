//! Messages of the `process.Process` service, generated at build time from
//! `proto/process/process.proto` (see the crate docs), plus the service's method names and a few
//! constructors.
//!
//! prost's layout: a message with a `oneof` has an `Option<Enum>` field, with the nested types in
//! a module named after the message (`process_event::Event`, `process_event::data_event::Output`).
//! Enum-typed fields are `i32` on the struct; read them with the generated getter
//! (`request.signal()`), which maps unknown numbers to the `*_UNSPECIFIED` value.

use bytes::Bytes;

include!(concat!(env!("OUT_DIR"), "/process.rs"));
include!(concat!(env!("OUT_DIR"), "/process.serde.rs"));

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
    pub fn data(output: process_event::data_event::Output) -> Self {
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

    use super::process_event::data_event::Output;
    use super::process_event::{EndEvent, Event};
    use super::*;
    use crate::connect::decode_json;

    fn decode<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> T {
        decode_json(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn start_request_as_sent_by_the_sdks() {
        let req: StartRequest = decode(&json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}},
            "stdin": false,
            "someFutureField": {"x": 1}
        }));
        let process = req.process.unwrap();
        assert_eq!(process.cmd, "/bin/bash");
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(process.envs["A"], "1");
        assert_eq!(process.cwd, None);
        assert_eq!(req.stdin, Some(false));
        assert_eq!(req.pty, None);

        let req: StartRequest = decode(&json!({
            "process": {"cmd": "/bin/bash", "args": null, "envs": null, "cwd": "/tmp"},
            "pty": {"size": {"cols": "80", "rows": 24}},
            "tag": "t"
        }));
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
        let ev: ProcessEvent = decode(&json!({"end": {"exit_code": 2}, "other": 1}));
        assert!(matches!(
            ev.event,
            Some(Event::End(EndEvent { exit_code: 2, .. }))
        ));
        let ev: ProcessEvent = decode(&json!({"start": null}));
        assert_eq!(ev.event, None);
        assert!(decode_json::<ProcessSelector>(br#"{"pid": 1, "tag": "x"}"#).is_err());
        let sel: ProcessSelector = decode(&json!({"pid": "42"}));
        assert_eq!(sel, ProcessSelector::pid(42));
    }

    #[test]
    fn signals_accept_names_and_numbers() {
        let req: SendSignalRequest =
            decode(&json!({"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}));
        assert_eq!(req.signal(), Signal::Sigkill);
        let req: SendSignalRequest = decode(&json!({"signal": 15}));
        assert_eq!(req.signal(), Signal::Sigterm);
        let req: SendSignalRequest = decode(&json!({"signal": "SIGHUP"}));
        assert_eq!(req.signal(), Signal::Unspecified);
        assert_eq!(
            serde_json::to_value(&SendSignalRequest {
                process: Some(ProcessSelector::tag("t")),
                signal: Signal::Sigterm.into(),
            })
            .unwrap(),
            json!({"process": {"tag": "t"}, "signal": "SIGNAL_SIGTERM"})
        );
    }
}
