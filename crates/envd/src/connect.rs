//! The parts of the [Connect protocol](https://connectrpc.com/docs/protocol) that envd clients
//! use: JSON codec, unary and streaming calls over HTTP/1.1.
//!
//! Wire format, both directions:
//!
//! - **Unary**: `POST /<service>/<Method>`, `Content-Type: application/json`, body = the JSON
//!   message. Success is HTTP 200 with the JSON response; failure is the HTTP status from
//!   [`Code::http_status`] with the body `{"code": "<code>", "message": "..."}`.
//! - **Streaming** (`application/connect+json`): the body is a sequence of *envelopes*:
//!
//!   ```text
//!   +-------+----------------------+-------------------+
//!   | flags | length (u32, BE)     | JSON message      |
//!   | 1 B   | 4 B                  | `length` bytes    |
//!   +-------+----------------------+-------------------+
//!   ```
//!
//!   Flag bit `0x01` marks a compressed message (never used by the envd SDKs), bit `0x02` the
//!   *end of stream*: the last envelope of a response, whose JSON is `{}` on success or
//!   `{"error": {"code", "message"}, "metadata": {...}}` on failure. Streaming responses use
//!   HTTP 200 even for errors.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `Content-Type` of unary JSON calls.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// `Content-Type` of streaming JSON calls.
pub const CONTENT_TYPE_CONNECT_JSON: &str = "application/connect+json";
/// Header carrying the protocol version (`1`); accepted but not required by servers.
pub const HEADER_PROTOCOL_VERSION: &str = "connect-protocol-version";
/// Header carrying the call deadline in milliseconds.
pub const HEADER_TIMEOUT_MS: &str = "connect-timeout-ms";
/// envd-specific header: seconds between `keepalive` messages on server streams.
pub const HEADER_KEEPALIVE_INTERVAL: &str = "keepalive-ping-interval";
/// Envelope flag: the message is compressed.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: end of stream.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Size of the envelope prefix.
pub const ENVELOPE_PREFIX_LEN: usize = 5;
/// Default largest accepted envelope payload (64 MiB).
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 64 << 20;

/// Connect error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The operation was cancelled, typically by the caller.
    Canceled,
    /// Unknown error.
    Unknown,
    /// The request is invalid regardless of system state.
    InvalidArgument,
    /// The deadline expired before the operation completed.
    DeadlineExceeded,
    /// A requested entity was not found.
    NotFound,
    /// The entity the caller tried to create already exists.
    AlreadyExists,
    /// The caller may not perform the operation.
    PermissionDenied,
    /// A resource (quota, capacity) is exhausted.
    ResourceExhausted,
    /// The system is not in a state required for the operation.
    FailedPrecondition,
    /// The operation was aborted, typically due to a concurrency issue.
    Aborted,
    /// The operation was attempted past the valid range.
    OutOfRange,
    /// The operation is not implemented or supported.
    Unimplemented,
    /// An invariant of the server is broken.
    Internal,
    /// The service is temporarily unavailable.
    Unavailable,
    /// Unrecoverable data loss or corruption.
    DataLoss,
    /// The caller is not (validly) authenticated.
    Unauthenticated,
}

impl Code {
    /// All codes.
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire name, e.g. `not_found`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary error with this code is sent with.
    pub const fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }

    /// The code a client infers from an HTTP status when the body is not a Connect error
    /// (e.g. an error page from a proxy), per the Connect specification.
    pub const fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502..=504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Returned when a string is not a Connect code name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown Connect error code {0:?}")]
pub struct UnknownCode(pub String);

impl FromStr for Code {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Code::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        // Unknown names from a newer peer degrade to `unknown` rather than failing the parse.
        Ok(name.parse().unwrap_or(Code::Unknown))
    }
}

