//! A small HTTP/1.1 client for talking to a Bulkhead (or E2B) server: the control plane with
//! `X-API-Key`, and a sandbox's agent through the routing headers.

use anyhow::{Context, bail};
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

    /// Open a Connect server-streaming call on a sandbox's envd and return the raw response.
    pub async fn envd_stream(
        &self,
        sb: &SandboxRef,
        method: &str,
        message: &serde_json::Value,
        timeout_ms: Option<u64>,
    ) -> anyhow::Result<http::Response<Incoming>> {
        let json = message.to_string();
        let mut env = Vec::with_capacity(json.len() + 5);
        env.push(0u8);
        env.extend_from_slice(&(json.len() as u32).to_be_bytes());
        env.extend_from_slice(json.as_bytes());
        let mut b = self
            .builder(http::Method::POST, method)
            .header(http::header::CONTENT_TYPE, "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("E2b-Sandbox-Id", &sb.id)
            .header("E2b-Sandbox-Port", "49983");
        if let Some(t) = &sb.access_token {
            b = b.header("X-Access-Token", t);
        }
        if let Some(ms) = timeout_ms {
            b = b.header("Connect-Timeout-Ms", ms.to_string());
        }
        let resp = self.send(b.body(Full::new(Bytes::from(env)))?).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            bail!("{method}: {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(resp)
    }
}

/// Incremental decoder for Connect streaming envelopes.
#[derive(Default)]
pub struct EnvelopeReader {
    buf: Vec<u8>,
}

pub enum Frame {
    Message(serde_json::Value),
    End(serde_json::Value),
}

impl EnvelopeReader {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    pub fn next_frame(&mut self) -> anyhow::Result<Option<Frame>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let v: serde_json::Value =
            serde_json::from_slice(&self.buf[5..5 + len]).context("bad envelope JSON")?;
        self.buf.drain(..5 + len);
        Ok(Some(if flags & 0x02 != 0 {
            Frame::End(v)
        } else {
            Frame::Message(v)
        }))
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
    use base64::Engine as _;
    let msg =
        serde_json::json!({ "process": { "cmd": cmd, "args": args, "envs": {} }, "stdin": false });
    let resp = client
        .envd_stream(sb, "/process.Process/Start", &msg, timeout_ms)
        .await?;
    let mut body = resp.into_body();
    let mut rd = EnvelopeReader::default();
    let mut exit = None;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        rd.push(data);
        while let Some(f) = rd.next_frame()? {
            match f {
                Frame::Message(v) => {
                    let ev = &v["event"];
                    if let Some(d) = ev.get("data") {
                        for (key, is_err) in [("stdout", false), ("stderr", true), ("pty", false)] {
                            if let Some(s) = d.get(key).and_then(|s| s.as_str()) {
                                let bytes = base64::engine::general_purpose::STANDARD.decode(s)?;
                                on_output(is_err, &bytes);
                            }
                        }
                    } else if let Some(end) = ev.get("end") {
                        exit =
                            Some(end.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0) as i32);
                    }
                }
                Frame::End(v) => {
                    if let Some(err) = v.get("error") {
                        bail!("command failed: {}", err);
                    }
                }
            }
        }
    }
    exit.context("the command stream ended without an exit event")
}
