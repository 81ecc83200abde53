//! Control-plane handlers (E2B REST, both SDK generations).

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bulkhead_engine::{
    Caller, CreateGeneration, CreateRequest, ListRequest, ResumeRequest, SandboxState,
};
use bytes::Bytes;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::http::{next_token_headers, parse_body, parse_limit, query_pairs, timeout_secs};
use crate::state::AppState;
use crate::wire::{
    ConnectBody, EgressEvent, NetworkConfig, NewSandbox, NewSecret, RefreshBody, Sandbox,
    SandboxDetail, SandboxMetric, SandboxesWithMetrics, Secret, SecretUpdate, TemplateListed,
    TimeoutBody,
};

type ApiResult<T> = Result<T, ApiError>;

/// Request bodies are small JSON documents; anything bigger is a client bug or an attack.
const MAX_BODY: usize = 2 << 20;

/// The API key a request carries: `X-API-Key` (the SDKs), else `Authorization: Bearer <key>`
/// (what Prometheus and most HTTP tooling send). The listener's connection reserve reads
/// request heads with the same rule.
pub fn api_key_of<'a>(
    x_api_key: Option<&'a str>,
    authorization: Option<&'a str>,
) -> Option<&'a str> {
    x_api_key.or_else(|| authorization.and_then(|v| v.strip_prefix("Bearer ")))
}

/// The control plane: `authed` holds the routes of other modules that need the API key too;
/// `require_key` puts them behind the key check (and marks them so in the document).
pub fn routes(
    extra: OpenApiRouter<AppState>,
    require_key: impl Fn(OpenApiRouter<AppState>) -> OpenApiRouter<AppState>,
) -> OpenApiRouter<AppState> {
    let sandboxes = OpenApiRouter::new()
        .routes(routes!(create_v1, list_v1))
        .routes(routes!(create_v2, list_v2))
        .routes(routes!(metrics_batch))
        .routes(routes!(get_sandbox, kill))
        .routes(routes!(set_timeout))
        .routes(routes!(refresh))
        .routes(routes!(connect))
        .routes(routes!(connect_v2))
        .routes(routes!(metrics))
        .routes(routes!(update_network))
        .routes(routes!(network_events));
    let secrets = OpenApiRouter::new()
        .routes(routes!(list_secrets, create_secret))
        .routes(routes!(get_secret, update_secret, delete_secret));
    let authed = crate::docs::tagged(sandboxes, "sandboxes")
        .merge(crate::docs::tagged(secrets, "secrets"))
        .merge(crate::docs::tagged(
            OpenApiRouter::new().routes(routes!(list_templates)),
            "templates",
        ))
        .merge(extra)
        .merge(crate::persist::routes());
    crate::docs::tagged(OpenApiRouter::new().routes(routes!(health)), "server")
        .merge(require_key(authed))
        .fallback(not_found)
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY))
}

#[utoipa::path(get, path = "/health", responses((status = 204, description = "The server is up")))]
async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "No route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

