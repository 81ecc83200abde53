//! E2B's Volume API: `POST/GET /volumes`, `GET/DELETE /volumes/{id}` (X-API-Key), and the
//! volume content API the SDKs' volume client calls (`/volumecontent/{id}/{path,dir,file}`),
//! served on the same listener so `E2B_VOLUME_API_URL` can point at Bulkhead. Content requests
//! carry the volume's token (`Authorization: Bearer`, what the SDKs send) or an `X-API-Key` of
//! the volume's team. Shapes: the SDKs' generated clients (`e2b/api/client/models/volume*.py`,
//! `e2b/volume/client/api/volumes/*.py`).

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bulkhead_engine::volume_fs::{Attrs, EntryStat};
use bulkhead_engine::{Caller, ContentAuth, VolumeAccess, VolumeInfo};
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::error::ApiError;
use crate::state::AppState;

type ApiResult<T> = Result<T, ApiError>;

/// E2B `Volume` (list entries).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// E2B `VolumeAndToken` (create, get).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
}

impl From<&VolumeInfo> for VolumeAndToken {
    fn from(v: &VolumeInfo) -> Self {
        Self {
            volume_id: v.id.clone(),
            name: v.name.clone(),
            token: v.token.clone(),
        }
    }
}

/// E2B `NewVolume`.
#[derive(Debug, Deserialize, Default, ToSchema)]
struct NewVolume {
    #[serde(default)]
    name: String,
}

/// E2B `PatchVolumecontentVolumeIDPathBody`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = PatchVolumecontentVolumeIDPathBody)]
struct PatchBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// Routes that need an API key (mounted under the control plane's key check).
pub fn rest_routes() -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_one, delete));
    crate::docs::tagged(r, "volumes")
}

/// The content API; its handlers authenticate themselves (volume token or API key), and file
/// bodies are not bound by the control plane's JSON body limit (the volume's size limit is).
pub fn content_routes() -> OpenApiRouter<AppState> {
    let r = OpenApiRouter::new()
        .routes(routes!(stat_path, remove_path, patch_path))
        .routes(routes!(list_dir, make_dir))
        .routes(routes!(read_file, write_file));
    crate::docs::with_security(crate::docs::tagged(r, "volume content"), "VolumeToken")
}

