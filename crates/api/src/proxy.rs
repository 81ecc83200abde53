//! Routing proxy: SDK traffic addressed to a sandbox is forwarded, unchanged, to that sandbox's
//! agent over the driver's transport (a Unix socket for the jail). One upstream connection per
//! request: when the client goes away the response body is dropped, the upstream connection
//! closes and the agent sees the disconnect; when the sandbox dies its socket closes and the
//! client's stream ends.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::{EngineError, Refusal};
use bulkhead_envd::rest::FileOperation;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::error::ApiError;
use crate::state::AppState;

pub const ENVD_PORT: u16 = 49983;

const HDR_ID: &str = "e2b-sandbox-id";
const HDR_PORT: &str = "e2b-sandbox-port";

#[derive(Debug, PartialEq)]
enum Target {
    ControlPlane,
    Sandbox { id: String, port: u16 },
}

pub async fn route_to_sandbox(State(st): State<AppState>, req: Request, next: Next) -> Response {
    match target(&st, &req) {
        Ok(Target::ControlPlane) => next.run(req).await,
        Ok(Target::Sandbox { id, port }) => forward(&st, id, port, req).await,
        Err(e) => e.into_response(),
    }
}

fn target(st: &AppState, req: &Request) -> Result<Target, ApiError> {
    let h = req.headers();
    let id = h.get(HDR_ID).and_then(|v| v.to_str().ok());
    let port = h.get(HDR_PORT).and_then(|v| v.to_str().ok());
    match (id, port) {
        (Some(id), Some(port)) => {
            let port = port.trim().parse().map_err(|_| {
                ApiError::bad_request(format!("Invalid header E2b-Sandbox-Port: {port:?}"))
            })?;
            return Ok(Target::Sandbox {
                id: id.trim().to_string(),
                port,
            });
        }
        (Some(_), None) => return Err(ApiError::bad_request("Missing header: E2b-Sandbox-Port")),
        (None, Some(_)) => return Err(ApiError::bad_request("Missing header: E2b-Sandbox-Id")),
        (None, None) => {}
    }
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host());
    if let Some(t) = host.and_then(parse_host) {
        return Ok(t);
    }
    // Signed download/upload URLs built on one shared sandbox URL carry no sandbox id: find the
    // sandbox whose access token produced the signature.
    if req.uri().path() == "/files" {
        let q: Vec<(String, String)> =
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if let Some(sig) = get("signature") {
            let op = if req.method() == axum::http::Method::GET {
                FileOperation::Read
            } else {
                FileOperation::Write
            };
            // An expiration that is not a number can match no signature.
            let expiration = match get("signature_expiration") {
                Some(e) => e.parse().ok().map(Some),
                None => Some(None),
            };
            let found = expiration.and_then(|exp| {
                st.engine.find_by_file_signature(
                    get("path").unwrap_or(""),
                    op,
                    get("username").unwrap_or(""),
                    sig,
                    exp,
                )
            });
            return match found {
                Some(id) => Ok(Target::Sandbox {
                    id,
                    port: ENVD_PORT,
                }),
                None => Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "Invalid file URL signature: the sandbox is gone or the URL was altered; request a new URL",
                )),
            };
        }
    }
    Ok(Target::ControlPlane)
}

/// The sandbox that sandbox traffic names by E2B's headers or its Host, if any (a signed
/// `/files` URL names none: it is found by its signature among the live sandboxes).
pub(crate) fn named_sandbox(req: &Request) -> Option<String> {
    let h = req.headers();
    if let Some(id) = h.get(HDR_ID).and_then(|v| v.to_str().ok()) {
        return Some(id.trim().to_string());
    }
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())?;
    sandbox_of_host(host)
}

/// The sandbox a `{port}-{sandboxID}.{domain}` host routes to (E2B's host scheme), as the
/// routing proxy reads it; the listener's connection reserve asks the same question.
pub fn sandbox_of_host(host: &str) -> Option<String> {
    match parse_host(host)? {
        Target::Sandbox { id, .. } => Some(id),
        _ => None,
    }
}

