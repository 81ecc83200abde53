//! `POST /files`: multipart or `application/octet-stream` uploads, written to disk as the body
//! arrives (decompressed on a blocking thread when gzip-encoded), with missing parent
//! directories created (owned by the user) and `X-Metadata-*` headers stored as extended
//! attributes, replacing any earlier ones.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use bulkhead_envd::rest::{FileOperation, UploadedEntry};
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::auth::{authorize, now_unix};
use super::disposition::disposition_filename;
use super::error::FilesError;
use super::gzip::gunzip_stream;
use super::metadata::{parse_metadata_headers, set_metadata};
use super::request::{FilesQuery, as_user, resolve_path, resolve_user};
use crate::filesystem::entry::read_metadata;
use crate::paths;
use crate::state::SharedState;
use crate::users::User;

/// How much of an abandoned upload body is read (and discarded) before answering; beyond
/// this the connection is closed instead.
const MAX_DRAIN: usize = 64 << 20;

/// `POST /files`.
pub async fn upload(
    State(state): State<SharedState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // The body is read through a feeder task that, once the upload logic is done with it (at
    // the multipart epilogue, or early on an error), keeps reading to the end before we answer:
    // closing a Unix socket with unread request bytes makes the host proxy's write fail and
    // the client would see a 502 instead of this response.
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
    let feeder = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut drained: usize = 0;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) if !tx.is_closed() => {
                    if tx.send(Ok(c)).await.is_err() {
                        continue;
                    }
                }
                Ok(c) => {
                    drained += c.len();
                    if drained > MAX_DRAIN {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(io::Error::other(e))).await;
                    break;
                }
            }
        }
    });
    // A bad query is answered only after the body was drained too, for the same reason.
    let result = match FilesQuery::from_uri(&uri) {
        Ok(query) => upload_inner(&state, &query, &headers, ReceiverStream::new(rx).boxed()).await,
        Err(e) => {
            drop(rx);
            Err(e)
        }
    };
    let _ = feeder.await;
    match result {
        Ok(entries) => {
            let mut response =
                Response::new(Body::from(serde_json::to_vec(&entries).unwrap_or_default()));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => e.into_response(),
    }
}

/// The response entry of a written file, with its metadata read back from disk as envd does
/// (so it never claims metadata that was not stored).
async fn entry_for(path: &Path) -> UploadedEntry {
    let owned = path.to_owned();
    let metadata = tokio::task::spawn_blocking(move || read_metadata(&owned))
        .await
        .unwrap_or_default();
    UploadedEntry {
        path: path.to_string_lossy().into_owned(),
        name: path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        r#type: "file".to_owned(),
        metadata: (!metadata.is_empty()).then_some(metadata),
    }
}

async fn upload_inner(
    state: &SharedState,
    query: &FilesQuery,
    headers: &HeaderMap,
    raw: BoxStream<'static, io::Result<Bytes>>,
) -> Result<Vec<UploadedEntry>, FilesError> {
    authorize(
        state.access_token().as_deref(),
        headers,
        query,
        FileOperation::Write,
        now_unix(),
    )?;
    let user = resolve_user(state, query)?;
    let metadata = parse_metadata_headers(headers)?;

    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" || e == "x-gzip" => true,
        Some(e) => {
            return Err(FilesError::BadRequest(format!(
                "unsupported Content-Encoding {e:?}; supported: gzip"
            )));
        }
    };
    let data = if gzip { gunzip_stream(raw) } else { raw };

    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();

    if media == "application/octet-stream" {
        let path = query
            .path
            .as_deref()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                FilesError::BadRequest(
                    "the path query parameter is required for application/octet-stream uploads"
                        .into(),
                )
            })?;
        let path = resolve_path(state, &user, path)?;
        write_file(&user, path.clone(), data, metadata).await?;
        return Ok(vec![entry_for(&path).await]);
    }
    if !media.starts_with("multipart/") {
        return Err(FilesError::BadRequest(format!(
            "unsupported content type {content_type:?}: expected multipart/form-data or application/octet-stream"
        )));
    }
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| FilesError::BadRequest(format!("invalid multipart content type: {e}")))?;
    let mut multipart = multer::Multipart::new(data, boundary);
    let mut written = Vec::new();
    let mut seen = HashSet::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| FilesError::BadRequest(format!("invalid multipart body: {e}")))?
    {
        if field.name() != Some("file") {
            continue;
        }
        let target = match query.path.as_deref().filter(|p| !p.is_empty()) {
            Some(path) => path.to_owned(),
            None => field
                .headers()
                .get(header::CONTENT_DISPOSITION)
                .and_then(|v| v.to_str().ok())
                .and_then(disposition_filename)
                .ok_or_else(|| {
                    FilesError::BadRequest(
                        "a `file` part has no filename (the destination path)".into(),
                    )
                })?,
        };
        let path = resolve_path(state, &user, &target)?;
        if !seen.insert(path.clone()) {
            return Err(FilesError::BadRequest(format!(
                "you cannot upload multiple files to the same path '{}' in one request; only the first was written",
                path.display()
            )));
        }
        write_file(&user, path.clone(), field, metadata.clone()).await?;
        written.push(entry_for(&path).await);
    }
    Ok(written)
}

