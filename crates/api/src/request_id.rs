//! Every request (control plane and sandbox proxy alike) gets a request id: the client's
//! `X-Request-Id` if it is sane, else a new one (`bulkhead_common::request_id`). The id is put
//! back on the request (so the proxy forwards it to the agent), made the task's current id (so
//! the engine's own agent calls send it), recorded on a `request` span (so every log line of the
//! request carries it), and returned on the response. One line per request is logged when the
//! answer starts. A small middleware rather than tower-http's request-id layers: those keep
//! any client value, and the sanitizing, the task-local and the span would be three more
//! layers around them.

use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use bulkhead_common::request_id;
use tracing::Instrument;

pub(crate) async fn assign(mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(request_id::HEADER)
        .and_then(|v| v.to_str().ok());
    let id = request_id::accept_or_generate(given);
    // Accepted and generated ids are visible ASCII, so always a valid header value.
    let value = HeaderValue::from_str(&id).expect("request ids are header-safe");
    req.headers_mut().insert(request_id::HEADER, value.clone());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path(),
    );
    // Health probes (load balancers, orchestrators, the tests) poll every few seconds: their
    // lines would drown the rest at info.
    let probe = req.method() == axum::http::Method::GET && req.uri().path() == "/health";
    let started = Instant::now();
    let mut resp = request_id::scope(id, next.run(req))
        .instrument(span.clone())
        .await;
    resp.headers_mut().insert(request_id::HEADER, value);
    let (status, ms) = (resp.status().as_u16(), started.elapsed().as_millis() as u64);
    span.in_scope(|| {
        if probe {
            tracing::debug!(status, ms, "request answered");
        } else {
            tracing::info!(status, ms, "request answered");
        }
    });
    resp
}
