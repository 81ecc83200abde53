//! Persistence routes (E2B REST): pause, resume, snapshots, fork. Each handler only translates
//! between E2B's shapes (`e2b/api/client/models`: `SandboxPauseRequest`, `ResumedSandbox`,
//! `SandboxSnapshotRequest`, `SnapshotInfo`, `SandboxForkRequest`, `SandboxForkResult`) and
//! the engine; `connect` (resume-or-extend) is in `control.rs` with the other sandbox verbs.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use bulkhead_engine::{Caller, ResumeRequest};
use bytes::Bytes;

use crate::error::ApiError;
use crate::http::{next_token_headers, parse_body, parse_limit, query_pairs, timeout_secs};
use crate::state::AppState;
use crate::wire::{ForkBody, PauseBody, ResumeBody, Sandbox, SnapshotBody, SnapshotInfo};

type ApiResult<T> = Result<T, ApiError>;

/// The routes, to be put behind the API-key check.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", delete(delete_template))
}

/// `POST /sandboxes/{id}/pause` → 204; 409 when already paused (the SDK then returns false).
async fn pause(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let b: PauseBody = parse_body(&body)?;
    st.engine
        .pause(&caller, &id, b.memory.unwrap_or(true))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (older SDKs) → 201 with the sandbox; 409 when it runs.
async fn resume(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: ResumeBody = parse_body(&body)?;
    let info = st
        .engine
        .resume(
            &caller,
            &id,
            ResumeRequest {
                timeout: timeout_secs(b.timeout)?,
                memory: b.memory.unwrap_or(true),
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(Sandbox::from(&info))).into_response())
}

/// `POST /sandboxes/{id}/snapshots` → 201 `SnapshotInfo`.
async fn create_snapshot(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: SnapshotBody = parse_body(&body)?;
    let info = st
        .engine
        .create_snapshot(&caller, &id, b.name.as_deref(), b.memory.unwrap_or(true))
        .await?;
    Ok((StatusCode::CREATED, Json(SnapshotInfo::from(&info))).into_response())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=` → 200, the cursor in `x-next-token`.
async fn list_snapshots(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> ApiResult<Response> {
    let (mut sandbox, mut name, mut limit, mut next) = (None, None, None, None);
    for (k, v) in query_pairs(req.uri().query()) {
        match k.as_str() {
            "sandboxID" | "sandboxId" | "sandbox_id" => sandbox = Some(v),
            "name" => name = Some(v),
            "limit" => limit = Some(parse_limit(&v, 100)?),
            "nextToken" => next = Some(v),
            _ => {}
        }
    }
    let page = st
        .engine
        .list_snapshots(
            &caller,
            sandbox.as_deref(),
            name.as_deref(),
            limit,
            next.as_deref(),
        )
        .await?;
    let items: Vec<SnapshotInfo> = page.items.iter().map(SnapshotInfo::from).collect();
    let headers = next_token_headers(page.next_token.as_deref());
    Ok((StatusCode::OK, headers, Json(items)).into_response())
}

/// `DELETE /templates/{id}`: a snapshot is a template (built templates are the operator's).
async fn delete_template(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = urlencoding::decode(&id)
        .map(|c| c.into_owned())
        .unwrap_or(id);
    // E2B deletes snapshots and built templates through this one route.
    if st.engine.is_custom_template(&id) {
        st.engine.delete_template(&id).await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if st.engine.template(&id).is_some() {
        return Err(ApiError::bad_request(format!(
            "Template '{id}' is built by the server operator and cannot be deleted through the API"
        )));
    }
    st.engine.delete_snapshot(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/fork` → 201 with one `SandboxForkResult` per fork.
async fn fork(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: ForkBody = parse_body(&body)?;
    let count = match b.count {
        None => 1,
        Some(c) if (1..=i64::from(bulkhead_engine::MAX_FORKS)).contains(&c) => c as u32,
        Some(c) => {
            return Err(ApiError::bad_request(format!(
                "count must be from 1 to {} (got {c})",
                bulkhead_engine::MAX_FORKS
            )));
        }
    };
    let results = st
        .engine
        .fork(&caller, &id, count, timeout_secs(b.timeout)?)
        .await?;
    let out: Vec<serde_json::Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(info) => serde_json::json!({ "sandbox": Sandbox::from(&info) }),
            Err(e) => {
                let e = ApiError::from(e);
                serde_json::json!({ "error": { "code": e.status.as_u16(), "message": e.message } })
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