pub(crate) async fn require_api_key(
    State(st): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let headers = req.headers();
    let key = api_key_of(
        headers.get("x-api-key").and_then(|v| v.to_str().ok()),
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .map(str::to_owned);
    let Some(key) = key else {
        return ApiError::unauthorized().into_response();
    };
    match st.engine.authenticate(&key).await {
        Ok(Some(caller)) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Ok(None) => ApiError::unauthorized().into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The `Idempotency-Key` header of a create, as text: the engine checks it (1 to 255 visible
/// ASCII characters), so bytes that are not text reach it as replacement characters and are
/// refused there with the same message. Two headers are refused here (a proxy may have joined
/// them into one value, which the engine would refuse as well).
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request(
            "Invalid Idempotency-Key header: send it once per request",
        ));
    }
    Ok(Some(String::from_utf8_lossy(value.as_bytes()).into_owned()))
}

/// The header that makes a create idempotent (see `Engine::create_idempotent`).
const IDEMPOTENCY_KEY: &str = "idempotency-key";

async fn create(
    st: &AppState,
    owner: &Caller,
    headers: &HeaderMap,
    body: &Bytes,
    v2: bool,
) -> ApiResult<Response> {
    let key = idempotency_key(headers)?;
    let req: NewSandbox = parse_body(body)?;
    if req.template_id.trim().is_empty() {
        return Err(ApiError::bad_request("templateID is required"));
    }
    let lifecycle = req.lifecycle()?;
    let network = req.network.map(NetworkConfig::into_engine).transpose()?;
    let req = CreateRequest {
        template: req.template_id,
        timeout: timeout_secs(req.timeout)?,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        secure: req.secure,
        generation: if v2 {
            CreateGeneration::V2
        } else {
            CreateGeneration::V1
        },
        allow_internet_access: req.allow_internet_access,
        network,
        volume_mounts: req
            .volume_mounts
            .unwrap_or_default()
            .into_iter()
            .map(|m| bulkhead_engine::MountRequest {
                name: m.name,
                path: m.path,
            })
            .collect(),
        lifecycle,
    };
    let info = match key {
        Some(key) => st.engine.create_idempotent(owner, req, &key).await?,
        None => st.engine.create(owner, req).await?,
    };
    Ok((StatusCode::CREATED, Json(Sandbox::from(&info))).into_response())
}

#[utoipa::path(post, path = "/sandboxes", params(("Idempotency-Key" = Option<String>, Header, description = "Makes the create idempotent: 1 to 255 visible ASCII characters, scoped to the caller's team and kept 24 h. A retry with the same key and body answers 201 with the same sandbox (waiting while the first attempt is still creating); the same key with another body is refused (422); after the sandbox ended, or while the first attempt still runs after 5 minutes, the answer is 409. A failed create frees the key.")), request_body = NewSandbox, responses((status = 201, description = "The sandbox is running", body = Sandbox)))]
async fn create_v1(
    State(st): State<AppState>,
    Extension(owner): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    create(&st, &owner, &headers, &body, false).await
}

#[utoipa::path(post, path = "/v2/sandboxes", params(("Idempotency-Key" = Option<String>, Header, description = "Makes the create idempotent: 1 to 255 visible ASCII characters, scoped to the caller's team and kept 24 h. A retry with the same key and body answers 201 with the same sandbox (waiting while the first attempt is still creating); the same key with another body is refused (422); after the sandbox ended, or while the first attempt still runs after 5 minutes, the answer is 409. A failed create frees the key.")), request_body = NewSandbox, responses((status = 201, description = "The sandbox is running", body = Sandbox)))]
async fn create_v2(
    State(st): State<AppState>,
    Extension(owner): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    create(&st, &owner, &headers, &body, true).await
}

#[utoipa::path(get, path = "/sandboxes/{id}", params(("id" = String, Path, description = "The sandbox ID")), responses((status = 200, description = "The sandbox", body = SandboxDetail)))]
async fn get_sandbox(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxDetail>> {
    let info = st.engine.get(&caller, &id).await?;
    let mut detail = SandboxDetail::new(&info, true);
    detail.volume_mounts = st
        .engine
        .volume_mounts_of(&info.id)
        .await?
        .into_iter()
        .map(|m| crate::wire::SandboxVolumeMount {
            name: m.name,
            path: m.path,
        })
        .collect();
    Ok(Json(detail))
}

#[utoipa::path(delete, path = "/sandboxes/{id}", params(("id" = String, Path, description = "The sandbox ID")), responses((status = 204, description = "Killed")))]
async fn kill(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    st.engine.kill(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/sandboxes/{id}/timeout", params(("id" = String, Path, description = "The sandbox ID")), request_body = TimeoutBody, responses((status = 204, description = "The sandbox now ends `timeout` seconds from now")))]
async fn set_timeout(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let b: TimeoutBody = parse_body(&body)?;
    let secs =
        timeout_secs(b.timeout)?.ok_or_else(|| ApiError::bad_request("timeout is required"))?;
    st.engine.set_timeout(&caller, &id, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/sandboxes/{id}/refreshes", params(("id" = String, Path, description = "The sandbox ID")), request_body = RefreshBody, responses((status = 204, description = "The timeout was extended")))]
async fn refresh(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let b: RefreshBody = parse_body(&body)?;
    st.engine
        .refresh(&caller, &id, timeout_secs(b.duration)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/sandboxes/{id}/connect", params(("id" = String, Path, description = "The sandbox ID")), request_body = ConnectBody, responses((status = 200, description = "The sandbox was running", body = Sandbox), (status = 201, description = "The sandbox was paused and has been resumed", body = Sandbox)))]
async fn connect(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: ConnectBody = parse_body(&body)?;
    let req = ResumeRequest {
        timeout: timeout_secs(b.timeout)?,
        memory: b.memory.unwrap_or(true),
    };
    let (info, resumed) = st.engine.connect(&caller, &id, req).await?;
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(Sandbox::from(&info))).into_response())
}

#[utoipa::path(post, path = "/v2/sandboxes/{id}/connect", params(("id" = String, Path, description = "The sandbox ID")), request_body = ConnectBody, responses((status = 200, description = "The sandbox was running", body = Sandbox), (status = 201, description = "The sandbox was paused and has been resumed", body = Sandbox)))]
async fn connect_v2(
    st: State<AppState>,
    caller: Extension<Caller>,
    id: Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    connect(st, caller, id, body).await
}

/// `GET /sandboxes/{id}/metrics?start=&end=` (Unix seconds, inclusive): the sandbox's series.
#[utoipa::path(get, path = "/sandboxes/{id}/metrics", params(("id" = String, Path, description = "The sandbox ID"),
    ("start" = Option<i64>, Query, description = "Unix seconds, inclusive"),
    ("end" = Option<i64>, Query, description = "Unix seconds, inclusive")),
    responses((status = 200, description = "The sandbox's resource series", body = Vec<SandboxMetric>)))]
async fn metrics(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<Vec<SandboxMetric>>> {
    let (mut start, mut end) = (None, None);
    for (k, v) in query_pairs(req.uri().query()) {
        let slot = match k.as_str() {
            "start" => &mut start,
            "end" => &mut end,
            _ => continue,
        };
        *slot = Some(v.trim().parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "{k} must be a Unix timestamp in seconds, got {v:?}"
            ))
        })?);
    }
    let series = st.engine.usage_series(&caller, &id, start, end).await?;
    Ok(Json(series.iter().map(SandboxMetric::from).collect()))
}

