//! Bulkhead's own read-only views into a running sandbox, for the web console and any other
//! API-key client (docs/console.md):
//!
//! - `GET /bulkhead/v1/sandboxes/{id}/processes`: the processes its agent started (pid, tag,
//!   command line, cwd; never their environment, which holds secrets).
//! - `GET /bulkhead/v1/sandboxes/{id}/files?path=`: one directory level.
//! - `GET /bulkhead/v1/sandboxes/{id}/files/content?path=`: a file's bytes, as an attachment.
//!
//! Everything goes to the sandbox's own agent over the engine's agent stream, exactly as the
//! SDK's calls do (envd's `process.Process/List`, `filesystem.Filesystem/ListDir` and
//! `GET /files`, as the sandbox's default user, with its access token), so the agent's path
//! rules (relative paths from the user's home, symlinks, permissions) apply unchanged and the
//! host never reads the sandbox's tree. A paused sandbox is not resumed for a look.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bulkhead_engine::agent_client;
use bulkhead_engine::{Caller, SandboxInfo, SandboxState};
use bulkhead_envd::filesystem::{self, EntryInfo, FileType, ListDirRequest, ListDirResponse};
use bulkhead_envd::process::{self, ListResponse};
use bulkhead_envd::rest::{ENVD_PORT, HEADER_ACCESS_TOKEN, HEADER_SANDBOX_ID, HEADER_SANDBOX_PORT};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::http::query_pairs;
use crate::state::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// A listing is one small unary call; an agent that takes longer is stuck.
const LIST_LIMIT: Duration = Duration::from_secs(30);
/// Directories with more entries are cut (the answer says so): a browser page, not `find`.
const MAX_ENTRIES: usize = 5000;

pub fn routes() -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(processes))
        .routes(routes!(list_files))
        .routes(routes!(download));
    crate::docs::tagged(r, "bulkhead")
}

/// One process the agent runs (from envd's `ProcessInfo`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessView {
    pub pid: u32,
    pub tag: Option<String>,
    pub cmd: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
}

/// One directory entry (from envd's `EntryInfo`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EntryView {
    pub name: String,
    pub path: String,
    /// `file`, `dir` or `other`; for a symlink, its target's type.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub size: i64,
    pub permissions: String,
    pub modified_time: Option<String>,
    pub symlink_target: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub path: String,
    pub entries: Vec<EntryView>,
    /// True when the directory had more than the entries listed.
    pub truncated: bool,
}

impl From<EntryInfo> for EntryView {
    fn from(e: EntryInfo) -> Self {
        let kind = match e.r#type() {
            FileType::File => "file",
            FileType::Directory => "dir",
            _ => "other",
        };
        EntryView {
            kind,
            modified_time: e
                .modified_time
                .and_then(|t| t.to_datetime())
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            symlink_target: e.symlink_target.filter(|_| e.is_symlink),
            name: e.name,
            path: e.path,
            size: e.size,
            permissions: e.permissions,
        }
    }
}

/// The running sandbox `id` of the caller's team (a paused one is refused, not resumed).
async fn running(st: &AppState, caller: &Caller, id: &str) -> ApiResult<SandboxInfo> {
    let info = st.engine.get(caller, id).await?;
    if info.state != SandboxState::Running.as_str() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "Sandbox {} is {}: its processes and files can be seen while it runs; resume it with connect first",
                info.id, info.state
            ),
        ));
    }
    Ok(info)
}

