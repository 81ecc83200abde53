//! `GET /bulkhead/v1/usage` (Bulkhead's own route; docs/usage.md): the metered
//! usage of the caller's team, summed per sandbox, with the team's credit balance. Query:
//! `start`, `end` (RFC 3339 or unix seconds), `key_id`, `sandbox_id`.

use axum::extract::{Request, State};
use axum::{Extension, Json};
use bulkhead_engine::{Caller, UsageFilter, UsageReport};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::http::query_pairs;
use crate::state::AppState;

pub fn routes() -> OpenApiRouter<AppState> {
    crate::docs::tagged(OpenApiRouter::new().routes(routes!(usage)), "bulkhead")
}

/// RFC 3339, or unix seconds, as unix ms.
fn parse_instant(name: &str, v: &str) -> Result<i64, ApiError> {
    if let Ok(secs) = v.parse::<i64>() {
        return Ok(secs.saturating_mul(1000));
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp_millis())
        .map_err(|_| {
            ApiError::bad_request(format!(
                "{name} must be an RFC 3339 timestamp (2026-11-24T10:00:00Z) or unix seconds"
            ))
        })
}

#[utoipa::path(get, path = "/bulkhead/v1/usage",
    params(("start" = Option<String>, Query, description = "RFC 3339 timestamp or unix seconds"),
        ("end" = Option<String>, Query, description = "RFC 3339 timestamp or unix seconds"),
        ("key_id" = Option<String>, Query, description = "Only sandboxes created with this key"),
        ("sandbox_id" = Option<String>, Query, description = "Only this sandbox")),
    responses((status = 200, description = "Metered usage of the caller's team", body = UsageReport)))]
async fn usage(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<UsageReport>, ApiError> {
    let mut f = UsageFilter::default();
    for (k, v) in query_pairs(req.uri().query()) {
        match k.as_str() {
            "start" => f.from_ms = Some(parse_instant("start", &v)?),
            "end" => f.to_ms = Some(parse_instant("end", &v)?),
            "key_id" => f.key_id = Some(v),
            "sandbox_id" => f.sandbox_id = Some(v),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "Unknown query parameter {k:?}: use start, end, key_id or sandbox_id"
                )));
            }
        }
    }
    Ok(Json(st.engine.usage_report(&caller, f).await?))
}