#[utoipa::path(get, path = "/sandboxes/metrics",
    params(("sandbox_ids" = Vec<String>, Query, description = "Sandbox IDs (repeated or comma-separated)")),
    responses((status = 200, description = "The latest metric of each sandbox", body = SandboxesWithMetrics)))]
async fn metrics_batch(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> ApiResult<Json<SandboxesWithMetrics>> {
    let pairs = query_pairs(req.uri().query());
    let ids: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "sandbox_ids")
        .flat_map(|(_, v)| v.split(',').filter(|s| !s.is_empty()))
        .collect();
    let sandboxes = st
        .engine
        .usage_many(&caller, &ids)
        .await
        .into_iter()
        .map(|(id, u)| (id, SandboxMetric::from(&u)))
        .collect();
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}

/// `PUT /sandboxes/{id}/network`: replaces the whole config (E2B `SandboxNetworkUpdateConfig`).
#[utoipa::path(put, path = "/sandboxes/{id}/network", params(("id" = String, Path, description = "The sandbox ID")), request_body = NetworkConfig, responses((status = 204, description = "The whole egress configuration was replaced")))]
async fn update_network(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let cfg: NetworkConfig = parse_body(&body)?;
    let allow = cfg.allow_internet_access;
    st.engine
        .update_network(&caller, &id, allow, cfg.into_engine()?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/network/events?limit=N` (Bulkhead): the newest N (default 100, at most
/// 10000) egress decisions, oldest first.
#[utoipa::path(get, path = "/sandboxes/{id}/network/events", params(("id" = String, Path, description = "The sandbox ID"),
    ("limit" = Option<u32>, Query, description = "How many of the newest decisions (1 to 10000, default 100)")),
    responses((status = 200, description = "Egress decisions, oldest first", body = Vec<EgressEvent>)))]
async fn network_events(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<Vec<EgressEvent>>> {
    let mut limit = 100;
    for (k, v) in query_pairs(req.uri().query()) {
        if k == "limit" {
            limit = parse_limit(&v, 10_000)?;
        }
    }
    let events = st.engine.network_events(&caller, &id, limit).await?;
    Ok(Json(events.iter().map(EgressEvent::from).collect()))
}

#[utoipa::path(get, path = "/secrets",
    params(("limit" = Option<u32>, Query, description = "Page size (1 to 100)"),
        ("nextToken" = Option<String>, Query, description = "The `x-next-token` of the previous page")),
    responses((status = 200, description = "Secrets (metadata only)", body = Vec<Secret>, headers(("x-next-token" = String, description = "The cursor for the next page (absent on the last page)")))))]
async fn list_secrets(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> ApiResult<Response> {
    let mut limit = None;
    let mut next = None;
    for (k, v) in query_pairs(req.uri().query()) {
        match k.as_str() {
            "limit" => limit = Some(parse_limit(&v, 100)?),
            "nextToken" => next = Some(v),
            _ => {}
        }
    }
    let page = st
        .engine
        .list_secrets(&caller, limit, next.as_deref())
        .await?;
    let items: Vec<Secret> = page.items.iter().map(Secret::from).collect();
    let headers = next_token_headers(page.next_token.as_deref());
    Ok((StatusCode::OK, headers, Json(items)).into_response())
}

#[utoipa::path(post, path = "/secrets", request_body = NewSecret, responses((status = 201, description = "Created", body = Secret)))]
async fn create_secret(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: NewSecret = parse_body(&body)?;
    let info = st
        .engine
        .create_secret(&caller, &b.name, &b.value, b.metadata.unwrap_or_default())
        .await?;
    Ok((StatusCode::CREATED, Json(Secret::from(&info))).into_response())
}

#[utoipa::path(get, path = "/secrets/{id}", params(("id" = String, Path, description = "The secret ID")), responses((status = 200, description = "The secret (without its value)", body = Secret)))]
async fn get_secret(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Secret>> {
    Ok(Json(Secret::from(
        &st.engine.get_secret(&caller, &id).await?,
    )))
}

#[utoipa::path(post, path = "/secrets/{id}", params(("id" = String, Path, description = "The secret ID")), request_body = SecretUpdate, responses((status = 200, description = "The new version", body = Secret)))]
async fn update_secret(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Secret>> {
    let b: SecretUpdate = parse_body(&body)?;
    let info = st
        .engine
        .update_secret(&caller, &id, &b.value, b.metadata)
        .await?;
    Ok(Json(Secret::from(&info)))
}

#[utoipa::path(delete, path = "/secrets/{id}", params(("id" = String, Path, description = "The secret ID")), responses((status = 204, description = "Deleted")))]
async fn delete_secret(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    st.engine.delete_secret(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes` (v1, deprecated): running sandboxes, optional `metadata` filter.
#[utoipa::path(get, path = "/sandboxes", params(("metadata" = Option<String>, Query, description = "URL-encoded `k=v&k2=v2` metadata filter"),
        ("templateID" = Option<String>, Query, description = "Only sandboxes of this template"),
        ("startedAfter" = Option<String>, Query, description = "RFC 3339 timestamp"),
        ("order" = Option<String>, Query, description = "`asc` or `desc` (default) by start time")),
    responses((status = 200, description = "Running sandboxes (at most 100)", body = Vec<SandboxDetail>)))]