#[utoipa::path(post, path = "/volumes", request_body = NewVolume, responses((status = 201, description = "Created", body = VolumeAndToken)))]
async fn create(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> ApiResult<Response> {
    let b: NewVolume = crate::http::parse_body(&body)?;
    let v = st.engine.create_volume(&caller, &b.name).await?;
    Ok((StatusCode::CREATED, Json(VolumeAndToken::from(&v))).into_response())
}

#[utoipa::path(get, path = "/volumes", responses((status = 200, description = "The team's volumes", body = Vec<Volume>)))]
async fn list(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<Volume>>> {
    let vs = st.engine.list_volumes(&caller).await?;
    Ok(Json(
        vs.iter()
            .map(|v| Volume {
                volume_id: v.id.clone(),
                name: v.name.clone(),
            })
            .collect(),
    ))
}

#[utoipa::path(get, path = "/volumes/{id}", params(("id" = String, Path, description = "The volume ID")), responses((status = 200, description = "The volume and its content token", body = VolumeAndToken)))]
async fn get_one(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<VolumeAndToken>> {
    let v = st.engine.get_volume(&caller, &id).await?;
    Ok(Json(VolumeAndToken::from(&v)))
}

#[utoipa::path(delete, path = "/volumes/{id}", params(("id" = String, Path, description = "The volume ID")), responses((status = 204, description = "Deleted")))]
async fn delete(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    st.engine.delete_volume(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of a content request.
#[derive(Debug, Default)]
struct ContentQuery {
    path: Option<String>,
    depth: Option<u32>,
    attrs: Attrs,
    force: bool,
}

fn number<T: std::str::FromStr>(k: &str, v: &str) -> ApiResult<T> {
    v.parse()
        .map_err(|_| ApiError::bad_request(format!("{k} must be a non-negative integer")))
}

fn content_query(q: Option<&str>) -> ApiResult<ContentQuery> {
    let mut out = ContentQuery::default();
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "path" => out.path = Some(v.into_owned()),
            "depth" => out.depth = Some(number(&k, &v)?),
            "uid" => out.attrs.uid = Some(number(&k, &v)?),
            "gid" => out.attrs.gid = Some(number(&k, &v)?),
            "mode" => out.attrs.mode = Some(number(&k, &v)?),
            "force" => {
                out.force = match v.as_ref() {
                    "true" | "True" | "1" => true,
                    "false" | "False" | "0" => false,
                    _ => return Err(ApiError::bad_request("force must be true or false")),
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

impl ContentQuery {
    fn path(&self) -> ApiResult<&str> {
        self.path
            .as_deref()
            .ok_or_else(|| ApiError::bad_request("The path query parameter is required"))
    }
}

/// The volume a content request may use (token or API key), else 401.
async fn authorize(st: &AppState, id: &str, headers: &HeaderMap) -> ApiResult<VolumeAccess> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let auth = match (bearer, key) {
        (Some(t), _) => ContentAuth::Token(t.trim()),
        (None, Some(k)) => ContentAuth::ApiKey(k),
        (None, None) => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "Missing volume token: send `Authorization: Bearer <token>` with the token from Volume.create or Volume.connect",
            ));
        }
    };
    Ok(st.engine.volume_for_content(id, auth).await?)
}

#[utoipa::path(get, path = "/volumecontent/{id}/path", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume")), responses((status = 200, description = "The entry", body = EntryStat)))]
async fn stat_path(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<EntryStat>> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    Ok(Json(st.engine.volume_stat(&vol, q.path()?).await?))
}

#[utoipa::path(delete, path = "/volumecontent/{id}/path", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume")), responses((status = 204, description = "Removed")))]
async fn remove_path(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<StatusCode> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    st.engine.volume_remove(&vol, q.path()?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(patch, path = "/volumecontent/{id}/path", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume")), request_body = PatchBody, responses((status = 200, description = "The entry after the change", body = EntryStat)))]
async fn patch_path(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<EntryStat>> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    let body = axum::body::to_bytes(req.into_body(), 64 << 10)
        .await
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "Body over 64 KiB"))?;
    let b: PatchBody = crate::http::parse_body(&body)?;
    let attrs = Attrs {
        uid: b.uid,
        gid: b.gid,
        mode: b.mode,
    };
    Ok(Json(
        st.engine.volume_set_attrs(&vol, q.path()?, attrs).await?,
    ))
}

#[utoipa::path(get, path = "/volumecontent/{id}/dir", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume"), ("depth" = Option<u32>, Query, description = "How deep to list (default 1)")), responses((status = 200, description = "The entries", body = Vec<EntryStat>)))]
async fn list_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Json<Vec<EntryStat>>> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    let depth = q.depth.unwrap_or(1);
    Ok(Json(st.engine.volume_list(&vol, q.path()?, depth).await?))
}

#[utoipa::path(post, path = "/volumecontent/{id}/dir", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume"), ("uid" = Option<u32>, Query), ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query, description = "Permission bits (decimal)"), ("force" = Option<bool>, Query, description = "Create missing parents / overwrite")), responses((status = 201, description = "The new directory", body = EntryStat)))]
async fn make_dir(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Response> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    let e = st
        .engine
        .volume_make_dir(&vol, q.path()?, q.attrs, q.force)
        .await?;
    Ok((StatusCode::CREATED, Json(e)).into_response())
}

#[utoipa::path(get, path = "/volumecontent/{id}/file", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume")), responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = crate::docs::Binary)))]
async fn read_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Response> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    let (file, len) = st.engine.volume_open_read(&vol, q.path()?).await?;
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        body,
    )
        .into_response())
}

#[utoipa::path(put, path = "/volumecontent/{id}/file", params(("id" = String, Path, description = "The volume ID"), ("path" = String, Query, description = "The path inside the volume"), ("uid" = Option<u32>, Query), ("gid" = Option<u32>, Query), ("mode" = Option<u32>, Query, description = "Permission bits (decimal)"), ("force" = Option<bool>, Query, description = "Create missing parents / overwrite")), request_body(content = crate::docs::Binary, content_type = "application/octet-stream"), responses((status = 201, description = "The written file", body = EntryStat)))]
async fn write_file(
    State(st): State<AppState>,
    Path(id): Path<String>,
    req: Request,
) -> ApiResult<Response> {
    let q = content_query(req.uri().query())?;
    let vol = authorize(&st, &id, req.headers()).await?;
    let (mut file, path) = st
        .engine
        .volume_open_write(&vol, q.path()?, q.attrs, q.force)
        .await?;
    let mut body = req.into_body().into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("The upload was interrupted: {e}")))?;
        file.write_all(&chunk)
            .await
            .map_err(bulkhead_engine::volume_fs::VolumeFsError::from_io)
            .map_err(bulkhead_engine::EngineError::from)?;
    }
    file.flush()
        .await
        .map_err(bulkhead_engine::volume_fs::VolumeFsError::from_io)
        .map_err(bulkhead_engine::EngineError::from)?;
    drop(file);
    let e = st.engine.volume_stat(&vol, path.shown()).await?;
    Ok((StatusCode::CREATED, Json(e)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_query_parses_sdk_shapes() {
        let q = content_query(Some(
            "path=%2Fa%2Fb.txt&uid=1000&gid=1000&mode=420&force=true",
        ))
        .unwrap();
        assert_eq!(q.path.as_deref(), Some("/a/b.txt"));
        assert_eq!(
            q.attrs,
            Attrs {
                uid: Some(1000),
                gid: Some(1000),
                mode: Some(420)
            }
        );
        assert!(q.force);
        assert_eq!(
            content_query(Some("path=x&depth=3")).unwrap().depth,
            Some(3)
        );
        for bad in ["uid=-1", "depth=x", "force=maybe", "mode=1e3"] {
            assert!(content_query(Some(bad)).is_err(), "{bad}");
        }
        assert!(content_query(None).unwrap().path().is_err());
    }
}
