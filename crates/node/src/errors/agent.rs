//! `AgentCallError` ↔ its detail: `Reach` carries its `DriverError`; `Call` holds an
//! `AgentClientError` (a call to the agent that was made but went wrong):
//!
//! - `Handshake`, `Request`: hyper's error comes back as its chain of messages (the engine holds
//!   these causes boxed for that reason);
//! - `Build`: `http::Error`'s messages are a fixed set; each is rebuilt as the error that writes
//!   it (a message this build of `http` does not write reads as an invalid header value);
//! - `Encode`, `Decode`: serde_json's error as a custom error with the same message;
//! - `Status`: whole, in `agent_status`.

use bulkhead_engine::AgentCallError;
use bulkhead_engine::agent_client::AgentClientError;
use bulkhead_node_proto::v1;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;

use super::fault::{DetailError, cause_chain, driver_of};

/// The detail of a failed call to a sandbox's agent.
pub fn agent_call_detail(e: &AgentCallError) -> v1::NodeError {
    match e {
        AgentCallError::Reach(driver) => v1::NodeError {
            driver: Some(driver.into()),
            ..v1::NodeError::new(NodeCode::AgentReach, e)
        },
        AgentCallError::Call(call) => detail(call),
    }
}

/// The `AgentCallError` a detail describes.
pub fn agent_call_error(mut detail: v1::NodeError) -> Result<AgentCallError, DetailError> {
    match detail.code() {
        NodeCode::AgentReach => Ok(AgentCallError::Reach(driver_of(&mut detail)?)),
        _ => Ok(AgentCallError::Call(rebuild(detail)?)),
    }
}

/// The detail of a call the agent got but that went wrong.
pub fn detail(e: &AgentClientError) -> v1::NodeError {
    let code = match e {
        AgentClientError::Handshake(_) => NodeCode::AgentHandshake,
        AgentClientError::Request(_) => NodeCode::AgentRequest,
        AgentClientError::Build(_) => NodeCode::AgentBuild,
        AgentClientError::Encode(_) => NodeCode::AgentEncode,
        AgentClientError::Status { .. } => NodeCode::AgentStatus,
        AgentClientError::Decode(_) => NodeCode::AgentDecode,
    };
    let mut detail = v1::NodeError::new(code, e);
    if let AgentClientError::Status { status, body } = e {
        detail.agent_status = Some(v1::AgentStatus {
            status: u32::from(*status),
            body: body.clone(),
        });
    }
    detail
}

/// The `AgentClientError` of an agent code's detail.
pub fn rebuild(detail: v1::NodeError) -> Result<AgentClientError, DetailError> {
    const CAUSE: &str = "NodeError.causes (the agent call's cause)";
    let first = || {
        detail
            .causes
            .first()
            .cloned()
            .ok_or(DetailError::Missing { field: CAUSE })
    };
    Ok(match detail.code() {
        NodeCode::AgentHandshake => {
            AgentClientError::Handshake(Box::new(cause_chain(detail.causes, CAUSE)?))
        }
        NodeCode::AgentRequest => {
            AgentClientError::Request(Box::new(cause_chain(detail.causes, CAUSE)?))
        }
        NodeCode::AgentBuild => AgentClientError::Build(http_error(&first()?)),
        NodeCode::AgentEncode => AgentClientError::Encode(json_error(first()?)),
        NodeCode::AgentDecode => AgentClientError::Decode(json_error(first()?)),
        NodeCode::AgentStatus => {
            let s = detail.agent_status.ok_or(DetailError::Missing {
                field: "NodeError.agent_status",
            })?;
            AgentClientError::Status {
                status: u16::try_from(s.status).map_err(|_| DetailError::Missing {
                    field: "NodeError.agent_status.status (an HTTP status)",
                })?,
                body: s.body,
            }
        }
        _ => {
            return Err(DetailError::WrongCode {
                code: detail.code,
                expected: "the agent codes",
            });
        }
    })
}

/// A serde_json error whose message is `message` (a custom error has no position to append).
fn json_error(message: String) -> serde_json::Error {
    <serde_json::Error as serde::de::Error>::custom(message)
}

/// Every `http::Error` the `http` crate can make, one per message it writes.
pub fn http_errors() -> Vec<http::Error> {
    let mut all: Vec<http::Error> = Vec::new();
    all.extend(http::StatusCode::from_u16(0).err().map(Into::into));
    all.extend(http::Method::from_bytes(b"").err().map(Into::into));
    all.extend(http::HeaderName::from_bytes(b"").err().map(Into::into));
    all.extend(http::HeaderValue::from_bytes(b"\n").err().map(Into::into));
    all.extend(
        http::HeaderMap::<()>::try_with_capacity(usize::MAX)
            .err()
            .map(Into::into),
    );
    let long_scheme = format!("{}://a/", "a".repeat(80));
    let too_long = "a".repeat(70_000);
    let uris = [
        "",
        "\u{7f}",
        "http://[::1/",
        "http:/a",
        long_scheme.as_str(),
        too_long.as_str(),
    ];
    for uri in uris {
        all.extend(http::Uri::try_from(uri).err().map(Into::into));
    }
    all.extend(http::uri::Scheme::try_from("h^p").err().map(Into::into));
    all.extend(http::uri::PathAndQuery::try_from("a").err().map(Into::into));
    let parts = [
        http::Uri::builder()
            .authority("a")
            .path_and_query("/")
            .build(),
        http::Uri::builder()
            .scheme("http")
            .path_and_query("/")
            .build(),
        http::Uri::builder().scheme("http").authority("a").build(),
    ];
    all.extend(parts.into_iter().filter_map(Result::err));
    all
}

/// The `http::Error` that writes `message`.
fn http_error(message: &str) -> http::Error {
    let mut all = http_errors();
    match all.iter().position(|e| e.to_string() == message) {
        Some(i) => all.swap_remove(i),
        None => http::HeaderValue::from_bytes(b"\n")
            .err()
            .map(Into::into)
            .unwrap_or_else(|| all.swap_remove(0)),
    }
}
