//! Traffic for an in-sandbox port the agent does not serve itself: the user's own server,
//! reached from outside as `{port}-{id}.{domain}` (E2B's port forwarding). The request goes on,
//! unchanged but for the routing headers, to `127.0.0.1:{port}` in the sandbox's network
//! namespace over a fresh HTTP/1.1 connection; nothing listening answers E2B's 502.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bulkhead_envd::rest::{
    HEADER_ACCESS_TOKEN, HEADER_SANDBOX_ID, HEADER_SANDBOX_PORT, PortClosedBody,
};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

/// Sends `request` to `127.0.0.1:{port}` and streams the answer back.
pub async fn forward(port: u16, request: Request) -> Response {
    let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return port_closed(request.headers());
    };
    let Ok((mut sender, conn)) = http1::handshake(TokioIo::new(stream)).await else {
        return port_closed(request.headers());
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    // Kept (a short string) for the 502 in case the send fails; the answer itself is built
    // only then, not for every forwarded request.
    let sandbox_id = sandbox_id(request.headers()).to_owned();
    let (mut parts, body) = request.into_parts();
    // Routing and envd credentials are for Bulkhead, not for the user's server.
    for name in [HEADER_SANDBOX_ID, HEADER_SANDBOX_PORT, HEADER_ACCESS_TOKEN] {
        parts.headers.remove(name);
    }
    parts.version = axum::http::Version::HTTP_11;
    match sender
        .send_request(hyper::Request::from_parts(parts, body))
        .await
    {
        Ok(response) => response.map(Body::new),
        Err(e) => {
            tracing::debug!(port, error = %e, "forwarding to an in-sandbox port failed");
            closed_answer(sandbox_id)
        }
    }
}

/// E2B's answer for a port nothing listens on.
pub fn port_closed(headers: &HeaderMap) -> Response {
    closed_answer(sandbox_id(headers).to_owned())
}

fn sandbox_id(headers: &HeaderMap) -> &str {
    headers
        .get(HEADER_SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn closed_answer(sandbox_id: String) -> Response {
    let body = PortClosedBody {
        sandbox_id,
        message: "The sandbox is running but port is not open".to_owned(),
        code: 502,
    };
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}
