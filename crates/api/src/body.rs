//! Request bodies: the one way every handler parses its optional JSON body.

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Parse an optional JSON body: empty → `T::default()`, malformed → 400 in E2B's shape.
pub(crate) fn parse_body<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}
