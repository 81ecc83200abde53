//! Request helpers shared by the handler modules (a leaf): optional JSON bodies, timeouts,
//! `limit` values, query strings and the `x-next-token` page cursor.

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

type ApiResult<T> = Result<T, ApiError>;

/// Parse an optional JSON body: empty → `T::default()`, malformed → 400 in E2B's shape.
pub(crate) fn parse_body<T: DeserializeOwned + Default>(body: &Bytes) -> ApiResult<T> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

pub(crate) fn timeout_secs(t: Option<i64>) -> ApiResult<Option<u64>> {
    match t {
        None => Ok(None),
        Some(t) if t < 0 => Err(ApiError::bad_request(
            "Timeout must be a non-negative number of seconds",
        )),
        Some(t) => Ok(Some(t as u64)),
    }
}

/// A `limit` query value: a number from 1 to `max`, else 400.
pub(crate) fn parse_limit(v: &str, max: usize) -> ApiResult<usize> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ApiError::bad_request(format!("limit must be a number from 1 to {max}")))
}

/// Paged lists carry the cursor for the next page in `x-next-token`, as E2B's API does.
pub(crate) fn next_token_headers(next_token: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(t) = next_token.and_then(|t| HeaderValue::from_str(t).ok()) {
        headers.insert("x-next-token", t);
    }
    headers
}

pub(crate) fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}
