//! Persistence routes (E2B REST): pause, resume, snapshots, fork. Each handler only translates
//! between E2B's shapes (`e2b/api/client/models`: `SandboxPauseRequest`, `ResumedSandbox`,
//! `SandboxSnapshotRequest`, `SnapshotInfo`, `SandboxForkRequest`, `SandboxForkResult`) and
//! the engine; `connect` (resume-or-extend) is in `control.rs` with the other sandbox verbs.

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bulkhead_engine::{Caller, ResumeRequest};
use bytes::Bytes;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::http::{next_token_headers, parse_body, parse_limit, query_pairs, timeout_secs};
use crate::state::AppState;
use crate::wire::{
    ForkBody, ForkResult, PauseBody, ResumeBody, Sandbox, SnapshotBody, SnapshotInfo,
};

type ApiResult<T> = Result<T, ApiError>;

/// The routes, to be put behind the API-key check.
pub fn routes() -> OpenApiRouter<AppState> {
    let sandboxes = OpenApiRouter::new()
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(create_snapshot))
        .routes(routes!(fork));
    crate::docs::tagged(sandboxes, "sandboxes")
        .merge(crate::docs::tagged(
            OpenApiRouter::new().routes(routes!(list_snapshots)),
            "snapshots",
        ))
        .merge(crate::docs::tagged(
            OpenApiRouter::new().routes(routes!(delete_template)),
            "templates",
        ))
}

/// `POST /sandboxes/{id}/pause` → 204; 409 when already paused (the SDK then returns false).
#[utoipa::path(post, path = "/sandboxes/{id}/pause", params(("id" = String, Path, description = "The sandbox ID")), request_body = PauseBody, responses((status = 204, description = "Paused (checkpointed)")))]
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
#[utoipa::path(post, path = "/sandboxes/{id}/resume", params(("id" = String, Path, description = "The sandbox ID")), request_body = ResumeBody, responses((status = 201, description = "Resumed", body = Sandbox)))]
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
#[utoipa::path(post, path = "/sandboxes/{id}/snapshots", params(("id" = String, Path, description = "The sandbox ID")), request_body = SnapshotBody, responses((status = 201, description = "The snapshot; new sandboxes can be created from its ID", body = SnapshotInfo)))]
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
#[utoipa::path(get, path = "/snapshots",
    params(("sandboxID" = Option<String>, Query, description = "Only snapshots of this sandbox"),
        ("name" = Option<String>, Query, description = "Only snapshots with this name"),
        ("limit" = Option<u32>, Query, description = "Page size (1 to 100)"),
        ("nextToken" = Option<String>, Query, description = "The `x-next-token` of the previous page")),
    responses((status = 200, description = "A page of snapshots", body = Vec<SnapshotInfo>,
        headers(("x-next-token" = String, description = "The cursor for the next page (absent on the last page)")))))]
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

/// `DELETE /templates/{id}`: a snapshot is a template; the caller's team's built templates
/// are deleted too (built-in ones are the operator's; another team's are not found).
#[utoipa::path(delete, path = "/templates/{id}", params(("id" = String, Path, description = "A template built through the API, or a snapshot ID or name")), responses((status = 204, description = "Deleted")))]
async fn delete_template(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = urlencoding::decode(&id)
        .map(|c| c.into_owned())
        .unwrap_or(id);
    // E2B deletes snapshots and built templates through this one route.
    if st.engine.is_custom_template(&caller, &id) {
        st.engine.delete_template(&caller, &id).await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if st.engine.public_template(&id).is_some() {
        return Err(ApiError::bad_request(format!(
            "Template '{id}' is built by the server operator and cannot be deleted through the API"
        )));
    }
    st.engine.delete_snapshot(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/fork` → 201 with one `SandboxForkResult` per fork.
#[utoipa::path(post, path = "/sandboxes/{id}/fork", params(("id" = String, Path, description = "The sandbox ID")), request_body = ForkBody, responses((status = 201, description = "One result per fork, in order: a sandbox or an error", body = Vec<ForkResult>)))]
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
    let out: Vec<ForkResult> = results
        .into_iter()
        .map(|r| match r {
            Ok(info) => ForkResult {
                sandbox: Some(Sandbox::from(&info)),
                error: None,
            },
            Err(e) => {
                let e = ApiError::from(e);
                ForkResult {
                    sandbox: None,
                    error: Some(crate::wire::ForkError {
                        code: e.status.as_u16(),
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
