//! Server side of the Connect protocol (JSON codec) on axum: request decoding, unary and
//! server-streaming responses with keepalives and deadlines, and error responses.
//!
//! Framing and error types live in [`bulkhead_envd::connect`]; see its module docs for the wire
//! format.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bulkhead_envd::connect::{
    self as wire, CONTENT_TYPE_CONNECT_JSON, CONTENT_TYPE_JSON, Code, ConnectError,
    EnvelopeDecoder, HEADER_KEEPALIVE_INTERVAL, HEADER_TIMEOUT_MS,
};
use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, Sleep};

/// Largest request message accepted (64 MiB; `SendInput` may carry large chunks).
pub const MAX_REQUEST_BYTES: usize = 64 << 20;
/// Keepalive interval when the client does not send `Keepalive-Ping-Interval` (envd's default).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Per-call settings taken from the request headers.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// When the call must be over (`Connect-Timeout-Ms`).
    pub deadline: Option<Instant>,
    /// Interval between `keepalive` messages on server streams.
    pub keepalive: Duration,
    /// Request headers.
    pub headers: HeaderMap,
}

impl CallContext {
    /// Reads `Connect-Timeout-Ms` and `Keepalive-Ping-Interval`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ConnectError> {
        let deadline = match headers.get(HEADER_TIMEOUT_MS) {
            None => None,
            Some(value) => {
                let ms: u64 = value
                    .to_str()
                    .ok()
                    .map(str::trim)
                    .filter(|v| !v.is_empty() && v.len() <= 10)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        ConnectError::invalid_argument(format!(
                            "Invalid {HEADER_TIMEOUT_MS} header {value:?}: expected up to 10 digits of milliseconds"
                        ))
                    })?;
                // `0` means no deadline, as in envd.
                (ms > 0).then(|| Instant::now() + Duration::from_millis(ms))
            }
        };
        let keepalive = headers
            .get(HEADER_KEEPALIVE_INTERVAL)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map_or(DEFAULT_KEEPALIVE, Duration::from_secs);
        Ok(Self {
            deadline,
            keepalive,
            headers: headers.clone(),
        })
    }
}

fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(
        value
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase(),
    )
}

fn unsupported_media_type(expected: &str, got: Option<&str>) -> Response {
    let err = ConnectError::new(
        Code::Unimplemented,
        format!(
            "Unsupported content type {:?}: this server speaks Connect with the JSON codec ({expected})",
            got.unwrap_or("")
        ),
    );
    json_response(StatusCode::UNSUPPORTED_MEDIA_TYPE, err.to_json())
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_JSON),
    );
    response
}

/// A unary error response: the code's HTTP status and `{"code","message"}`.
pub fn error_response(err: &ConnectError) -> Response {
    let status =
        StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, err.to_json())
}

/// A unary error response with an explicit status (used for unknown methods: 404).
pub fn error_response_with_status(status: StatusCode, err: &ConnectError) -> Response {
    json_response(status, err.to_json())
}

/// A unary success response.
pub fn unary_ok<T: Serialize>(message: &T) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => json_response(StatusCode::OK, Bytes::from(body)),
        Err(e) => error_response(&ConnectError::internal(format!(
            "Could not encode the response: {e}"
        ))),
    }
}

/// A streaming response that fails before any message: HTTP 200 with only an end-of-stream
/// envelope carrying the error (what connect-go sends).
pub fn stream_error_response(err: &ConnectError) -> Response {
    stream_body_response(Body::from(wire::encode_end_stream(Some(err))))
}

fn stream_body_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_CONNECT_JSON),
    );
    response
}

