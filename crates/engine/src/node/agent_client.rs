//! A minimal HTTP/1.1 client over an [`AgentStream`], used by the engine for the agent's
//! internal routes (`/init`, the agent info route). Client traffic does not go through here: the API's
//! routing proxy forwards it byte-for-byte.

use bulkhead_envd::protocol::{AGENT_INFO_PATH, AgentInfo};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::node::driver::AgentStream;

/// The HTTP causes are boxed: a node reached over the network (crates/node) reports hyper's
/// error as its chain of messages, which no `hyper::Error` can be rebuilt from.
#[derive(Debug, thiserror::Error)]
pub enum AgentClientError {
    #[error("HTTP handshake with the agent failed")]
    Handshake(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("Request to the agent failed")]
    Request(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("Invalid request to the agent")]
    Build(#[source] http::Error),
    #[error("Request body could not be encoded")]
    Encode(#[source] serde_json::Error),
    #[error("Agent answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("The agent's description of itself is not valid JSON")]
    Decode(#[source] serde_json::Error),
}

/// What an agent's answer to `POST /init` says about it: agents that predate versioning answer
/// 204 with no body (the legacy protocol); newer ones answer with their [`AgentInfo`].
pub fn info_from_init(body: &[u8]) -> AgentInfo {
    if body.iter().all(u8::is_ascii_whitespace) {
        return AgentInfo::legacy();
    }
    serde_json::from_slice(body).unwrap_or_else(|e| {
        // Not fatal: the agent took its identity; it only described itself in a way this
        // server does not understand, which the oldest protocol covers.
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            "agent answered /init with an unknown body; assuming the legacy protocol"
        );
        AgentInfo::legacy()
    })
}

/// Ask the agent on the host-only info route which protocol it speaks; a 404 is an agent that
/// predates versioning.
pub async fn agent_info(stream: AgentStream) -> Result<AgentInfo, AgentClientError> {
    match request::<()>(stream, http::Method::GET, AGENT_INFO_PATH, None, None).await {
        Ok(body) => serde_json::from_slice(&body).map_err(AgentClientError::Decode),
        Err(AgentClientError::Status { status: 404, .. }) => Ok(AgentInfo::legacy()),
        Err(e) => Err(e),
    }
}

/// Send one request and return the body of a 2xx answer.
pub async fn request<T: serde::Serialize + ?Sized>(
    stream: AgentStream,
    method: http::Method,
    path: &str,
    json_body: Option<&T>,
    access_token: Option<&str>,
) -> Result<Bytes, AgentClientError> {
    let body = match json_body {
        Some(v) => Bytes::from(serde_json::to_vec(v).map_err(AgentClientError::Encode)?),
        None => Bytes::new(),
    };
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(token) = access_token {
        builder = builder.header("X-Access-Token", token);
    }
    let req = builder
        .body(Full::new(body))
        .map_err(AgentClientError::Build)?;
    ok_body(send(stream, req).await?).await
}

/// Sends `req` on a fresh HTTP/1.1 connection over `stream` (with `Host: agent` when it has
/// none, and the id of the API request that caused it, so the agent's log lines name it) and
/// returns the answer as it starts: its body streams from the agent.
pub async fn send(
    stream: AgentStream,
    mut req: http::Request<Full<Bytes>>,
) -> Result<http::Response<Incoming>, AgentClientError> {
    req.headers_mut()
        .entry(http::header::HOST)
        .or_insert(http::HeaderValue::from_static("agent"));
    add_request_id(req.headers_mut());
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| AgentClientError::Handshake(e.into()))?;
    // The connection future drives I/O; it ends when the answer's body is done (or dropped).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| AgentClientError::Request(e.into()))
}

/// Sets `X-Request-Id` to the current request's id, if this task serves one.
pub fn add_request_id(headers: &mut http::HeaderMap) {
    use bulkhead_common::request_id;
    if let Some(v) = request_id::current().and_then(|id| http::HeaderValue::from_str(&id).ok()) {
        headers.insert(request_id::HEADER, v);
    }
}

/// The answer itself when it is 2xx; otherwise an error carrying the agent's body.
pub async fn success(
    resp: http::Response<Incoming>,
) -> Result<http::Response<Incoming>, AgentClientError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| AgentClientError::Request(e.into()))?
        .to_bytes();
    Err(AgentClientError::Status {
        status: status.as_u16(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// The whole body of a 2xx answer ([`success`]).
pub async fn ok_body(resp: http::Response<Incoming>) -> Result<Bytes, AgentClientError> {
    Ok(success(resp)
        .await?
        .into_body()
        .collect()
        .await
        .map_err(|e| AgentClientError::Request(e.into()))?
        .to_bytes())
}
