//! Small HTTP helpers shared by the plain-HTTP routes (`/files`, `/init`, …), the router and
//! the code-interpreter API: E2B's JSON error body and the constant-time token comparison.
//!
//! A leaf: it imports nothing from the crate, so handlers and the router can use it without
//! depending on one another.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bulkhead_envd::rest::ErrorBody;
use serde::Serialize;

/// The plain-HTTP error body `{"code": <status>, "message": "..."}`.
pub fn error_json(status: StatusCode, message: String) -> Response {
    json_response(
        status,
        &ErrorBody {
            code: status.as_u16(),
            message,
        },
    )
}

/// `value` as an `application/json` response with `status`.
pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub use bulkhead_common::constant_time_eq;

/// Most bytes of an unwanted request body read and thrown away before an early answer.
pub const DRAIN_LIMIT: usize = 4 << 20;

/// Reads and discards what is left of a request body (up to [`DRAIN_LIMIT`]) before answering
/// early (a refused token, a wrong content type, an oversized body). Answering and closing
/// while the client is still sending makes its TCP stack see a reset before our answer, so the
/// host proxy would report a closed port instead of the real error.
pub async fn drain(body: Body) {
    drain_stream(body.into_data_stream()).await;
}

async fn drain_stream(mut stream: axum::body::BodyDataStream) {
    use futures::StreamExt as _;
    let mut seen = 0usize;
    while seen <= DRAIN_LIMIT {
        match stream.next().await {
            Some(Ok(data)) => seen += data.len(),
            _ => return,
        }
    }
}

/// Why [`read_limited`] gave no body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the limit (what was sent has been drained, so the answer reaches the client).
    TooLarge,
    /// The client went away or sent a broken body.
    Read,
}

/// The body, read whole when it is at most `limit` bytes.
pub async fn read_limited(body: Body, limit: usize) -> Result<bytes::Bytes, BodyError> {
    use futures::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    while let Some(data) = stream.next().await {
        let data = data.map_err(|_| BodyError::Read)?;
        if buf.len() + data.len() > limit {
            drain_stream(stream).await;
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}