async fn list_v1(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> ApiResult<Json<Vec<SandboxDetail>>> {
    let mut lr = list_request(req.uri().query())?;
    lr.states = vec![SandboxState::Running];
    lr.limit = Some(100);
    let all = st.engine.list_all(&caller, &lr).await?;
    Ok(Json(
        all.iter().map(|i| SandboxDetail::new(i, false)).collect(),
    ))
}

#[utoipa::path(get, path = "/v2/sandboxes", params(("metadata" = Option<String>, Query, description = "URL-encoded `k=v&k2=v2` metadata filter"),
        ("templateID" = Option<String>, Query, description = "Only sandboxes of this template"),
        ("startedAfter" = Option<String>, Query, description = "RFC 3339 timestamp"),
        ("order" = Option<String>, Query, description = "`asc` or `desc` (default) by start time"),
        ("state" = Option<String>, Query, description = "`running`, `paused` or both comma-separated"),
        ("limit" = Option<u32>, Query, description = "Page size (1 to 100)"),
        ("nextToken" = Option<String>, Query, description = "The `x-next-token` of the previous page")),
    responses((status = 200, description = "A page of sandboxes", body = Vec<SandboxDetail>,
        headers(("x-next-token" = String, description = "The cursor for the next page (absent on the last page)"),
            ("x-total-running" = u64, description = "How many of the caller's sandboxes run")))))]
