//! E2B's Template API (what `Template.build` and friends call in the 2.x SDKs): build requests,
//! file-context upload links and the upload itself, build status with logs, aliases, tags and
//! deletion. Handlers translate to `Engine`'s `template_builds` verbs only, with the
//! caller: templates, builds and uploads are the caller's team's.

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bulkhead_engine::Caller;
use bulkhead_engine::template_builds::{
    BuildRequest, BuildStart, MAX_UPLOAD_BYTES, RegistryCredentials,
};
use bulkhead_engine::template_spec::{BuildStep, StepKind};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::http::parse_body;
use crate::state::AppState;
use crate::template_wire::{
    AssignedTemplateTags, BuildLogEntry, BuildStatusReason, TemplateAliasResponse,
    TemplateBuildFileUpload, TemplateBuildInfo, TemplateRequestResponseV3, TemplateTag,
};

type ApiResult<T> = Result<T, ApiError>;

/// Where upload links point (outside the API-key layer: the SDK uploads without its key; the
/// link's one-time token authorises it).
const UPLOAD_PATH: &str = "/bulkhead/template-files";

/// Routes that need the API key.
pub fn routes() -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(request_build))
        .routes(routes!(upload_link))
        .routes(routes!(start_build))
        .routes(routes!(build_status))
        .routes(routes!(alias))
        .routes(routes!(assign_tags, remove_tags))
        .routes(routes!(list_tags));
    crate::docs::tagged(r, "templates")
}

/// The upload route (its own body limit, no API key: the link's one-time token authorises it).
pub fn upload_routes() -> OpenApiRouter<AppState> {
    crate::docs::tagged(OpenApiRouter::new().routes(routes!(upload)), "templates").layer(
        tower_http::limit::RequestBodyLimitLayer::new(MAX_UPLOAD_BYTES as usize + 1),
    )
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = TemplateBuildRequestV3)]
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

#[utoipa::path(post, path = "/v3/templates", request_body = NewBuild, responses((status = 202, description = "The template and build IDs to upload files and start the build with", body = TemplateRequestResponseV3)))]
async fn request_build(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: NewBuild = parse_body(&body)?;
    let name = req
        .name
        .or(req.alias)
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    let created = st
        .engine
        .request_template_build(
            &caller,
            BuildRequest {
                name,
                tags: req.tags,
                cpu_count: req.cpu_count,
                memory_mb: req.memory_mb,
            },
        )
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(TemplateRequestResponseV3 {
            template_id: created.template_id,
            build_id: created.build_id,
            public: false,
            names: vec![created.name.clone()],
            aliases: vec![created.name],
            tags: created.tags,
        }),
    )
        .into_response())
}

#[utoipa::path(get, path = "/templates/{id}/files/{hash}", params(("id" = String, Path, description = "The template ID"), ("hash" = String, Path, description = "SHA-256 of the files archive")),
    responses((status = 201, description = "Whether the archive is already present, else a one-time upload link", body = TemplateBuildFileUpload)))]
async fn upload_link(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let present = st.engine.template_file_present(&caller, &id, &hash)?;
    let mut body = TemplateBuildFileUpload { present, url: None };
    if !present {
        let token = st.engine.issue_upload_token(&caller, &hash);
        body.url = Some(format!(
            "{}{UPLOAD_PATH}/{}?token={token}",
            base_url(&headers),
            hash.to_ascii_lowercase()
        ));
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

#[utoipa::path(put, path = "/bulkhead/template-files/{hash}",
    params(("hash" = String, Path, description = "SHA-256 of the archive"), ("token" = String, Query, description = "The one-time token of the link")),
    request_body(content = crate::docs::Binary, content_type = "application/octet-stream", description = "The gzipped tar archive of a COPY step's files"),
    responses((status = 200, description = "Stored")))]
