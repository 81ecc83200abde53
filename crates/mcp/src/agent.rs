//! Calls into a sandbox's agent for the tools that act inside it: the code interpreter on port
//! 49999 (`/execute`, `/contexts`) and envd on 49983 (processes, directory listings, `/files`).
//! The byte stream comes from [`Engine::agent_stream`], the same one the REST routing proxy
//! forwards SDK traffic over, so an MCP call and an SDK call reach the agent the same way (with
//! the same routing headers and the sandbox's access token) and the engine stays the one owner
//! of sandbox state (liveness, auto-resume, traffic accounting).

use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::Engine;
use bulkhead_envd::connect::{EnvelopeDecoder, StreamFrame, encode_message};
use bulkhead_envd::filesystem::{self, ListDirRequest, ListDirResponse};
use bulkhead_envd::process::process_event::data_event::Output;
use bulkhead_envd::process::process_event::{DataEvent, Event};
use bulkhead_envd::process::{self, ProcessConfig, ProcessEvent, StartRequest, StartResponse};
use bulkhead_envd::rest::{
    CODE_INTERPRETER_PORT, ENVD_PORT, HEADER_ACCESS_TOKEN, HEADER_SANDBOX_ID, HEADER_SANDBOX_PORT,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::error::ToolError;

type Result<T, E = ToolError> = std::result::Result<T, E>;

/// One sandbox as the tools address it.
pub(crate) struct Sandbox<'a> {
    pub engine: &'a Arc<Engine>,
    pub id: &'a str,
    pub access_token: Option<&'a str>,
}

/// A whole answer from the agent.
struct Answer {
    status: http::StatusCode,
    body: Bytes,
}