/// Opens `path` for writing as the user: created, or kept and then emptied. Like envd it hands
/// the file to the user before writing (a `CHMOD` watch event between `CREATE` and `WRITE`, the
/// sequence E2B's SDK users see); an existing file of someone else keeps its owner.
fn open_for_write(user: &User, path: &Path) -> Result<std::fs::File, FilesError> {
    use std::os::fd::AsRawFd;
    let name = &user.name;
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(FilesError::IsDirectory(path.to_owned()));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(|e| FilesError::from_io(name, "write", path, e))?;
    // SAFETY: fd is open. Failure (a file owned by another user) is expected and harmless.
    unsafe { libc::fchown(file.as_raw_fd(), user.uid, user.gid) };
    let len = file
        .metadata()
        .map_err(|e| FilesError::from_io(name, "write", path, e))?
        .len();
    if len > 0 {
        file.set_len(0)
            .map_err(|e| FilesError::from_io(name, "write", path, e))?;
    }
    Ok(file)
}

/// Replaces the file's metadata after its content, as envd does: an overwrite without metadata
/// clears the old one (truncating keeps extended attributes).
fn store_metadata(
    user: &str,
    path: &Path,
    file: &std::fs::File,
    metadata: Option<&[(String, String)]>,
) -> Result<(), FilesError> {
    match set_metadata(file, metadata.unwrap_or_default()) {
        Ok(()) => Ok(()),
        // Nothing to store and nothing can have been stored (e.g. /proc, /sys).
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) && metadata.is_none() => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Err(FilesError::BadRequest(format!(
            "the filesystem of '{}' does not support file metadata (extended attributes)",
            path.display()
        ))),
        Err(e) => Err(FilesError::from_io(user, "set metadata on", path, e)),
    }
}

/// Streams `data` into `path` as `user`, then stores `metadata`.
async fn write_file<S, E>(
    user: &User,
    path: PathBuf,
    data: S,
    metadata: Option<Vec<(String, String)>>,
) -> Result<(), FilesError>
where
    S: futures::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    // Missing parents are created with the agent's (sandbox root) credentials and handed to
    // the user, as envd does, directly under `/` too (`/0/x.txt`); the file itself is opened
    // as the user, so existing files and directories keep their permissions.
    if let Some(parent) = path.parent().map(Path::to_owned) {
        let (uid, gid, name) = (user.uid, user.gid, user.name.clone());
        let file_path = path.clone();
        tokio::task::spawn_blocking(move || {
            paths::ensure_dirs_owned(&parent, uid, gid)
                .map_err(|e| FilesError::from_io(&name, "create directories for", &file_path, e))
        })
        .await
        .map_err(|_| FilesError::from(crate::creds::CredsError::Panicked))??;
    }
    let open_user = user.clone();
    let open_path = path.clone();
    let file = as_user(user, move || open_for_write(&open_user, &open_path)).await?;
    let mut file = tokio::fs::File::from_std(file);
    let mut data = data;
    while let Some(chunk) = data.next().await {
        let chunk =
            chunk.map_err(|e| FilesError::BadRequest(format!("reading the upload failed: {e}")))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| FilesError::from_io(&user.name, "write", &path, e))?;
    }
    file.flush()
        .await
        .map_err(|e| FilesError::from_io(&user.name, "write", &path, e))?;
    let file = file.into_std().await;
    let name = user.name.clone();
    tokio::task::spawn_blocking(move || store_metadata(&name, &path, &file, metadata.as_deref()))
        .await
        .map_err(|_| FilesError::from(crate::creds::CredsError::Panicked))?
}