/// Runs a unary method: checks the content type, decodes the request, applies the deadline and
/// encodes the result.
pub async fn unary<Req, Resp, F, Fut>(headers: &HeaderMap, body: Body, handler: F) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(Req, CallContext) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    let media = media_type(headers);
    if !matches!(media.as_deref(), None | Some("" | CONTENT_TYPE_JSON)) {
        crate::http::drain(body).await;
        return unsupported_media_type(CONTENT_TYPE_JSON, media.as_deref());
    }
    let ctx = match CallContext::from_headers(headers) {
        Ok(ctx) => ctx,
        Err(e) => {
            crate::http::drain(body).await;
            return error_response(&e);
        }
    };
    let bytes = match axum::body::to_bytes(body, MAX_REQUEST_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return error_response(&ConnectError::new(
                Code::ResourceExhausted,
                format!("Could not read the request body (limit {MAX_REQUEST_BYTES} bytes): {e}"),
            ));
        }
    };
    let request: Req = match wire::decode_json(&bytes) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let deadline = ctx.deadline;
    let call = handler(request, ctx);
    let result = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or_else(|_| {
                Err(ConnectError::deadline_exceeded(
                    "The call did not complete before its deadline",
                ))
            }),
        None => call.await,
    };
    match result {
        Ok(response) => unary_ok(&response),
        Err(e) => error_response(&e),
    }
}

/// Reads the single request message of a server-streaming call.
/// Failures are returned as complete responses to send back.
pub async fn read_stream_request<Req: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> Result<Req, Box<Response>> {
    let media = media_type(headers);
    if media.as_deref() != Some(CONTENT_TYPE_CONNECT_JSON) {
        crate::http::drain(body).await;
        return Err(Box::new(unsupported_media_type(
            CONTENT_TYPE_CONNECT_JSON,
            media.as_deref(),
        )));
    }
    let bytes = axum::body::to_bytes(body, MAX_REQUEST_BYTES + wire::ENVELOPE_PREFIX_LEN)
        .await
        .map_err(|e| {
            Box::new(stream_error_response(&ConnectError::new(
                Code::ResourceExhausted,
                format!("Could not read the request body: {e}"),
            )))
        })?;
    let mut decoder = EnvelopeDecoder::with_max_len(MAX_REQUEST_BYTES);
    decoder.push(&bytes);
    let envelope = match decoder.next_envelope() {
        Ok(Some(env)) => env,
        Ok(None) => {
            return Err(Box::new(stream_error_response(
                &ConnectError::invalid_argument(
                    "The request body must hold one enveloped message (flags byte, 4-byte length, JSON)",
                ),
            )));
        }
        Err(e) => return Err(Box::new(stream_error_response(&e.to_connect_error()))),
    };
    if envelope.is_compressed() {
        return Err(Box::new(stream_error_response(
            &wire::EnvelopeError::Compressed.to_connect_error(),
        )));
    }
    wire::decode_json(&envelope.data).map_err(|e| Box::new(stream_error_response(&e)))
}

/// Builds a server-streaming response.
///
/// `first` messages are sent at once; then messages from `source` as they come, with a
/// `keepalive()` message whenever nothing was sent for the keepalive interval. The stream ends
/// when `source` ends (end-of-stream `{}`), yields an error (end-of-stream with that error), or
/// the call's deadline passes (`deadline_exceeded`). Dropping the response (client gone) drops
/// `source`.
pub fn server_stream<T, K>(
    ctx: &CallContext,
    first: Vec<T>,
    source: BoxStream<'static, Result<T, ConnectError>>,
    keepalive: K,
) -> Response
where
    T: Serialize + Send + 'static,
    K: Fn() -> T + Send + 'static,
{
    let state = StreamState {
        pending: first.into(),
        source,
        keepalive_every: ctx.keepalive,
        keepalive_timer: Box::pin(tokio::time::sleep(ctx.keepalive)),
        keepalive,
        deadline: ctx.deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
        done: false,
    };
    let body = futures::stream::unfold(state, |mut state| async move {
        let frame = state.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), state))
    });
    stream_body_response(Body::from_stream(body))
}