/// `{port}-{sandboxID}.{domain}` → target (E2B's host scheme).
fn parse_host(host: &str) -> Option<Target> {
    let first = host.split('.').next()?;
    if first.len() == host.len() {
        return None;
    }
    let (port, id) = first.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return None;
    }
    Some(Target::Sandbox {
        id: id.to_string(),
        port,
    })
}

/// The answer for traffic to a sandbox that cannot take it (E2B's proxy shapes).
fn unavailable(id: &str, e: &EngineError) -> Response {
    match e {
        // A sandbox whose processes are gone is answered as gone even before its death is
        // recorded: the SDKs probe `/health` after a dropped stream and raise "killed or reached
        // its end of life" only on this answer.
        EngineError::SandboxNotFound(_) => not_found_502(id, "The sandbox was not found"),
        e if e.sandbox_exited() => not_found_502(id, "The sandbox was not found"),
        // E2B's proxy answers a paused sandbox (without auto-resume) as not running; the SDK
        // keys on "The sandbox was not found".
        EngineError::Refused {
            reason: Refusal::Paused,
            ..
        } => not_found_502(
            id,
            "The sandbox was not found: it is paused; resume it with Sandbox.connect() (or create it with lifecycle auto_resume)",
        ),
        // Says which versions and what to do; more use than "port is not open".
        EngineError::AgentTooOld { .. } => not_found_502(id, &e.to_string()),
        e => {
            tracing::warn!(sandbox = %id, error = %e, "agent unreachable");
            not_found_502(id, "The sandbox is running but port is not open")
        }
    }
}

/// Largest request body read (and dropped) before an error answer; a bigger one closes the
/// connection instead.
const DRAIN_LIMIT: usize = 1 << 20;
/// How long an error answer waits for the rest of a request body.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

async fn drain(body: Body) {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, DRAIN_LIMIT);
    let _ = tokio::time::timeout(DRAIN_TIME, limited.collect()).await;
}

fn not_found_502(id: &str, message: &str) -> Response {
    let body = serde_json::json!({ "sandboxId": id, "message": message, "code": 502 });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

async fn forward(st: &AppState, id: String, port: u16, req: Request) -> Response {
    if port == ENVD_PORT && bulkhead_envd::rest::HOST_ONLY_PATHS.contains(&req.uri().path()) {
        return ApiError::not_found("Not found").into_response();
    }
    let stream = match st.engine.agent_stream(&id).await {
        Ok(s) => s,
        Err(e) => {
            let answer = unavailable(&id, &e);
            // Read what the client is still sending first: a response to a request whose body
            // was left unread closes the connection, which a client reusing it for its next
            // request sees as "connection closed before message completed".
            drain(req.into_body()).await;
            return answer;
        }
    };
    let (mut sender, conn) = match http1::handshake(TokioIo::new(stream)).await {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "agent handshake failed");
            return not_found_502(&id, "The sandbox was not found");
        }
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });

    let (mut parts, body) = req.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(*h);
    }
    parts
        .headers
        .insert(HeaderName::from_static(HDR_PORT), HeaderValue::from(port));
    if let Ok(v) = HeaderValue::from_str(&id) {
        parts.headers.insert(HeaderName::from_static(HDR_ID), v);
    }
    let pq = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = match pq.parse() {
        Ok(u) => u,
        Err(_) => return ApiError::bad_request("Invalid request path").into_response(),
    };
    parts.version = axum::http::Version::HTTP_11;
    let upstream = hyper::Request::from_parts(parts, body);
    match sender.send_request(upstream).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            for h in HOP_BY_HOP {
                parts.headers.remove(*h);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "forwarding to agent failed");
            if st.engine.is_live(&id) {
                not_found_502(&id, "The sandbox is running but port is not open")
            } else {
                not_found_502(&id, "The sandbox was not found")
            }
        }
    }
}

pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_scheme() {
        assert_eq!(
            parse_host("49983-abc123.localhost:3000"),
            Some(Target::Sandbox {
                id: "abc123".into(),
                port: 49983
            })
        );
        assert_eq!(parse_host("127.0.0.1:3000"), None);
        assert_eq!(parse_host("localhost:3000"), None);
        assert_eq!(parse_host("api.example.com"), None);
        assert_eq!(parse_host("80-ABC.example.com"), None);
        assert_eq!(parse_host("x-abc.example.com"), None);
    }
}