/// A Connect error: a code and a message meant for the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ConnectError {
    /// Error code.
    pub code: Code,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl ConnectError {
    /// Creates an error.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `invalid_argument`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// `unauthenticated`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, message)
    }

    /// `unimplemented`.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// `deadline_exceeded`.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message)
    }

    /// The HTTP status for a unary response carrying this error.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The JSON body of a unary error response.
    pub fn to_json(&self) -> Bytes {
        // Serializing a struct of a string-like enum and a string cannot fail.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    /// Parses a unary error response body, falling back to the code implied by the HTTP status
    /// when the body is not a Connect error.
    pub fn from_unary_response(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<ConnectError>(body) {
            Ok(err) => err,
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let message = if text.trim().is_empty() {
                    format!("HTTP status {status}")
                } else {
                    format!("HTTP status {status}: {}", text.trim())
                };
                Self::new(Code::from_http_status(status), message)
            }
        }
    }
}

/// The payload of an end-of-stream envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EndStream {
    /// Set when the stream failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
    /// Trailers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, Vec<String>>,
}

/// One envelope of a streaming body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Flag bits ([`FLAG_COMPRESSED`], [`FLAG_END_STREAM`]).
    pub flags: u8,
    /// Payload.
    pub data: Bytes,
}

impl Envelope {
    /// Whether this is the end-of-stream envelope.
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }

    /// Whether the payload is compressed.
    pub fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }

    /// Encodes this envelope.
    pub fn encode(&self) -> Bytes {
        encode_envelope(self.flags, &self.data)
    }
}

/// Errors of the envelope framing and of message (de)coding.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// An envelope announced more bytes than allowed.
    #[error("Message of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced payload length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The body ended in the middle of an envelope.
    #[error("Stream ended in the middle of a message ({have} of {need} bytes received)")]
    Truncated {
        /// Bytes received for the partial envelope.
        have: usize,
        /// Bytes the envelope needs.
        need: usize,
    },
    /// A compressed envelope arrived although no compression was negotiated.
    #[error("Received a compressed message, but compression was not negotiated")]
    Compressed,
    /// The payload is not valid JSON for the expected message.
    #[error("Invalid message JSON")]
    Json(#[source] serde_json::Error),
    /// The stream ended with an error.
    #[error(transparent)]
    Remote(#[from] ConnectError),
    /// The stream ended without an end-of-stream envelope.
    #[error("Stream ended without an end-of-stream message")]
    MissingEndStream,
}

impl EnvelopeError {
    /// The Connect error a server reports for this framing problem.
    pub fn to_connect_error(&self) -> ConnectError {
        match self {
            EnvelopeError::Remote(err) => err.clone(),
            EnvelopeError::TooLarge { .. } => {
                ConnectError::new(Code::ResourceExhausted, self.to_string())
            }
            EnvelopeError::Compressed => ConnectError::new(Code::Internal, self.to_string()),
            EnvelopeError::Json(e) => ConnectError::invalid_argument(format!("{self}: {e}")),
            EnvelopeError::Truncated { .. } | EnvelopeError::MissingEndStream => {
                ConnectError::invalid_argument(self.to_string())
            }
        }
    }
}

/// Frames `data` in an envelope with `flags`.
pub fn encode_envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(ENVELOPE_PREFIX_LEN + data.len());
    out.put_u8(flags);
    // Payloads are bounded far below 4 GiB by every producer in this crate.
    out.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
    out.put_slice(data);
    out.freeze()
}

/// Serializes `message` to JSON and frames it in a data envelope.
pub fn encode_message<T: Serialize>(message: &T) -> Result<Bytes, serde_json::Error> {
    Ok(encode_envelope(0, &serde_json::to_vec(message)?))
}

