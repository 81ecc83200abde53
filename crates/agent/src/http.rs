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
use subtle::ConstantTimeEq;

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

/// Constant-time string comparison, for access tokens and URL signatures (the length is not
/// secret: tokens and signatures have fixed lengths).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_whole_strings() {
        assert!(constant_time_eq("tok", "tok"));
        assert!(!constant_time_eq("tok", "tok2"));
        assert!(!constant_time_eq("tok", "toc"));
        assert!(constant_time_eq("", ""));
    }
}
