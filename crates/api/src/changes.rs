//! `GET /sandboxes/{id}/changes[?since=<snapshot id>]` (Bulkhead's own route, documented in
//! `openapi/bulkhead.yaml`): the files created, modified and deleted in a sandbox since it
//! started (or since the snapshot), sorted by path.

use axum::extract::{Path, Request, State};
use axum::{Extension, Json};
use bulkhead_engine::Caller;
use bulkhead_engine::driver::{ChangeKind, FileChange};
use serde::{Deserialize, Serialize};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::state::AppState;

/// One changed path, as `GET /sandboxes/{id}/changes` returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = FileChange)]
pub struct Change {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// `created`, `modified` or `deleted`.
    pub kind: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub file_type: String,
    /// Bytes (0 for directories and deletions).
    pub size: u64,
    /// Modification time, RFC 3339 (absent for deletions).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub mtime: Option<String>,
}

impl From<&FileChange> for Change {
    fn from(c: &FileChange) -> Self {
        Self {
            path: c.path.clone(),
            kind: match c.kind {
                ChangeKind::Created => "created",
                ChangeKind::Modified => "modified",
                ChangeKind::Deleted => "deleted",
            }
            .into(),
            file_type: c.file_type.clone(),
            size: c.size,
            mtime: c
                .mtime
                .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
                .map(|t| crate::wire::rfc3339(&t)),
        }
    }
}

pub fn routes() -> OpenApiRouter<AppState> {
    crate::docs::tagged(OpenApiRouter::new().routes(routes!(changes)), "sandboxes")
}

#[utoipa::path(get, path = "/sandboxes/{id}/changes", params(("id" = String, Path, description = "The sandbox ID"),
    ("since" = Option<String>, Query, description = "A snapshot ID or name to diff against (default: the template)")),
    responses((status = 200, description = "Files created, modified or deleted", body = Vec<Change>)))]
async fn changes(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<Vec<Change>>, ApiError> {
    let mut since = None;
    for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        if k == "since" {
            since = Some(v.into_owned());
        }
    }
    let list = st.engine.changes(&caller, &id, since.as_deref()).await?;
    Ok(Json(list.iter().map(Change::from).collect()))
}
