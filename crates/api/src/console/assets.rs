//! The console's files, built into the binary (no CDN, nothing fetched at run time), and the
//! headers every console answer carries: a Content-Security-Policy that allows only these
//! files' script and style (no inline script, no eval, nothing from elsewhere), no framing,
//! no sniffing, no referrer.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const CHARTS: &str = include_str!("assets/charts.js");
const STYLE: &str = include_str!("assets/console.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn page() -> Response {
    serve("text/html; charset=utf-8", INDEX)
}

pub fn file(name: &str) -> Response {
    match name {
        "console.js" => serve("text/javascript; charset=utf-8", SCRIPT),
        "charts.js" => serve("text/javascript; charset=utf-8", CHARTS),
        "console.css" => serve("text/css; charset=utf-8", STYLE),
        _ => {
            crate::error::ApiError::not_found(format!("No console asset {name:?}")).into_response()
        }
    }
}

fn serve(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            // Revalidate: a new server version must not run an old script.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Added to every answer under `/console` (kept when a handler set its own).
pub fn harden(h: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, name: &'static str, value: &'static str| {
        h.entry(name).or_insert(HeaderValue::from_static(value));
    };
    set(h, "content-security-policy", CSP);
    set(h, "x-content-type-options", "nosniff");
    set(h, "x-frame-options", "DENY");
    set(h, "referrer-policy", "no-referrer");
    set(h, "cross-origin-opener-policy", "same-origin");
    set(h, "cross-origin-resource-policy", "same-origin");
    set(h, "cache-control", "no-store");
}