/// Frames an end-of-stream envelope: `{}` on success, `{"error": ...}` on failure.
pub fn encode_end_stream(error: Option<&ConnectError>) -> Bytes {
    let end = EndStream {
        error: error.cloned(),
        metadata: BTreeMap::new(),
    };
    encode_envelope(
        FLAG_END_STREAM,
        &serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// Parses a JSON message, mapping failures to `invalid_argument`. An empty body is the empty
/// message `{}`.
pub fn decode_json<T: DeserializeOwned>(data: &[u8]) -> Result<T, ConnectError> {
    let data = if data.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        data
    };
    from_json(data).map_err(|e| {
        ConnectError::invalid_argument(format!(
            "The request message is not valid JSON for this method: {e}"
        ))
    })
}

/// Parses a proto3 JSON message.
///
/// The proto3 JSON mapping reads `null` as "the field's default value" for every field type,
/// which the generated deserializers accept only for message fields: object members whose value
/// is `null` are removed first, at every depth, so they read as absent.
pub fn from_json<T: DeserializeOwned>(data: &[u8]) -> Result<T, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_slice(data)?;
    drop_null_members(&mut value);
    T::deserialize(value)
}

fn drop_null_members(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_null_members);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_null_members),
        _ => {}
    }
}

/// One decoded frame of a response stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamFrame<T> {
    /// A message.
    Message(T),
    /// The end of the stream (check [`EndStream::error`]).
    End(EndStream),
}

/// Incremental envelope decoder: push body bytes as they arrive, pull complete envelopes.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
    max_len: usize,
}

impl Default for EnvelopeDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvelopeDecoder {
    /// A decoder accepting payloads up to [`DEFAULT_MAX_MESSAGE_LEN`].
    pub fn new() -> Self {
        Self::with_max_len(DEFAULT_MAX_MESSAGE_LEN)
    }

    /// A decoder accepting payloads up to `max_len` bytes.
    pub fn with_max_len(max_len: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            max_len,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Number of buffered bytes not yet returned as envelopes.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Returns the next complete envelope, if one is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, EnvelopeError> {
        if self.buf.len() < ENVELOPE_PREFIX_LEN {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.max_len {
            return Err(EnvelopeError::TooLarge {
                len,
                max: self.max_len,
            });
        }
        if self.buf.len() < ENVELOPE_PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.advance(ENVELOPE_PREFIX_LEN);
        let data = self.buf.split_to(len).freeze();
        Ok(Some(Envelope { flags, data }))
    }

    /// Returns the next decoded frame of a response stream, if one is buffered.
    pub fn next_frame<T: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<StreamFrame<T>>, EnvelopeError> {
        let Some(env) = self.next_envelope()? else {
            return Ok(None);
        };
        if env.is_compressed() {
            return Err(EnvelopeError::Compressed);
        }
        if env.is_end_stream() {
            let end: EndStream = if env.data.is_empty() {
                EndStream::default()
            } else {
                serde_json::from_slice(&env.data).map_err(EnvelopeError::Json)?
            };
            return Ok(Some(StreamFrame::End(end)));
        }
        let msg = from_json(&env.data).map_err(EnvelopeError::Json)?;
        Ok(Some(StreamFrame::Message(msg)))
    }

    /// Checks that the body ended on an envelope boundary.
    pub fn finish(&self) -> Result<(), EnvelopeError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let need = if self.buf.len() >= ENVELOPE_PREFIX_LEN {
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            ENVELOPE_PREFIX_LEN + usize::try_from(len).unwrap_or(usize::MAX)
        } else {
            ENVELOPE_PREFIX_LEN
        };
        Err(EnvelopeError::Truncated {
            have: self.buf.len(),
            need,
        })
    }
}

/// Decodes a complete streaming response body into its messages, failing with the stream's
/// error if it ended with one.
pub fn decode_stream_body<T: DeserializeOwned>(body: &[u8]) -> Result<Vec<T>, EnvelopeError> {
    let mut decoder = EnvelopeDecoder::new();
    decoder.push(body);
    let mut out = Vec::new();
    while let Some(frame) = decoder.next_frame()? {
        match frame {
            StreamFrame::Message(m) => out.push(m),
            StreamFrame::End(end) => {
                decoder.finish()?;
                return match end.error {
                    Some(err) => Err(EnvelopeError::Remote(err)),
                    None => Ok(out),
                };
            }
        }
    }
    decoder.finish()?;
    Err(EnvelopeError::MissingEndStream)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn codes_round_trip_and_map_to_http() {
        for code in Code::ALL {
            assert_eq!(code.as_str().parse::<Code>().unwrap(), code);
        }
        assert_eq!(Code::NotFound.http_status(), 404);
        assert_eq!(Code::AlreadyExists.http_status(), 409);
        assert_eq!(Code::InvalidArgument.http_status(), 400);
        assert_eq!(Code::Unauthenticated.http_status(), 401);
        assert_eq!(Code::PermissionDenied.http_status(), 403);
        assert_eq!(Code::ResourceExhausted.http_status(), 429);
        assert_eq!(Code::Unimplemented.http_status(), 501);
        assert_eq!(Code::Unavailable.http_status(), 503);
        assert_eq!(Code::DeadlineExceeded.http_status(), 504);
        assert_eq!(Code::Internal.http_status(), 500);
        assert_eq!(Code::Unknown.http_status(), 500);
        assert_eq!(Code::Canceled.http_status(), 499);
        assert_eq!(Code::from_http_status(502), Code::Unavailable);
        assert!("nope".parse::<Code>().is_err());
    }

    #[test]
    fn error_json() {
        let err = ConnectError::not_found("process with pid 7 not found");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&err.to_json()).unwrap(),
            json!({"code": "not_found", "message": "process with pid 7 not found"})
        );
        let parsed = ConnectError::from_unary_response(404, &err.to_json());
        assert_eq!(parsed, err);
        let proxy = ConnectError::from_unary_response(502, br#"{"code":502,"message":"x"}"#);
        assert_eq!(proxy.code, Code::Unavailable);
        let odd: ConnectError = serde_json::from_value(json!({"code": "brand_new"})).unwrap();
        assert_eq!(odd.code, Code::Unknown);
    }

