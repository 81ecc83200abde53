//! Test harness: runs the real `bulkhead-agent` binary on a Unix socket in a temporary
//! directory and talks HTTP/1.1 to it with a plain hyper client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bulkhead_envd::connect::{
    CONTENT_TYPE_CONNECT_JSON, ConnectError, EndStream, EnvelopeDecoder, StreamFrame,
    encode_message,
};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::UnixStream;

/// Longest any single wait in a test may take before it fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(20);

/// A running agent.
pub struct Agent {
    child: Child,
    socket: PathBuf,
    /// Scratch directory (also holds the socket); world-traversable for user-switch tests.
    pub dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request body: complete, or streamed from a channel.
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

pub fn full(data: impl Into<Bytes>) -> BoxBody {
    Full::new(data.into()).boxed()
}

impl Agent {
    /// Starts the agent with `--default-user root` and extra arguments.
    pub async fn start(extra: &[&str]) -> Agent {
        Self::start_with(None, extra).await
    }

    /// Starts the agent, optionally through a wrapper command (e.g. `unshare`).
    pub async fn start_with(wrapper: Option<&[&str]>, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let socket = dir.path().join("agent.sock");
        let agent = env!("CARGO_BIN_EXE_bulkhead-agent");
        let listen = format!("unix:{}", socket.display());
        let mut args: Vec<String> = Vec::new();
        let program = match wrapper {
            Some(w) => {
                args.extend(w[1..].iter().map(|s| (*s).to_owned()));
                args.push(agent.to_owned());
                w[0].to_owned()
            }
            None => agent.to_owned(),
        };
        args.extend([
            "--listen".to_owned(),
            listen,
            "--default-user".to_owned(),
            "root".to_owned(),
        ]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let child = Command::new(program)
            .args(&args)
            .env(
                "RUST_LOG",
                std::env::var("BULKHEAD_TEST_AGENT_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .stdin(Stdio::null())
            .spawn()
            .expect("agent binary starts");
        let agent = Agent { child, socket, dir };
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(stream) = UnixStream::connect(&agent.socket).await {
                drop(stream);
                if agent.get("/health").await.0 == StatusCode::NO_CONTENT {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        agent
    }

    /// The scratch directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sends a request on a fresh connection.
    pub async fn send(&self, request: Request<BoxBody>) -> Response<Incoming> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .expect("connect to agent");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        tokio::time::timeout(WAIT, sender.send_request(request))
            .await
            .expect("response in time")
            .expect("response")
    }

    /// Sends a request and reads the whole response.
    pub async fn call(&self, request: Request<BoxBody>) -> (StatusCode, HeaderMap, Bytes) {
        let response = self.send(request).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = tokio::time::timeout(WAIT, response.into_body().collect())
            .await
            .expect("body in time")
            .expect("body")
            .to_bytes();
        (status, headers, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, HeaderMap, Bytes) {
        self.call(Request::get(path).body(full(Bytes::new())).unwrap())
            .await
    }

    /// A unary Connect call with extra headers; returns the status and JSON body.
    pub async fn unary_raw(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("content-type", "application/json")
            .header("connect-protocol-version", "1");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let (status, _, body) = self
            .call(
                request
                    .body(full(serde_json::to_vec(body).unwrap()))
                    .unwrap(),
            )
            .await;
        let json = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).expect("JSON body")
        };
        (status, json)
    }

    /// A unary Connect call decoding success into `Resp` and failure into a Connect error.
    pub async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        request: &Req,
        headers: &[(&str, &str)],
    ) -> Result<Resp, (StatusCode, ConnectError)> {
        let (status, json) = self
            .unary_raw(path, &serde_json::to_value(request).unwrap(), headers)
            .await;
        if status == StatusCode::OK {
            Ok(serde_json::from_value(json).expect("response message"))
        } else {
            Err((
                status,
                serde_json::from_value(json).expect("Connect error body"),
            ))
        }
    }

    /// Opens a server stream.
    pub async fn stream<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        request: &Req,
        headers: &[(&str, &str)],
    ) -> EventStream<Resp> {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("content-type", CONTENT_TYPE_CONNECT_JSON)
            .header("connect-protocol-version", "1");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let body = encode_message(request).unwrap();
        let response = self.send(builder.body(full(body)).unwrap()).await;
        assert_eq!(response.status(), StatusCode::OK, "streams answer 200");
        assert_eq!(
            response.headers()["content-type"],
            CONTENT_TYPE_CONNECT_JSON
        );
        EventStream {
            body: response.into_body(),
            decoder: EnvelopeDecoder::new(),
            _marker: std::marker::PhantomData,
        }
    }

    /// Sends a streamed (chunked) request body made of the given chunks, fed over time by the
    /// returned sender.
    pub fn streamed_body() -> (tokio::sync::mpsc::Sender<Bytes>, BoxBody) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|chunk| Ok::<_, std::convert::Infallible>(Frame::data(chunk)));
        (tx, BodyExt::boxed(StreamBody::new(stream)))
    }
}

/// A server stream being read.
pub struct EventStream<T> {
    body: Incoming,
    decoder: EnvelopeDecoder,
    _marker: std::marker::PhantomData<T>,
}

impl<T: DeserializeOwned> EventStream<T> {
    /// The next frame (fails the test after [`WAIT`]).
    pub async fn next(&mut self) -> StreamFrame<T> {
        loop {
            if let Some(frame) = self.decoder.next_frame::<T>().expect("valid envelope") {
                return frame;
            }
            let frame = tokio::time::timeout(WAIT, self.body.frame())
                .await
                .expect("stream frame in time")
                .expect("stream did not end before its end-of-stream message")
                .expect("stream body");
            if let Ok(data) = frame.into_data() {
                self.decoder.push(&data);
            }
        }
    }

    /// The next message; fails if the stream ends instead.
    pub async fn message(&mut self) -> T {
        match self.next().await {
            StreamFrame::Message(m) => m,
            StreamFrame::End(end) => panic!("stream ended early: {end:?}"),
        }
    }

    /// Reads until the end of the stream.
    pub async fn finish(mut self) -> (Vec<T>, EndStream) {
        let mut messages = Vec::new();
        loop {
            match self.next().await {
                StreamFrame::Message(m) => messages.push(m),
                StreamFrame::End(end) => return (messages, end),
            }
        }
    }
}

/// `Authorization` header value selecting `user`.
pub fn basic_auth(user: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:"))
    )
}

/// Polls `check` every 20 ms until it returns `Some`, failing after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