/// What a command produced.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct CommandOutput {
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Set when the process ended without an exit code (killed by a signal, or the agent
    /// reported an error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Sandbox<'_> {
    async fn send(
        &self,
        what: &'static str,
        port: u16,
        req: http::request::Builder,
        body: Bytes,
        limit: Duration,
    ) -> Result<Answer> {
        let work = async {
            let stream = self.engine.agent_stream(self.id).await?;
            let mut req = req
                .header(HEADER_SANDBOX_ID, self.id)
                .header(HEADER_SANDBOX_PORT, port);
            if let Some(token) = self.access_token {
                req = req.header(HEADER_ACCESS_TOKEN, token);
            }
            let req = req
                .body(Full::new(body))
                .map_err(|e| self.agent_error(what, e.to_string()))?;
            // The engine's client: `Host`, the request id, and the connection driven until the
            // answer's body is read.
            let resp = bulkhead_engine::agent_client::send(stream, req)
                .await
                .map_err(|e| self.agent_error(what, bulkhead_common::error_chain(&e)))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| self.agent_error(what, e.to_string()))?
                .to_bytes();
            Ok(Answer { status, body })
        };
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| ToolError::Timeout {
                what,
                secs: limit.as_secs(),
            })?
    }

    fn agent_error(&self, what: &'static str, message: String) -> ToolError {
        ToolError::Agent {
            what,
            sandbox: self.id.to_string(),
            message,
        }
    }

    /// A non-2xx answer as a tool error, with the agent's own message.
    fn check(&self, what: &'static str, answer: Answer) -> Result<Bytes> {
        if answer.status.is_success() {
            return Ok(answer.body);
        }
        let text = String::from_utf8_lossy(&answer.body);
        // envd's JSON errors and Connect errors carry `message`; the interpreter answers text.
        let message = serde_json::from_slice::<serde_json::Value>(&answer.body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| text.trim().to_string());
        Err(self.agent_error(what, format!("{} ({})", message, answer.status.as_u16())))
    }

    /// `POST /execute`: the interpreter's NDJSON stream, read to its end.
    pub async fn execute(&self, body: &serde_json::Value, limit: Duration) -> Result<Bytes> {
        let req =
            http::Request::post("/execute").header(http::header::CONTENT_TYPE, "application/json");
        let answer = self
            .send(
                "running code",
                CODE_INTERPRETER_PORT,
                req,
                Bytes::from(body.to_string()),
                limit,
            )
            .await?;
        self.interpreter_answer("running code", answer)
    }

    /// `POST /contexts`: a new code context; returns the interpreter's JSON description.
    pub async fn create_context(
        &self,
        body: &serde_json::Value,
        limit: Duration,
    ) -> Result<serde_json::Value> {
        let req =
            http::Request::post("/contexts").header(http::header::CONTENT_TYPE, "application/json");
        let answer = self
            .send(
                "creating a code context",
                CODE_INTERPRETER_PORT,
                req,
                Bytes::from(body.to_string()),
                limit,
            )
            .await?;
        let body = self.interpreter_answer("creating a code context", answer)?;
        serde_json::from_slice(&body).map_err(|e| {
            self.agent_error("creating a code context", format!("unreadable answer: {e}"))
        })
    }

    /// The proxy answers 502 "port is not open" for a template without an interpreter.
    fn interpreter_answer(&self, what: &'static str, answer: Answer) -> Result<Bytes> {
        if answer.status == http::StatusCode::BAD_GATEWAY
            && String::from_utf8_lossy(&answer.body).contains("port is not open")
        {
            return Err(ToolError::NoInterpreter(self.id.to_string()));
        }
        self.check(what, answer)
    }

    /// `process.Process/Start` with `bash -l -c command`, read to the end.
    pub async fn run_command(
        &self,
        command: &str,
        cwd: Option<String>,
        envs: std::collections::BTreeMap<String, String>,
        limit: Duration,
    ) -> Result<CommandOutput> {
        const WHAT: &str = "running the command";
        let start = StartRequest {
            process: Some(ProcessConfig {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), command.into()],
                envs,
                cwd,
            }),
            stdin: Some(false),
            ..Default::default()
        };
        let body = encode_message(&start).map_err(|e| self.agent_error(WHAT, e.to_string()))?;
        let req = http::Request::post(process::path(process::method::START))
            .header(http::header::CONTENT_TYPE, "application/connect+json")
            .header("connect-protocol-version", "1")
            .header("connect-timeout-ms", limit.as_millis().to_string());
        // The agent ends the process at the Connect deadline; a little slack lets its end
        // event arrive before our own timer fires.
        let answer = self
            .send(WHAT, ENVD_PORT, req, body, limit + Duration::from_secs(5))
            .await?;
        let body = self.check(WHAT, answer)?;
        let mut decoder = EnvelopeDecoder::new();
        decoder.push(&body);
        let mut out = CommandOutput::default();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        loop {
            match decoder.next_frame::<StartResponse>() {
                Ok(Some(StreamFrame::Message(StartResponse {
                    event: Some(ProcessEvent { event: Some(ev) }),
                }))) => match ev {
                    Event::Data(DataEvent {
                        output: Some(Output::Stderr(b)),
                    }) => stderr.extend_from_slice(&b),
                    Event::Data(DataEvent {
                        output: Some(Output::Stdout(b) | Output::Pty(b)),
                    }) => stdout.extend_from_slice(&b),
                    Event::End(end) => {
                        out.exit_code = Some(end.exit_code);
                        if let Some(e) = end.error.filter(|e| !e.is_empty()) {
                            out.error = Some(e);
                        }
                    }
                    _ => {}
                },
                Ok(Some(StreamFrame::Message(_))) => {}
                Ok(Some(StreamFrame::End(end))) => {
                    if let Some(err) = end.error {
                        out.error = Some(format!("{}: {}", err.code.as_str(), err.message));
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(self.agent_error(WHAT, e.to_string())),
            }
        }
        out.stdout = String::from_utf8_lossy(&stdout).into_owned();
        out.stderr = String::from_utf8_lossy(&stderr).into_owned();
        Ok(out)
    }

    /// `filesystem.Filesystem/ListDir` (a unary Connect call with the JSON codec).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        limit: Duration,
    ) -> Result<ListDirResponse> {
        const WHAT: &str = "listing the directory";
        let req_body = ListDirRequest {
            path: path.to_string(),
            depth,
        };
        let body =
            serde_json::to_vec(&req_body).map_err(|e| self.agent_error(WHAT, e.to_string()))?;
        let req = http::Request::post(filesystem::path(filesystem::method::LIST_DIR))
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("connect-protocol-version", "1");
        let answer = self
            .send(WHAT, ENVD_PORT, req, Bytes::from(body), limit)
            .await?;
        let body = self.check(WHAT, answer)?;
        serde_json::from_slice(&body).map_err(|e| self.agent_error(WHAT, e.to_string()))
    }

    /// `GET /files?path=`: a file's bytes.
    pub async fn read_file(&self, path: &str, limit: Duration) -> Result<Bytes> {
        let uri = format!("/files?path={}", urlencoding::encode(path));
        let answer = self
            .send(
                "reading the file",
                ENVD_PORT,
                http::Request::get(uri),
                Bytes::new(),
                limit,
            )
            .await?;
        self.check("reading the file", answer)
    }

    /// `POST /files?path=` with an octet-stream body (parent directories are created).
    pub async fn write_file(&self, path: &str, data: Bytes, limit: Duration) -> Result<()> {
        let uri = format!("/files?path={}", urlencoding::encode(path));
        let req =
            http::Request::post(uri).header(http::header::CONTENT_TYPE, "application/octet-stream");
        let answer = self
            .send("writing the file", ENVD_PORT, req, data, limit)
            .await?;
        self.check("writing the file", answer).map(|_| ())
    }
}
