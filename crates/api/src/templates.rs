//! E2B's Template API (what `Template.build` and friends call in the 2.x SDKs): build requests,
//! file-context upload links and the upload itself, build status with logs, aliases, tags and
//! deletion. Handlers translate to `Engine`'s `template_builds` verbs only.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bulkhead_engine::template_builds::{
    BuildLogEntry, BuildRequest, BuildStart, MAX_UPLOAD_BYTES, RegistryCredentials,
};
use bulkhead_engine::template_spec::{BuildStep, StepKind};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::http::parse_body;
use crate::state::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// Where upload links point (outside the API-key layer: the SDK uploads without its key; the
/// link's one-time token authorises it).
const UPLOAD_PATH: &str = "/bulkhead/template-files";

/// Routes that need the API key.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(upload_link))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(build_status))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
}

/// The upload route (its own body limit, no API key).
pub fn upload_routes() -> Router<AppState> {
    Router::new()
        .route(&format!("{UPLOAD_PATH}/{{hash}}"), put(upload))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(
            MAX_UPLOAD_BYTES as usize + 1,
        ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewBuild {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
}

async fn request_build(State(st): State<AppState>, body: Bytes) -> ApiResult<Response> {
    let req: NewBuild = parse_body(&body)?;
    let name = req
        .name
        .or(req.alias)
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    let created = st
        .engine
        .request_template_build(BuildRequest {
            name,
            tags: req.tags,
            cpu_count: req.cpu_count,
            memory_mb: req.memory_mb,
        })
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": created.template_id,
            "buildID": created.build_id,
            "public": false,
            "names": [created.name],
            "aliases": [created.name],
            "tags": created.tags,
        })),
    )
        .into_response())
}

async fn upload_link(
    State(st): State<AppState>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let present = st.engine.template_file_present(&id, &hash)?;
    let mut body = json!({ "present": present });
    if !present {
        let token = st.engine.issue_upload_token(&hash);
        body["url"] = format!(
            "{}{UPLOAD_PATH}/{}?token={token}",
            base_url(&headers),
            hash.to_ascii_lowercase()
        )
        .into();
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `scheme://host` as the client reached us (a TLS proxy in front says so in
/// `X-Forwarded-Proto`).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get("x-forwarded-host")
        .or_else(|| headers.get(http::header::HOST))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or("http");
    format!("{proto}://{host}")
}

#[derive(Deserialize)]
struct UploadQuery {
    token: Option<String>,
}

async fn upload(
    State(st): State<AppState>,
    Path(hash): Path<String>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> ApiResult<Response> {
    let token = q.token.unwrap_or_default();
    if !st.engine.take_upload_token(&hash, &token) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid or expired upload link: ask for a new one with GET /templates/{id}/files/{hash}",
        ));
    }
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    st.engine.store_template_file(&hash, stream).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartBody {
    from_image: Option<String>,
    /// Credentials for this build's pull (never logged: no `Debug` on this body).
    from_image_registry: Option<RegistryBody>,
    from_template: Option<String>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(default)]
    steps: Vec<StepBody>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// E2B's `fromImageRegistry`: `{"type": "registry", username, password}`, `{"type": "gcp",
/// serviceAccountJson}` or `{"type": "aws", awsAccessKeyId, awsSecretAccessKey, awsRegion}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RegistryBody {
    #[serde(rename = "type")]
    kind: String,
    username: Option<String>,
    password: Option<String>,
    service_account_json: Option<String>,
}