struct StreamState<T, K> {
    pending: VecDeque<T>,
    source: BoxStream<'static, Result<T, ConnectError>>,
    keepalive_every: Duration,
    keepalive_timer: Pin<Box<Sleep>>,
    keepalive: K,
    deadline: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl<T: Serialize, K: Fn() -> T> StreamState<T, K> {
    async fn next_frame(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        if let Some(message) = self.pending.pop_front() {
            return Some(self.encode(&message));
        }
        let deadline = async {
            match self.deadline.as_mut() {
                Some(sleep) => sleep.as_mut().await,
                None => std::future::pending().await,
            }
        };
        // The deadline wins ties: when it passed, the client must see `deadline_exceeded` even
        // if the process (killed at the same instant) already reported its end.
        tokio::select! {
            biased;
            () = deadline => {
                self.done = true;
                Some(wire::encode_end_stream(Some(&ConnectError::deadline_exceeded(
                    "The deadline (Connect-Timeout-Ms) passed before the stream completed",
                ))))
            }
            item = self.source.next() => match item {
                Some(Ok(message)) => Some(self.encode(&message)),
                Some(Err(err)) => {
                    self.done = true;
                    Some(wire::encode_end_stream(Some(&err)))
                }
                None => {
                    self.done = true;
                    Some(wire::encode_end_stream(None))
                }
            },
            () = self.keepalive_timer.as_mut() => {
                let message = (self.keepalive)();
                Some(self.encode(&message))
            }
        }
    }

    fn encode(&mut self, message: &T) -> Bytes {
        let next = Instant::now() + self.keepalive_every;
        self.keepalive_timer.as_mut().reset(next);
        match wire::encode_message(message) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.done = true;
                wire::encode_end_stream(Some(&ConnectError::internal(format!(
                    "Could not encode a message: {e}"
                ))))
            }
        }
    }
}

/// Reads a client-streaming request body envelope by envelope.
pub struct ClientStream {
    body: axum::body::BodyDataStream,
    decoder: EnvelopeDecoder,
    finished: bool,
}

impl ClientStream {
    /// Checks the content type and wraps the body; a failure is the response to send back.
    pub fn new(headers: &HeaderMap, body: Body) -> Result<Self, Box<Response>> {
        let media = media_type(headers);
        if media.as_deref() != Some(CONTENT_TYPE_CONNECT_JSON) {
            return Err(Box::new(unsupported_media_type(
                CONTENT_TYPE_CONNECT_JSON,
                media.as_deref(),
            )));
        }
        Ok(Self {
            body: body.into_data_stream(),
            decoder: EnvelopeDecoder::with_max_len(MAX_REQUEST_BYTES),
            finished: false,
        })
    }

    /// The next message, `Ok(None)` at the end of the request body.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ConnectError> {
        loop {
            if let Some(env) = self
                .decoder
                .next_envelope()
                .map_err(|e| e.to_connect_error())?
            {
                if env.is_compressed() {
                    return Err(wire::EnvelopeError::Compressed.to_connect_error());
                }
                if env.is_end_stream() {
                    // Clients do not send end-of-stream envelopes; tolerate one as "done".
                    self.finished = true;
                    return Ok(None);
                }
                return wire::decode_json(&env.data).map(Some);
            }
            if self.finished {
                self.decoder.finish().map_err(|e| e.to_connect_error())?;
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.push(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("Reading the request stream failed: {e}"),
                    ));
                }
                None => self.finished = true,
            }
        }
    }
}

/// A single-message streaming response (client-streaming calls answer this way).
pub fn stream_single<T: Serialize>(message: &T) -> Response {
    let mut body = Vec::new();
    match wire::encode_message(message) {
        Ok(bytes) => {
            body.extend_from_slice(&bytes);
            body.extend_from_slice(&wire::encode_end_stream(None));
        }
        Err(e) => body.extend_from_slice(&wire::encode_end_stream(Some(&ConnectError::internal(
            e.to_string(),
        )))),
    }
    stream_body_response(Body::from(body))
}

/// A stream that never yields and never ends (for streams kept open only by keepalives).
pub fn never<T: Send + 'static>() -> BoxStream<'static, Result<T, ConnectError>> {
    futures::stream::pending().boxed()
}

/// Converts any stream of messages into the boxed form [`server_stream`] takes.
pub fn boxed<T, S>(stream: S) -> BoxStream<'static, Result<T, ConnectError>>
where
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
{
    stream.boxed()
}