/// Sends `req` to envd in the sandbox and returns its answer as it starts (the body streams).
async fn to_agent(
    st: &AppState,
    info: &SandboxInfo,
    mut req: http::Request<Full<Bytes>>,
) -> ApiResult<http::Response<hyper::body::Incoming>> {
    let h = req.headers_mut();
    h.insert(HEADER_SANDBOX_PORT, HeaderValue::from(ENVD_PORT));
    if let Ok(v) = HeaderValue::from_str(&info.id) {
        h.insert(HEADER_SANDBOX_ID, v);
    }
    if let Some(v) = info
        .envd_access_token
        .as_deref()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        h.insert(HEADER_ACCESS_TOKEN, v);
    }
    let stream = st.engine.agent_stream(&info.id).await?;
    let resp = tokio::time::timeout(LIST_LIMIT, agent_client::send(stream, req))
        .await
        .map_err(|_| agent_unavailable(&info.id, "did not answer within 30 s"))?
        .map_err(|e| agent_unavailable(&info.id, &e.to_string()))?;
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Err(agent_refusal(&info.id, status, &body))
}

fn agent_unavailable(id: &str, why: &str) -> ApiError {
    tracing::warn!(sandbox = %id, error = %why, "console: the sandbox's agent failed");
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        format!("The agent of sandbox {id} {why}; try again, or kill and recreate the sandbox"),
    )
}

/// The agent's own answer (a missing file, a directory where a file was asked for, ...) with
/// its status; its server errors become a 502.
fn agent_refusal(id: &str, status: http::StatusCode, body: &[u8]) -> ApiError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    if status.is_client_error() {
        ApiError::new(status, message)
    } else {
        agent_unavailable(id, &format!("answered {}: {message}", status.as_u16()))
    }
}

/// envd's unary Connect calls with the JSON codec.
fn connect_call(path: String, body: Vec<u8>) -> ApiResult<http::Request<Full<Bytes>>> {
    http::Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header("connect-protocol-version", "1")
        .header("connect-timeout-ms", LIST_LIMIT.as_millis().to_string())
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| ApiError::bad_request(format!("Invalid request: {e}")))
}

async fn read_json<T: serde::de::DeserializeOwned>(
    id: &str,
    resp: http::Response<hyper::body::Incoming>,
) -> ApiResult<T> {
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| agent_unavailable(id, &format!("broke off its answer: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| agent_unavailable(id, &format!("sent an unreadable answer: {e}")))
}

/// The one `path` query parameter these routes take (required for downloads).
fn path_param(req: &Request) -> ApiResult<Option<String>> {
    let mut path = None;
    for (k, v) in query_pairs(req.uri().query()) {
        match k.as_str() {
            "path" if path.is_none() => path = Some(v),
            "path" => return Err(ApiError::bad_request("Send path once")),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "Unknown query parameter {k:?}: only path is accepted"
                )));
            }
        }
    }
    Ok(path)
}

