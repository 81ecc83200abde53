//! Forwarding to the API replica that drives a sandbox (`bulkhead api` with several replicas):
//! a request naming a sandbox — a REST route under `/sandboxes/{id}`, `/v2/sandboxes/{id}` or
//! `/bulkhead/v1/sandboxes/{id}`, or sandbox traffic addressed by E2B's headers or Host — that
//! [`Engine::locate`] sends to another replica is passed on whole: the same method, path, query
//! and headers (Host included, so the owner routes it the same way), both bodies streamed.
//! Everything else, and everything under `bulkhead serve`, goes on unchanged. The decision is
//! the engine's; this layer only carries the bytes.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::cluster::Route;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

use crate::error::ApiError;
use crate::proxy::{HOP_BY_HOP, named_sandbox};
use crate::state::AppState;

/// Marks a forwarded request: the replica that receives it answers it itself, so two
/// replicas that disagree for a moment about an owner never pass a request back and forth.
const FORWARDED: &str = "x-bulkhead-forwarded";

/// REST route prefixes followed by a sandbox id.
const SANDBOX_ROUTES: &[&str] = &["/sandboxes/", "/v2/sandboxes/", "/bulkhead/v1/sandboxes/"];

#[derive(Debug, thiserror::Error)]
enum ForwardError {
    #[error("its address {addr:?} in the replicas table is not an http://host:port URL")]
    Addr { addr: String },
    #[error("cannot connect to it at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("it did not answer at {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
}

pub async fn to_owner(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if req.headers().contains_key(FORWARDED) {
        return next.run(req).await;
    }
    let Some(id) = sandbox_of(&req) else {
        return next.run(req).await;
    };
    match st.engine.locate(&id).await {
        Ok(Route::Here) => next.run(req).await,
        Ok(Route::Owner { replica, addr }) => match send(&addr, req).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(sandbox = %id, %replica, error = &e as &dyn std::error::Error, "forwarding to the replica that drives the sandbox failed");
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "Sandbox {id} is driven by API replica {replica}, which did not answer ({e}): retry; if that replica is down, another takes the sandbox over within seconds"
                    ),
                )
                .into_response()
            }
        },
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The sandbox a request names, if any (the id as given; the engine normalises it).
fn sandbox_of(req: &Request) -> Option<String> {
    if let Some(id) = named_sandbox(req) {
        return Some(id);
    }
    let path = req.uri().path();
    let rest = SANDBOX_ROUTES.iter().find_map(|p| path.strip_prefix(p))?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// Sends `req` to the replica at `addr` over a connection of its own, and returns its answer
/// with the body still streaming.
async fn send(addr: &str, req: Request) -> Result<Response, ForwardError> {
    let bad = || ForwardError::Addr {
        addr: addr.to_owned(),
    };
    let uri: Uri = addr.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad());
    }
    let host = uri.host().ok_or_else(bad)?;
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|source| ForwardError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    // Interactive streams (a command's output) should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let http = |source| ForwardError::Http {
        addr: addr.to_owned(),
        source,
    };
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.map_err(http)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = req.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(*h);
    }
    // An HTTP/2 request carries its host in the URI, not a header: keep it for the owner.
    if !parts.headers.contains_key(axum::http::header::HOST)
        && let Some(v) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(axum::http::header::HOST, v);
    }
    parts
        .headers
        .insert(FORWARDED, HeaderValue::from_static("1"));
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = pq.parse().map_err(|_| bad())?;
    parts.version = axum::http::Version::HTTP_11;
    let resp = sender
        .send_request(hyper::Request::from_parts(parts, body))
        .await
        .map_err(http)?;
    let (mut parts, body) = resp.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(*h);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(uri: &str, headers: &[(&str, &str)]) -> Option<String> {
        let mut req = Request::builder().uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        sandbox_of(&req.body(Body::empty()).unwrap())
    }

    #[test]
    fn which_requests_name_a_sandbox() {
        assert_eq!(named("/sandboxes/abc", &[]).as_deref(), Some("abc"));
        assert_eq!(
            named("/sandboxes/abc/pause?x=1", &[]).as_deref(),
            Some("abc")
        );
        assert_eq!(named("/v2/sandboxes/abc/logs", &[]).as_deref(), Some("abc"));
        assert_eq!(
            named("/bulkhead/v1/sandboxes/abc/files", &[]).as_deref(),
            Some("abc")
        );
        assert_eq!(named("/sandboxes", &[]), None);
        assert_eq!(named("/v2/sandboxes", &[]), None);
        assert_eq!(named("/sandboxes/", &[]), None);
        assert_eq!(named("/templates/abc", &[]), None);
        assert_eq!(
            named(
                "/process.Process/Start",
                &[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49983")]
            )
            .as_deref(),
            Some("abc")
        );
        assert_eq!(
            named("/files", &[("host", "49983-abc.localhost:3000")]).as_deref(),
            Some("abc")
        );
    }
}