    #[test]
    fn envelopes_round_trip_across_split_reads() {
        let mut body = Vec::new();
        body.extend_from_slice(&encode_message(&json!({"a": 1})).unwrap());
        body.extend_from_slice(&encode_message(&json!({"b": 2})).unwrap());
        body.extend_from_slice(&encode_end_stream(None));
        assert_eq!(&body[..5], &[0, 0, 0, 0, 7]);

        let mut decoder = EnvelopeDecoder::new();
        let mut frames = Vec::new();
        for chunk in body.chunks(3) {
            decoder.push(chunk);
            while let Some(frame) = decoder.next_frame::<serde_json::Value>().unwrap() {
                frames.push(frame);
            }
        }
        decoder.finish().unwrap();
        assert_eq!(
            frames,
            vec![
                StreamFrame::Message(json!({"a": 1})),
                StreamFrame::Message(json!({"b": 2})),
                StreamFrame::End(EndStream::default()),
            ]
        );
    }

    #[test]
    fn end_stream_with_error() {
        let err = ConnectError::deadline_exceeded("timed out");
        let bytes = encode_end_stream(Some(&err));
        assert_eq!(bytes[0], FLAG_END_STREAM);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes[5..]).unwrap(),
            json!({"error": {"code": "deadline_exceeded", "message": "timed out"}})
        );
        match decode_stream_body::<serde_json::Value>(&bytes) {
            Err(EnvelopeError::Remote(e)) => assert_eq!(e, err),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(&encode_end_stream(None)[5..], b"{}");
    }

    #[test]
    fn framing_errors() {
        let mut d = EnvelopeDecoder::with_max_len(4);
        d.push(&[0, 0, 0, 0, 5]);
        assert!(matches!(
            d.next_envelope(),
            Err(EnvelopeError::TooLarge { len: 5, max: 4 })
        ));
        let mut d = EnvelopeDecoder::new();
        d.push(&[0, 0, 0, 0, 5, b'{']);
        assert!(d.next_envelope().unwrap().is_none());
        assert!(matches!(
            d.finish(),
            Err(EnvelopeError::Truncated { have: 6, need: 10 })
        ));
        let body = encode_message(&json!({})).unwrap();
        assert!(matches!(
            decode_stream_body::<serde_json::Value>(&body),
            Err(EnvelopeError::MissingEndStream)
        ));
        assert_eq!(decode_json::<serde_json::Value>(b"").unwrap(), json!({}));
        assert_eq!(
            decode_json::<serde_json::Value>(b"[").unwrap_err().code,
            Code::InvalidArgument
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Feeds `body` to a decoder in pieces cut at `cuts` (taken modulo the length) and collects
    /// what `next_envelope` returns until the first error.
    fn decode_split(
        body: &[u8],
        cuts: &[usize],
        max: usize,
    ) -> (Vec<Envelope>, Option<String>, EnvelopeDecoder) {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.push(body.len());
        points.sort_unstable();
        let mut decoder = EnvelopeDecoder::with_max_len(max);
        let mut out = Vec::new();
        let mut start = 0;
        for end in points {
            decoder.push(&body[start..end]);
            start = end;
            loop {
                match decoder.next_envelope() {
                    Ok(Some(env)) => out.push(env),
                    Ok(None) => break,
                    Err(e) => return (out, Some(e.to_string()), decoder),
                }
            }
        }
        (out, None, decoder)
    }

    proptest! {
        /// Any bytes, cut anywhere: no panic, and the same envelopes and error as in one piece.
        #[test]
        fn arbitrary_bytes_never_panic_and_splits_do_not_matter(
            body in proptest::collection::vec(any::<u8>(), 0..512),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            max in 0_usize..300,
        ) {
            let (whole, whole_err, _) = decode_split(&body, &[], max);
            let (split, split_err, decoder) = decode_split(&body, &cuts, max);
            prop_assert_eq!(&whole, &split);
            prop_assert_eq!(&whole_err, &split_err);
            if split_err.is_none() {
                let _ = decoder.finish();
            }
            // Typed decoding of the same bytes never panics either.
            let _ = decode_stream_body::<serde_json::Value>(&body);
        }

        /// Encoded envelopes come back unchanged, however the stream is cut.
        #[test]
        fn encode_then_decode_round_trips(
            envelopes in proptest::collection::vec(
                (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..64)),
                0..8,
            ),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut body = Vec::new();
            for (flags, data) in &envelopes {
                body.extend_from_slice(&encode_envelope(*flags, data));
            }
            let (decoded, err, decoder) = decode_split(&body, &cuts, 64);
            prop_assert_eq!(err, None);
            prop_assert!(decoder.finish().is_ok());
            let expected: Vec<Envelope> = envelopes
                .into_iter()
                .map(|(flags, data)| Envelope { flags, data: Bytes::from(data) })
                .collect();
            prop_assert_eq!(decoded, expected);
        }

        /// A length over the limit is refused as soon as the 5-byte prefix is in, before the
        /// payload arrives, with the announced length and the limit.
        #[test]
        fn oversize_lengths_are_rejected(
            max in 0_usize..1_000_000,
            extra in 1_u32..1_000,
            flags in any::<u8>(),
            cut in 0_usize..5,
        ) {
            let len = u32::try_from(max).unwrap() + extra;
            let mut prefix = vec![flags];
            prefix.extend_from_slice(&len.to_be_bytes());
            let mut decoder = EnvelopeDecoder::with_max_len(max);
            decoder.push(&prefix[..cut]);
            prop_assert!(matches!(decoder.next_envelope(), Ok(None)));
            decoder.push(&prefix[cut..]);
            match decoder.next_envelope() {
                Err(EnvelopeError::TooLarge { len: got, max: limit }) => {
                    prop_assert_eq!(got, len as usize);
                    prop_assert_eq!(limit, max);
                }
                other => prop_assert!(false, "expected TooLarge, got {:?}", other),
            }
        }
    }
}
