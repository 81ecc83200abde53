//! `GET /bulkhead/v1/keys` and `DELETE /bulkhead/v1/keys/{id}` (Bulkhead's own routes;
//! docs/console.md): the caller's team's API keys (names, prefixes, last use, never the
//! secret) and revoking one of them. Other teams' keys answer 404, like their sandboxes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use bulkhead_engine::{ApiKey, Caller};
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::rfc3339;

pub fn routes() -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(revoke));
    crate::docs::tagged(r, "bulkhead")
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    pub id: String,
    pub name: String,
    /// The key's first characters (`e2b_1a2b3c`), to recognise it.
    pub prefix: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
    /// The key this request was made with.
    pub current: bool,
}

impl KeyView {
    fn new(k: &ApiKey, caller: &Caller) -> Self {
        KeyView {
            id: k.id.clone(),
            name: k.name.clone(),
            prefix: k.prefix.clone(),
            created_at: rfc3339(&k.created_at),
            last_used_at: k.last_used_at.as_ref().map(rfc3339),
            revoked_at: k.revoked_at.as_ref().map(rfc3339),
            current: k.id == caller.key_id,
        }
    }
}

#[utoipa::path(get, path = "/bulkhead/v1/keys", operation_id = "list_team_keys", responses((status = 200, description = "The caller's team's API keys (never the secret)", body = Vec<KeyView>)))]
async fn list(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<KeyView>>, ApiError> {
    let keys = st.engine.team_keys(&caller).await?;
    Ok(Json(
        keys.iter().map(|k| KeyView::new(k, &caller)).collect(),
    ))
}

#[utoipa::path(delete, path = "/bulkhead/v1/keys/{id}", operation_id = "revoke_team_key", params(("id" = String, Path, description = "The key ID")), responses((status = 204, description = "Revoked")))]
async fn revoke(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if st.engine.revoke_team_key(&caller, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "Your team has no active API key {id:?}: list keys with GET /bulkhead/v1/keys"
        )))
    }
}
