//! Talking to a build sandbox's agent: run one command through the envd process API (the same
//! path, user switch and confinement as `sandbox.commands.run`) with its output streamed line by
//! line, and put a file into the sandbox through `POST /files`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use bulkhead_envd::connect::{EnvelopeDecoder, StreamFrame, encode_envelope};
use bulkhead_envd::process::{
    ProcessConfig, StartRequest, StartResponse, process_event::Event,
    process_event::data_event::Output,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::node::agent_client::{self, AgentClientError};
use crate::node::driver::AgentStream;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the build sandbox's agent: {0}")]
    Client(#[from] AgentClientError),
    #[error("reading the build sandbox's process stream failed")]
    Http(#[source] hyper::Error),
    #[error("the build sandbox's agent sent an unreadable process stream: {0}")]
    Stream(String),
    #[error("{0}")]
    Agent(String),
    #[error("the command did not finish within {0:?} (the build's step time limit)")]
    Timeout(Duration),
}

/// What a command runs with.
pub struct Command<'a> {
    pub script: &'a str,
    pub user: &'a str,
    pub cwd: Option<&'a str>,
    pub envs: &'a BTreeMap<String, String>,
    pub timeout: Duration,
    /// The sandbox's envd access token, when it has one.
    pub access_token: Option<&'a str>,
}

fn basic_auth(user: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    )
}

/// Runs `cmd` with `/bin/bash -l -c` and returns its exit code; each output line goes to
/// `on_line` as it arrives.
pub async fn run(
    stream: AgentStream,
    cmd: &Command<'_>,
    on_line: &mut (dyn FnMut(String) + Send),
) -> Result<i32, ExecError> {
    let start = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), cmd.script.into()],
            envs: cmd.envs.clone().into_iter().collect(),
            cwd: cmd.cwd.map(str::to_owned),
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let json = serde_json::to_vec(&start).map_err(|e| ExecError::Stream(e.to_string()))?;
    let mut req = http::Request::builder();
    if let Some(t) = cmd.access_token {
        req = req.header("X-Access-Token", t);
    }
    let req = req
        .method(http::Method::POST)
        .uri("/process.Process/Start")
        .header(http::header::CONTENT_TYPE, "application/connect+json")
        .header("Connect-Protocol-Version", "1")
        .header(
            "Connect-Timeout-Ms",
            cmd.timeout
                .as_millis()
                .min(u128::from(u32::MAX))
                .to_string(),
        )
        .header(http::header::AUTHORIZATION, basic_auth(cmd.user))
        .body(Full::new(encode_envelope(0, &json)))
        .map_err(AgentClientError::Build)?;
    let fut = async {
        let resp = agent_client::success(agent_client::send(stream, req).await?).await?;
        let mut body = resp.into_body();
        let mut dec = EnvelopeDecoder::new();
        let mut lines = LineSplitter::default();
        let mut exit = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(ExecError::Http)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            dec.push(&data);
            while let Some(f) = dec
                .next_frame::<StartResponse>()
                .map_err(|e| ExecError::Stream(e.to_string()))?
            {
                match f {
                    StreamFrame::Message(m) => match m.event.and_then(|e| e.event) {
                        Some(Event::Data(d)) => {
                            let bytes = match d.output {
                                Some(Output::Stdout(b) | Output::Stderr(b) | Output::Pty(b)) => b,
                                None => continue,
                            };
                            lines.push(&bytes, on_line);
                        }
                        Some(Event::End(end)) => {
                            exit = Some(end.exit_code);
                            if let Some(err) = end.error.filter(|e| !e.is_empty()) {
                                lines.push(format!("\n{err}\n").as_bytes(), on_line);
                            }
                        }
                        _ => {}
                    },
                    StreamFrame::End(end) => {
                        lines.flush(on_line);
                        if let Some(e) = end.error {
                            return Err(ExecError::Agent(e.message));
                        }
                    }
                }
            }
        }
        lines.flush(on_line);
        exit.ok_or_else(|| ExecError::Stream("the stream ended before the process did".into()))
    };
    // The agent enforces Connect-Timeout-Ms; this bounds a stream that never answers.
    tokio::time::timeout(cmd.timeout + Duration::from_secs(10), fut)
        .await
        .map_err(|_| ExecError::Timeout(cmd.timeout))?
}

/// Writes `data` to `path` in the sandbox as `user` (parents are created by the agent).
pub async fn put_file(
    stream: AgentStream,
    path: &str,
    user: &str,
    data: Bytes,
) -> Result<(), ExecError> {
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!(
            "/files?path={}&username={}",
            urlencoding::encode(path),
            urlencoding::encode(user)
        ))
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(data))
        .map_err(AgentClientError::Build)?;
    agent_client::ok_body(agent_client::send(stream, req).await?).await?;
    Ok(())
}

/// Splits a byte stream into lines (a line longer than 8 KiB is cut).
#[derive(Default)]
struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    const MAX: usize = 8192;

    fn push(&mut self, data: &[u8], out: &mut (dyn FnMut(String) + Send)) {
        for &b in data {
            if b == b'\n' || self.buf.len() >= Self::MAX {
                out(String::from_utf8_lossy(&self.buf)
                    .trim_end_matches('\r')
                    .to_owned());
                self.buf.clear();
                if b == b'\n' {
                    continue;
                }
            }
            self.buf.push(b);
        }
    }

    fn flush(&mut self, out: &mut (dyn FnMut(String) + Send)) {
        if !self.buf.is_empty() {
            out(String::from_utf8_lossy(&self.buf).into_owned());
            self.buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_across_chunks() {
        let mut got = Vec::new();
        let mut s = LineSplitter::default();
        let mut out = |l: String| got.push(l);
        s.push(b"a\nb", &mut out);
        s.push(b"c\r\n\nd", &mut out);
        s.flush(&mut out);
        assert_eq!(got, ["a", "bc", "", "d"]);
    }
}
