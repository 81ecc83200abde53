//! `GET /files`: streams a file from disk chunk by chunk, compressed on a blocking thread when
//! the client accepts gzip.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use bulkhead_envd::rest::FileOperation;
use tokio::io::AsyncReadExt;

use super::auth::{authorize, now_unix};
use super::encoding::{Encoding, negotiate_encoding};
use super::error::FilesError;
use super::gzip::{CHUNK, gzip_file};
use super::request::{FilesQuery, as_user, resolve_path, resolve_user};
use crate::state::SharedState;

/// `GET /files`.
pub async fn download(State(state): State<SharedState>, uri: Uri, headers: HeaderMap) -> Response {
    let query = match FilesQuery::from_uri(&uri) {
        Ok(query) => query,
        Err(e) => return e.into_response(),
    };
    match download_inner(&state, &query, &headers).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn download_inner(
    state: &SharedState,
    query: &FilesQuery,
    headers: &HeaderMap,
) -> Result<Response, FilesError> {
    authorize(
        state.access_token().as_deref(),
        headers,
        query,
        FileOperation::Read,
        now_unix(),
    )?;
    let user = resolve_user(state, query)?;
    let path = resolve_path(state, &user, query.path.as_deref().unwrap_or(""))?;
    let encoding = negotiate_encoding(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    )?;
    let name = user.name.clone();
    let (file, size) = as_user(&user, move || {
        let meta =
            std::fs::metadata(&path).map_err(|e| FilesError::from_io(&name, "read", &path, e))?;
        if meta.is_dir() {
            return Err(FilesError::IsDirectory(path));
        }
        if !meta.is_file() {
            return Err(FilesError::NotRegular(path));
        }
        let file =
            std::fs::File::open(&path).map_err(|e| FilesError::from_io(&name, "read", &path, e))?;
        let size = file
            .metadata()
            .map_err(|e| FilesError::from_io(&name, "read", &path, e))?
            .len();
        Ok((file, size))
    })
    .await?;

    let mut response = match encoding {
        Encoding::Gzip => {
            let mut r = Response::new(Body::from_stream(gzip_file(file)));
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        }
        Encoding::Identity => {
            let reader = tokio::fs::File::from_std(file).take(size);
            let mut r = Response::new(Body::from_stream(
                tokio_util::io::ReaderStream::with_capacity(reader, CHUNK),
            ));
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            r
        }
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    Ok(response)
}
