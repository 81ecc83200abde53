//! A small HTTP/1.1 client for talking to a Bulkhead (or E2B) server: the control plane with
//! `X-API-Key`, and a sandbox's agent through the routing headers.

use anyhow::{Context, bail};
use bulkhead_envd::connect::{EnvelopeDecoder, StreamFrame, encode_message};
use bulkhead_envd::process::process_event::data_event::Output;
use bulkhead_envd::process::process_event::{DataEvent, Event};
use bulkhead_envd::process::{self, ProcessConfig, ProcessEvent, StartRequest, StartResponse};
use bulkhead_envd::rest::ENVD_PORT;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

pub struct Client {
    host_port: String,
    api_key: String,
}

pub struct SandboxRef {
    pub id: String,
    pub access_token: Option<String>,
}

impl Client {
    pub fn new(api_url: &str, api_key: &str) -> anyhow::Result<Self> {
        let rest = api_url
            .strip_prefix("http://")
            .context("only http:// API URLs are supported by the CLI client")?;
        Ok(Self {
            host_port: rest.trim_end_matches('/').to_string(),
            api_key: api_key.to_string(),
        })
    }

    /// `host:port` of the API.
    pub fn host_port(&self) -> &str {
        &self.host_port
    }

    async fn send(
        &self,
        req: http::Request<Full<Bytes>>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        let stream = tokio::net::TcpStream::connect(&self.host_port)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to {}: is `bulkhead serve` running?",
                    self.host_port
                )
            })?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender.send_request(req).await?)
    }

    fn builder(&self, method: http::Method, path: &str) -> http::request::Builder {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.host_port)
            .header("X-API-Key", &self.api_key)
    }

    /// Control-plane call with an optional JSON body. Non-2xx answers become errors carrying the
    /// server's message.
    pub async fn api(
        &self,
        method: http::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<(http::StatusCode, http::HeaderMap, Bytes)> {
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let req = self
            .builder(method, path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let resp = self.send(req).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        if !parts.status.is_success() {
            let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            bail!("{} {}: {}", parts.status.as_u16(), path, msg);
        }
        Ok((parts.status, parts.headers, bytes))
    }

    /// POST a JSON body to a port of a sandbox through the sandbox proxy (e.g. the code
    /// interpreter's `/execute` on 49999) and read the whole answer.
    pub async fn port_post(
        &self,
        sb: &SandboxRef,
        port: u16,
        path: &str,
        body: &serde_json::Value,
    ) -> anyhow::Result<Bytes> {
        let mut b = self
            .builder(http::Method::POST, path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("E2b-Sandbox-Id", &sb.id)
            .header("E2b-Sandbox-Port", port.to_string());
        if let Some(t) = &sb.access_token {
            b = b.header("X-Access-Token", t);
        }
        let resp = self
            .send(b.body(Full::new(Bytes::from(body.to_string())))?)
            .await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(bytes)
    }

    /// Open a Connect server-streaming call on a sandbox's envd and return the raw response.
    pub async fn envd_stream<T: serde::Serialize>(
        &self,
        sb: &SandboxRef,
        path: &str,
        message: &T,
        timeout_ms: Option<u64>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        let mut b = self
            .builder(http::Method::POST, path)
            .header(http::header::CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("E2b-Sandbox-Id", &sb.id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        if let Some(t) = &sb.access_token {
            b = b.header("X-Access-Token", t);
        }
        if let Some(ms) = timeout_ms {
            b = b.header("Connect-Timeout-Ms", ms.to_string());
        }
        let resp = self
            .send(b.body(Full::new(encode_message(message)?))?)
            .await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(resp)
    }
}

/// Run `cmd args` in a sandbox via `process.Process/Start`, calling `on_output(is_stderr, bytes)`
/// for output, and return the exit code.
pub async fn run_command(
    client: &Client,
    sb: &SandboxRef,
    cmd: &str,
    args: &[String],
    timeout_ms: Option<u64>,
    mut on_output: impl FnMut(bool, &[u8]),
) -> anyhow::Result<i32> {
    let req = StartRequest {
        process: Some(ProcessConfig {
            cmd: cmd.to_string(),
            args: args.to_vec(),
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let resp = client
        .envd_stream(sb, &process::path(process::method::START), &req, timeout_ms)
        .await?;
    let mut body = resp.into_body();
    let mut decoder = EnvelopeDecoder::new();
    let mut exit = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        decoder.push(&data);
        while let Some(f) = decoder.next_frame::<StartResponse>()? {
            match f {
                StreamFrame::Message(StartResponse {
                    event: Some(ProcessEvent { event: Some(ev) }),
                }) => match ev {
                    Event::Data(DataEvent {
                        output: Some(Output::Stderr(b)),
                    }) => on_output(true, &b),
                    Event::Data(DataEvent {
                        output: Some(Output::Stdout(b) | Output::Pty(b)),
                    }) => on_output(false, &b),
                    Event::End(end) => exit = Some(end.exit_code),
                    _ => {}
                },
                StreamFrame::Message(_) => {}
                StreamFrame::End(end) => {
                    if let Some(err) = end.error {
                        bail!("command failed: {}: {}", err.code, err.message);
                    }
                }
            }
        }
    }
    exit.context("the command stream ended without an exit event")
}