impl RegistryBody {
    fn credentials(self) -> Result<RegistryCredentials, ApiError> {
        match self.kind.as_str() {
            "registry" => match (self.username, self.password) {
                (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => {
                    Ok(RegistryCredentials::basic(u, p))
                }
                _ => Err(ApiError::bad_request(
                    "fromImageRegistry of type registry needs a username and a password",
                )),
            },
            "gcp" => self
                .service_account_json
                .filter(|j| !j.is_empty())
                .map(RegistryCredentials::gcp_service_account)
                .ok_or_else(|| {
                    ApiError::bad_request("fromImageRegistry of type gcp needs serviceAccountJson")
                }),
            // ECR wants a signed token exchange with AWS's API, which this server does not do.
            "aws" => Err(ApiError::bad_request(
                "AWS ECR credentials (from_aws_registry) are not supported by this server: use \
                 from_image(image, username=\"AWS\", password=<the output of `aws ecr \
                 get-login-password --region REGION`>) instead",
            )),
            other => Err(ApiError::bad_request(format!(
                "fromImageRegistry: unknown type {other:?} (registry, gcp, aws)"
            ))),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    #[serde(default)]
    force: Option<bool>,
}

async fn start_build(
    State(st): State<AppState>,
    Path((id, build)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: StartBody = parse_body(&body)?;
    let registry_credentials = b
        .from_image_registry
        .map(RegistryBody::credentials)
        .transpose()?;
    let mut steps = Vec::with_capacity(b.steps.len());
    for (i, s) in b.steps.into_iter().enumerate() {
        let kind = StepKind::parse(&s.kind).ok_or_else(|| {
            ApiError::bad_request(format!(
                "step {}: unknown type {:?} (COPY, RUN, ENV, WORKDIR, USER)",
                i + 1,
                s.kind
            ))
        })?;
        steps.push(BuildStep {
            kind,
            args: s.args,
            files_hash: s.files_hash,
            force: s.force.unwrap_or(false),
        });
    }
    st.engine
        .start_template_build(
            &id,
            &build,
            BuildStart {
                from_image: b.from_image,
                registry_credentials,
                from_template: b.from_template,
                force: b.force.unwrap_or(false),
                steps,
                start_cmd: b.start_cmd,
                ready_cmd: b.ready_cmd,
            },
        )
        .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    logs_offset: Option<usize>,
    limit: Option<usize>,
}

fn entry_json(e: &BuildLogEntry) -> Value {
    let ts = chrono::DateTime::from_timestamp_millis(e.timestamp_ms).unwrap_or_default();
    let mut v = json!({
        "timestamp": crate::wire::rfc3339(&ts),
        "message": e.message,
        "level": e.level,
    });
    if let Some(s) = &e.step {
        v["step"] = s.clone().into();
    }
    v
}

async fn build_status(
    State(st): State<AppState>,
    Path((id, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> ApiResult<Json<Value>> {
    let r = st.engine.template_build_status(
        &id,
        &build,
        q.logs_offset.unwrap_or(0),
        q.limit.unwrap_or(100).clamp(1, 100),
    )?;
    let mut body = json!({
        "templateID": r.template_id,
        "buildID": r.build_id,
        "status": r.status.as_str(),
        "logs": r.entries.iter().map(|e| e.message.clone()).collect::<Vec<_>>(),
        "logEntries": r.entries.iter().map(entry_json).collect::<Vec<_>>(),
    });
    if let Some(f) = &r.failure {
        let mut reason = json!({
            "message": f.message,
            "logEntries": r.failure_entries.iter().map(entry_json).collect::<Vec<_>>(),
        });
        if let Some(s) = &f.step {
            reason["step"] = s.clone().into();
        }
        body["reason"] = reason;
    }
    Ok(Json(body))
}

async fn alias(State(st): State<AppState>, Path(alias): Path<String>) -> ApiResult<Json<Value>> {
    let id = st.engine.template_by_alias(&alias)?;
    Ok(Json(json!({ "templateID": id, "public": false })))
}

#[derive(Debug, Default, Deserialize)]
struct AssignBody {
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn assign_tags(State(st): State<AppState>, body: Bytes) -> ApiResult<Response> {
    let b: AssignBody = parse_body(&body)?;
    let (build, tags) = st.engine.assign_template_tags(&b.target, &b.tags).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "buildID": build, "tags": tags })),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize)]
struct RemoveBody {
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn remove_tags(State(st): State<AppState>, body: Bytes) -> ApiResult<StatusCode> {
    let b: RemoveBody = parse_body(&body)?;
    st.engine.remove_template_tags(&b.name, &b.tags).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_tags(State(st): State<AppState>, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let tags = st.engine.template_tags(&id)?;
    Ok(Json(Value::Array(
        tags.into_iter()
            .map(|(tag, build, at)| {
                let ts = chrono::DateTime::from_timestamp_millis(at).unwrap_or_default();
                json!({ "tag": tag, "buildID": build, "createdAt": crate::wire::rfc3339(&ts) })
            })
            .collect(),
    )))
}