#[utoipa::path(get, path = "/bulkhead/v1/sandboxes/{id}/processes", params(("id" = String, Path, description = "The sandbox ID")), responses((status = 200, description = "The processes the agent started", body = Vec<ProcessView>)))]
async fn processes(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<ProcessView>>> {
    let info = running(&st, &caller, &id).await?;
    let req = connect_call(process::path(process::method::LIST), b"{}".to_vec())?;
    let list: ListResponse = read_json(&info.id, to_agent(&st, &info, req).await?).await?;
    let mut out: Vec<ProcessView> = list
        .processes
        .into_iter()
        .map(|p| {
            let cfg = p.config.unwrap_or_default();
            ProcessView {
                pid: p.pid,
                tag: p.tag,
                cmd: cfg.cmd,
                args: cfg.args,
                cwd: cfg.cwd,
            }
        })
        .collect();
    out.sort_by_key(|p| p.pid);
    Ok(Json(out))
}

#[utoipa::path(get, path = "/bulkhead/v1/sandboxes/{id}/files", params(("id" = String, Path, description = "The sandbox ID"), ("path" = Option<String>, Query, description = "A path in the sandbox (default: the user's home)")), responses((status = 200, description = "A directory listing", body = Listing)))]
async fn list_files(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<Listing>> {
    // No path: the default user's home (envd resolves relative paths from it).
    let path = path_param(&req)?.unwrap_or_else(|| ".".to_string());
    let info = running(&st, &caller, &id).await?;
    let body = serde_json::to_vec(&ListDirRequest {
        path: path.clone(),
        depth: 1,
    })
    .map_err(|e| ApiError::bad_request(format!("Invalid path: {e}")))?;
    let req = connect_call(filesystem::path(filesystem::method::LIST_DIR), body)?;
    let list: ListDirResponse = read_json(&info.id, to_agent(&st, &info, req).await?).await?;
    let truncated = list.entries.len() > MAX_ENTRIES;
    // The directory as the agent resolved it (absolute), from its entries' paths.
    let path = list
        .entries
        .first()
        .and_then(|e| e.path.rsplit_once('/'))
        .map(|(dir, _)| if dir.is_empty() { "/" } else { dir }.to_string())
        .unwrap_or(path);
    let mut entries: Vec<EntryView> = list
        .entries
        .into_iter()
        .take(MAX_ENTRIES)
        .map(EntryView::from)
        .collect();
    // Directories first, then by name: what a file browser shows.
    entries.sort_by(|a, b| (a.kind != "dir", &a.name).cmp(&(b.kind != "dir", &b.name)));
    Ok(Json(Listing {
        path,
        entries,
        truncated,
    }))
}

/// Streams the file from the agent's `GET /files` (the SDK's download) as an attachment.
#[utoipa::path(get, path = "/bulkhead/v1/sandboxes/{id}/files/content", params(("id" = String, Path, description = "The sandbox ID"), ("path" = String, Query, description = "The file to download")), responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = crate::docs::Binary)))]
async fn download(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Response> {
    let path = path_param(&req)?
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("path is required: the file to download"))?;
    let info = running(&st, &caller, &id).await?;
    let uri = format!("/files?path={}", urlencoding::encode(&path));
    let agent_req = http::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| ApiError::bad_request(format!("Invalid path: {e}")))?;
    let resp = to_agent(&st, &info, agent_req).await?;
    let len = resp.headers().get(header::CONTENT_LENGTH).cloned();
    let name = path.rsplit('/').next().unwrap_or("download");
    let mut out = Body::new(resp.into_body()).into_response();
    let h = out.headers_mut();
    // Always bytes to save, never a document the browser would render in our origin.
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&content_disposition(name))
            .unwrap_or(HeaderValue::from_static("attachment")),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if let Some(len) = len {
        h.insert(header::CONTENT_LENGTH, len);
    }
    Ok(out)
}

/// `attachment` with the file's name: an ASCII fallback (quotes, backslashes and controls
/// replaced) and the exact name as RFC 5987 `filename*`.
fn content_disposition(name: &str) -> String {
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{ascii}\"; filename*=UTF-8''{}",
        urlencoding::encode(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_cannot_break_out_of_the_header() {
        let d = content_disposition("a\"b\\c\r\nSet-Cookie: x=1;<img>.txt");
        assert!(HeaderValue::from_str(&d).is_ok(), "{d}");
        assert!(d.starts_with("attachment; filename=\"a_b_c__Set-Cookie: x=1;<img>.txt\""));
        assert!(
            d.contains("filename*=UTF-8''a%22b%5Cc%0D%0ASet-Cookie%3A%20x%3D1%3B%3Cimg%3E.txt")
        );
        assert_eq!(
            content_disposition("ü.bin"),
            "attachment; filename=\"_.bin\"; filename*=UTF-8''%C3%BC.bin"
        );
    }

    #[test]
    fn entries_keep_symlink_targets_only_for_symlinks() {
        let e = EntryInfo {
            name: "l".into(),
            r#type: FileType::Directory as i32,
            symlink_target: Some("/x".into()),
            is_symlink: true,
            ..Default::default()
        };
        let v = EntryView::from(e);
        assert_eq!((v.kind, v.symlink_target.as_deref()), ("dir", Some("/x")));
        let f = EntryView::from(EntryInfo {
            r#type: FileType::File as i32,
            symlink_target: Some("/y".into()),
            ..Default::default()
        });
        assert_eq!((f.kind, f.symlink_target), ("file", None));
    }
}