async fn list_v2(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> ApiResult<Response> {
    let lr = list_request(req.uri().query())?;
    let page = st.engine.list(&caller, &lr).await?;
    let items: Vec<SandboxDetail> = page
        .items
        .iter()
        .map(|i| SandboxDetail::new(i, false))
        .collect();
    let mut headers = next_token_headers(page.next_token.as_deref());
    headers.insert("x-total-running", HeaderValue::from(page.total_running));
    Ok((StatusCode::OK, headers, Json(items)).into_response())
}

fn percent_decode(s: &str) -> String {
    urlencoding::decode(s)
        .map(|c| c.into_owned())
        .unwrap_or_else(|_| s.to_string())
}

fn list_request(query: Option<&str>) -> ApiResult<ListRequest> {
    let mut lr = ListRequest {
        order_desc: true,
        ..Default::default()
    };
    for (k, v) in query_pairs(query) {
        match k.as_str() {
            "metadata" | "query" => {
                // `metadata` is itself a URL-encoded `k=v&k2=v2` string whose keys and values the
                // SDKs percent-encode once more (`quote(k)=quote(v)`), so decode three layers.
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    lr.metadata.insert(percent_decode(&mk), percent_decode(&mv));
                }
            }
            "state" => {
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    // Clients filter on the two states E2B lists; the transient ones are ours.
                    let state = SandboxState::parse(s)
                        .filter(|s| matches!(s, SandboxState::Running | SandboxState::Paused))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "Invalid state {s:?}: use running or paused"
                            ))
                        })?;
                    lr.states.push(state);
                }
            }
            "template" | "templateID" => lr.template = Some(v),
            "startedAfter" => {
                let t = chrono::DateTime::parse_from_rfc3339(&v).map_err(|_| {
                    ApiError::bad_request("startedAfter must be an RFC 3339 timestamp")
                })?;
                lr.started_after = Some(t.with_timezone(&chrono::Utc));
            }
            "order" => match v.as_str() {
                "asc" => lr.order_desc = false,
                "desc" => lr.order_desc = true,
                _ => return Err(ApiError::bad_request("order must be asc or desc")),
            },
            "limit" => lr.limit = Some(parse_limit(&v, 100)?),
            "nextToken" => lr.next_token = Some(v),
            _ => {}
        }
    }
    Ok(lr)
}

#[utoipa::path(get, path = "/templates", responses((status = 200, description = "The templates sandboxes can be created from", body = Vec<TemplateListed>)))]
async fn list_templates(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Json<Vec<TemplateListed>> {
    // Built-ins and the caller's team's templates (another team's are not listed).
    Json(
        st.engine
            .templates_for(&caller)
            .iter()
            .map(|t| TemplateListed {
                template_id: t.id.clone(),
                build_id: t.content_hash.clone(),
                aliases: t.aliases.clone(),
                names: t.aliases.clone(),
                cpu_count: t.cpu_count,
                memory_mb: t.memory_mb,
                disk_size_mb: t.disk_size_mb,
                public: false,
                build_status: t.status().as_str().to_string(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_query_parses_sdk_shapes() {
        // Python sends state comma-joined and metadata as an encoded k=v&k2=v2 string.
        let q = "state=running%2Cpaused&metadata=user%3Dalice%26env%3Ddev&limit=5&order=asc";
        // What Python's SDK sends for {"odd key/ü": "a=b&c"}: quote(), urlencode(), then the query.
        let odd = list_request(Some(
            "metadata=odd%252520key%252F%2525C3%2525BC%3Da%25253Db%252526c",
        ))
        .unwrap();
        assert_eq!(
            odd.metadata.get("odd key/ü").map(String::as_str),
            Some("a=b&c")
        );
        let lr = list_request(Some(q)).unwrap();
        assert_eq!(lr.states, vec![SandboxState::Running, SandboxState::Paused]);
        assert_eq!(lr.metadata.get("user").map(String::as_str), Some("alice"));
        assert_eq!(lr.metadata.get("env").map(String::as_str), Some("dev"));
        assert_eq!(lr.limit, Some(5));
        assert!(!lr.order_desc);
        assert!(list_request(Some("limit=0")).is_err());
        assert!(list_request(Some("state=dead")).is_err());
        assert!(list_request(Some("startedAfter=yesterday")).is_err());
    }
}