async fn upload(
    State(st): State<AppState>,
    Path(hash): Path<String>,
    Query(q): Query<UploadQuery>,
    body: Body,
) -> ApiResult<Response> {
    let token = q.token.unwrap_or_default();
    // The link's team: the archive goes into that team's files only.
    let Some(team) = st.engine.take_upload_token(&hash, &token) else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid or expired upload link: ask for a new one with GET /templates/{id}/files/{hash}",
        ));
    };
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    st.engine.store_template_file(&team, &hash, stream).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Default, Deserialize, ToSchema)]
#[schema(as = TemplateBuildStartV2)]
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
#[derive(Deserialize, ToSchema)]
#[schema(as = FromImageRegistry)]
#[serde(rename_all = "camelCase")]
struct RegistryBody {
    /// `registry`, `gcp` or `aws`.
    #[serde(rename = "type")]
    #[schema(example = "registry")]
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

#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = TemplateStep)]
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

#[utoipa::path(post, path = "/v2/templates/{id}/builds/{build}", params(("id" = String, Path, description = "The template ID"), ("build" = String, Path, description = "The build ID")), request_body = StartBody, responses((status = 202, description = "The build started")))]
async fn start_build(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
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
            &caller,
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

fn entry_json(e: &bulkhead_engine::template_builds::BuildLogEntry) -> BuildLogEntry {
    let ts = chrono::DateTime::from_timestamp_millis(e.timestamp_ms).unwrap_or_default();
    BuildLogEntry {
        timestamp: crate::wire::rfc3339(&ts),
        message: e.message.clone(),
        level: e.level.to_string(),
        step: e.step.clone(),
    }
}

#[utoipa::path(get, path = "/templates/{id}/builds/{build}/status", params(("id" = String, Path, description = "The template ID"), ("build" = String, Path, description = "The build ID"),
    ("logsOffset" = Option<u32>, Query, description = "Skip this many log entries"), ("limit" = Option<u32>, Query, description = "At most this many log entries (1 to 100, default 100)")),
    responses((status = 200, description = "The build's status and logs", body = TemplateBuildInfo)))]
async fn build_status(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> ApiResult<Json<TemplateBuildInfo>> {
    let r = st.engine.template_build_status(
        &caller,
        &id,
        &build,
        q.logs_offset.unwrap_or(0),
        q.limit.unwrap_or(100).clamp(1, 100),
    )?;
    Ok(Json(TemplateBuildInfo {
        template_id: r.template_id.clone(),
        build_id: r.build_id.clone(),
        status: r.status.as_str().to_string(),
        logs: r.entries.iter().map(|e| e.message.clone()).collect(),
        log_entries: r.entries.iter().map(entry_json).collect(),
        reason: r.failure.as_ref().map(|f| BuildStatusReason {
            message: f.message.clone(),
            step: f.step.clone(),
            log_entries: r.failure_entries.iter().map(entry_json).collect(),
        }),
    }))
}

#[utoipa::path(get, path = "/templates/aliases/{alias}", params(("alias" = String, Path, description = "A template name")), responses((status = 200, description = "The template with that name", body = TemplateAliasResponse)))]
async fn alias(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(alias): Path<String>,
) -> ApiResult<Json<TemplateAliasResponse>> {
    let template_id = st.engine.template_by_alias(&caller, &alias)?;
    Ok(Json(TemplateAliasResponse {
        template_id,
        public: false,
    }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = AssignTemplateTagsRequest)]
struct AssignBody {
    target: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[utoipa::path(post, path = "/templates/tags", request_body = AssignBody, responses((status = 201, description = "The tags now point at the target build", body = AssignedTemplateTags)))]
async fn assign_tags(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: AssignBody = parse_body(&body)?;
    let (build, tags) = st
        .engine
        .assign_template_tags(&caller, &b.target, &b.tags)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(AssignedTemplateTags {
            build_id: build,
            tags,
        }),
    )
        .into_response())
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[schema(as = DeleteTemplateTagsRequest)]
struct RemoveBody {
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[utoipa::path(delete, path = "/templates/tags", request_body = RemoveBody, responses((status = 204, description = "Removed")))]
async fn remove_tags(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let b: RemoveBody = parse_body(&body)?;
    st.engine
        .remove_template_tags(&caller, &b.name, &b.tags)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/templates/{id}/tags", params(("id" = String, Path, description = "The template ID")), responses((status = 200, description = "The template's tags", body = Vec<TemplateTag>)))]
async fn list_tags(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<TemplateTag>>> {
    let tags = st.engine.template_tags(&caller, &id)?;
    Ok(Json(
        tags.into_iter()
            .map(|(tag, build_id, at)| {
                let ts = chrono::DateTime::from_timestamp_millis(at).unwrap_or_default();
                TemplateTag {
                    tag,
                    build_id,
                    created_at: crate::wire::rfc3339(&ts),
                }
            })
            .collect(),
    ))
}
