//! `GET /files` (download) and `POST /files` (upload).
//!
//! Both stream: a download is read from disk chunk by chunk (compressed on a blocking thread
//! when the client accepts gzip), an upload is written to disk as the body arrives (decompressed
//! on a blocking thread when it is gzip-encoded). Files are opened with the requesting user's
//! credentials, so permissions are the user's and new files and directories belong to the user.
//!
//! Authorization: when the sandbox has an access token, a request needs the `X-Access-Token`
//! header or a valid URL signature (see [`bulkhead_envd::rest::file_signature`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bulkhead_envd::rest::{
    ErrorBody, FileOperation, HEADER_ACCESS_TOKEN, HEADER_METADATA_PREFIX, METADATA_XATTR_PREFIX,
    UploadedEntry, file_signature,
};
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::creds::{self, CredsError};
use crate::paths::{self, PathError};
use crate::state::SharedState;
use crate::users::{User, UserError};

/// Size of the chunks files are streamed in.
const CHUNK: usize = 64 << 10;
/// Longest metadata key (xattr names are limited to 255 bytes, minus the `user.e2b.` prefix).
const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Largest total size of metadata keys and values.
const MAX_METADATA_TOTAL: usize = 4096;

/// Query parameters of `/files`.
#[derive(Debug, Default, Deserialize)]
pub struct FilesQuery {
    /// File path (absolute, or relative to the user's home).
    pub path: Option<String>,
    /// User to act as (default user when absent or empty).
    pub username: Option<String>,
    /// URL signature.
    pub signature: Option<String>,
    /// Expiry of the signature (Unix seconds).
    pub signature_expiration: Option<String>,
}

/// Errors of `/files`; each maps to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// Missing or wrong token or signature.
    #[error("{0}")]
    Unauthorized(String),
    /// Unknown user.
    #[error(transparent)]
    User(#[from] UserError),
    /// Malformed request.
    #[error("{0}")]
    BadRequest(String),
    /// No acceptable content encoding.
    #[error("{0}")]
    NotAcceptable(String),
    /// Nothing at the path.
    #[error("path '{}' does not exist", .0.display())]
    NotFound(PathBuf),
    /// The path is a directory.
    #[error("path '{}' is a directory", .0.display())]
    IsDirectory(PathBuf),
    /// The path is a device, FIFO or socket.
    #[error("path '{}' is not a regular file", .0.display())]
    NotRegular(PathBuf),
    /// A parent of the path is a file.
    #[error("a parent of '{}' exists and is not a directory", .0.display())]
    ParentNotDirectory(PathBuf),
    /// The user lacks permission.
    #[error("permission denied: user '{user}' cannot {operation} '{}'", .path.display())]
    Forbidden {
        /// User.
        user: String,
        /// What was attempted.
        operation: &'static str,
        /// Path.
        path: PathBuf,
    },
    /// Disk full.
    #[error("not enough disk space available to write '{}'", .0.display())]
    NoSpace(PathBuf),
    /// Bad path.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Credential switch failed.
    #[error(transparent)]
    Creds(#[from] CredsError),
    /// Other I/O failure.
    #[error("could not {operation} '{}'", .path.display())]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

impl FilesError {
    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            FilesError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            FilesError::User(UserError::Io { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
            FilesError::User(_) => StatusCode::UNAUTHORIZED,
            FilesError::BadRequest(_)
            | FilesError::IsDirectory(_)
            | FilesError::NotRegular(_)
            | FilesError::ParentNotDirectory(_)
            | FilesError::Path(_) => StatusCode::BAD_REQUEST,
            FilesError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            FilesError::NotFound(_) => StatusCode::NOT_FOUND,
            FilesError::Forbidden { .. } => StatusCode::FORBIDDEN,
            FilesError::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            FilesError::Creds(_) | FilesError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn from_io(user: &str, operation: &'static str, path: &Path, error: io::Error) -> Self {
        match error.raw_os_error() {
            Some(libc::ENOENT) => FilesError::NotFound(path.to_owned()),
            Some(libc::EISDIR) => FilesError::IsDirectory(path.to_owned()),
            Some(libc::ENOTDIR | libc::EEXIST) => FilesError::ParentNotDirectory(path.to_owned()),
            Some(libc::EACCES | libc::EPERM | libc::EROFS) => FilesError::Forbidden {
                user: user.to_owned(),
                operation,
                path: path.to_owned(),
            },
            Some(libc::ENOSPC | libc::EDQUOT) => FilesError::NoSpace(path.to_owned()),
            _ => FilesError::Io {
                operation,
                path: path.to_owned(),
                source: error,
            },
        }
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %crate::error_chain(&self), "file request failed");
        }
        error_json(status, crate::error_chain(&self))
    }
}

/// The plain-HTTP error body `{"code": <status>, "message": "..."}`.
pub fn error_json(status: StatusCode, message: String) -> Response {
    let body = serde_json::to_vec(&ErrorBody {
        code: status.as_u16(),
        message,
    })
    .unwrap_or_default();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Constant-time string comparison (length is not secret).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Checks the access token header or the URL signature, as envd does.
pub fn authorize(
    token: Option<&str>,
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: FileOperation,
    now_unix: i64,
) -> Result<(), FilesError> {
    let Some(token) = token else {
        return Ok(());
    };
    if let Some(sent) = headers.get(HEADER_ACCESS_TOKEN) {
        return if constant_time_eq(sent.to_str().unwrap_or(""), token) {
            Ok(())
        } else {
            Err(FilesError::Unauthorized(
                "access token present in header but does not match".into(),
            ))
        };
    }
    let signature = query.signature.as_deref().ok_or_else(|| {
        FilesError::Unauthorized(
            "missing signature query parameter: send the X-Access-Token header or use a signed URL \
             (`sandbox.download_url()` / `sandbox.upload_url()`)"
                .into(),
        )
    })?;
    let expiration = match query.signature_expiration.as_deref() {
        None => None,
        Some(text) => Some(text.trim().parse::<i64>().map_err(|_| {
            FilesError::Unauthorized(format!("invalid signature_expiration {text:?}"))
        })?),
    };
    let expected = file_signature(
        query.path.as_deref().unwrap_or(""),
        operation,
        query.username.as_deref().unwrap_or(""),
        token,
        expiration,
    );
    if !constant_time_eq(&expected, signature) {
        return Err(FilesError::Unauthorized("invalid signature".into()));
    }
    if let Some(exp) = expiration
        && exp < now_unix
    {
        return Err(FilesError::Unauthorized(
            "signature is already expired: create a new signed URL".into(),
        ));
    }
    Ok(())
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Response encoding of a download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// As is.
    Identity,
    /// gzip.
    Gzip,
}

/// Picks the response encoding from `Accept-Encoding` (RFC 9110: identity is acceptable unless
/// excluded with `q=0`, explicitly or through `*;q=0`).
pub fn negotiate_encoding(accept: Option<&str>) -> Result<Encoding, FilesError> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(Encoding::Identity);
    };
    let mut codings: Vec<(String, f32)> = accept
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let name = parts.next()?.trim().to_ascii_lowercase();
            if name.is_empty() {
                return None;
            }
            let q = parts
                .filter_map(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .or_else(|| p.trim().strip_prefix("Q="))
                })
                .find_map(|v| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            Some((name, q))
        })
        .collect();
    codings.sort_by(|a, b| b.1.total_cmp(&a.1));
    let q_of = |name: &str| codings.iter().find(|(n, _)| n == name).map(|(_, q)| *q);
    let identity_ok = match q_of("identity") {
        Some(q) => q > 0.0,
        None => q_of("*").is_none_or(|q| q > 0.0),
    };
    for (name, q) in &codings {
        if *q <= 0.0 {
            continue;
        }
        match name.as_str() {
            "gzip" | "x-gzip" => return Ok(Encoding::Gzip),
            "identity" => return Ok(Encoding::Identity),
            "*" => {
                return Ok(if identity_ok {
                    Encoding::Identity
                } else {
                    Encoding::Gzip
                });
            }
            _ => {}
        }
    }
    if identity_ok {
        Ok(Encoding::Identity)
    } else {
        Err(FilesError::NotAcceptable(format!(
            "no acceptable content encoding in Accept-Encoding {accept:?}; supported: gzip, identity"
        )))
    }
}

fn resolve_user(state: &SharedState, query: &FilesQuery) -> Result<User, FilesError> {
    let name = query.username.as_deref().filter(|n| !n.is_empty());
    Ok(state.resolve_user(name)?.0)
}

fn resolve_path(state: &SharedState, user: &User, path: &str) -> Result<PathBuf, FilesError> {
    Ok(paths::resolve(
        path,
        &user.home,
        state.settings().default_workdir.as_deref(),
    )?)
}

async fn as_user<T, F>(user: &User, work: F) -> Result<T, FilesError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FilesError> + Send + 'static,
{
    creds::run_as(&user.identity(), work).await?
}

/// `GET /files`.
pub async fn download(
    State(state): State<SharedState>,
    Query(query): Query<FilesQuery>,
    headers: HeaderMap,
) -> Response {
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

/// Collects written bytes into chunks sent over a channel.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send_buffer()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffer()
    }
}

/// Streams `file` gzip-compressed; compression runs on a blocking thread that stops when the
/// client goes away.
fn gzip_file(mut file: std::fs::File) -> ReceiverStream<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let mut encoder = flate2::write::GzEncoder::new(writer, flate2::Compression::default());
        let result = io::copy(&mut file, &mut encoder)
            .and_then(|_| encoder.finish())
            .and_then(|mut w| w.flush());
        if let Err(e) = result
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            let _ = tx.blocking_send(Err(e));
        }
    });
    ReceiverStream::new(rx)
}

/// Adapts an async byte stream to `Read` for a blocking thread.
struct BlockingStreamReader {
    handle: tokio::runtime::Handle,
    stream: BoxStream<'static, io::Result<Bytes>>,
    current: Bytes,
}

impl Read for BlockingStreamReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.handle.block_on(self.stream.next()) {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Decompresses a gzip byte stream on a blocking thread.
fn gunzip_stream(
    input: BoxStream<'static, io::Result<Bytes>>,
) -> BoxStream<'static, io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(8);
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let reader = BlockingStreamReader {
            handle,
            stream: input,
            current: Bytes::new(),
        };
        let mut decoder = flate2::read::MultiGzDecoder::new(reader);
        let mut buf = vec![0_u8; CHUNK];
        loop {
            match decoder.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(io::Error::new(
                        e.kind(),
                        format!("invalid gzip body: {e}"),
                    )));
                    break;
                }
            }
        }
    });
    ReceiverStream::new(rx).boxed()
}

/// Metadata to store from `X-Metadata-<key>` headers; `None` when there are none.
pub fn parse_metadata_headers(
    headers: &HeaderMap,
) -> Result<Option<Vec<(String, String)>>, FilesError> {
    let mut out = Vec::new();
    let mut total = 0;
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(HEADER_METADATA_PREFIX) else {
            continue;
        };
        if key.is_empty() || key.len() > MAX_METADATA_KEY {
            return Err(FilesError::BadRequest(format!(
                "metadata key {key:?} must be 1 to {MAX_METADATA_KEY} bytes long"
            )));
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..=0x7e).contains(&b)))
            .ok_or_else(|| {
                FilesError::BadRequest(format!("metadata value of {key:?} must be printable ASCII"))
            })?;
        total += key.len() + value.len();
        out.push((key.to_owned(), value.to_owned()));
    }
    if total > MAX_METADATA_TOTAL {
        return Err(FilesError::BadRequest(format!(
            "metadata is {total} bytes; at most {MAX_METADATA_TOTAL} bytes of keys and values are allowed"
        )));
    }
    Ok((!out.is_empty()).then_some(out))
}

/// Replaces the file's `user.e2b.*` extended attributes with `metadata`.
fn set_metadata(file: &std::fs::File, metadata: &[(String, String)]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut names = vec![0_u8; 4096];
    // SAFETY: the buffer is valid for `names.len()` bytes; fd is open.
    let len = unsafe { libc::flistxattr(fd, names.as_mut_ptr().cast(), names.len()) };
    if let Ok(len) = usize::try_from(len) {
        for name in names[..len].split(|b| *b == 0) {
            if name.starts_with(METADATA_XATTR_PREFIX.as_bytes())
                && let Ok(c_name) = CString::new(name)
            {
                // SAFETY: NUL-terminated name; fd is open.
                unsafe { libc::fremovexattr(fd, c_name.as_ptr()) };
            }
        }
    }
    for (key, value) in metadata {
        let c_name =
            CString::new(format!("{METADATA_XATTR_PREFIX}{key}")).map_err(io::Error::other)?;
        // SAFETY: NUL-terminated name; the value buffer is valid for its length; fd is open.
        let rc =
            unsafe { libc::fsetxattr(fd, c_name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Creates missing parents, then opens `path` for writing (created or truncated) and stores the
/// metadata. Runs with the user's credentials.
fn open_for_write(
    user: &str,
    path: &Path,
    metadata: Option<&[(String, String)]>,
) -> Result<std::fs::File, FilesError> {
    if let Some(parent) = path.parent() {
        crate::filesystem::create_dirs(parent)
            .map_err(|e| FilesError::from_io(user, "create directories for", path, e))?;
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(FilesError::IsDirectory(path.to_owned()));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .open(path)
        .map_err(|e| FilesError::from_io(user, "write", path, e))?;
    if let Some(metadata) = metadata {
        set_metadata(&file, metadata).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTSUP) => FilesError::BadRequest(format!(
                "the filesystem of '{}' does not support file metadata (extended attributes)",
                path.display()
            )),
            _ => FilesError::from_io(user, "set metadata on", path, e),
        })?;
    }
    Ok(file)
}

/// Streams `data` into `path` as `user`.
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
    let name = user.name.clone();
    let open_path = path.clone();
    let file = as_user(user, move || {
        open_for_write(&name, &open_path, metadata.as_deref())
    })
    .await?;
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
    Ok(())
}

/// The destination in a part's `Content-Disposition` (`filename*=` preferred over `filename=`),
/// with directory components kept.
pub fn disposition_filename(value: &str) -> Option<String> {
    let mut plain = None;
    let mut extended = None;
    for param in split_params(value).into_iter().skip(1) {
        let Some((key, raw)) = param.split_once('=') else {
            continue;
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "filename" => plain = Some(unquote(raw.trim())),
            "filename*" => {
                let raw = unquote(raw.trim());
                // RFC 5987: charset'language'percent-encoded
                let mut pieces = raw.splitn(3, '\'');
                let (charset, _, encoded) = (pieces.next(), pieces.next(), pieces.next());
                if let (Some(charset), Some(encoded)) = (charset, encoded) {
                    let bytes = urlencoding::decode_binary(encoded.as_bytes()).into_owned();
                    extended = if charset.eq_ignore_ascii_case("utf-8") {
                        String::from_utf8(bytes).ok()
                    } else {
                        Some(bytes.iter().map(|b| char::from(*b)).collect())
                    };
                }
            }
            _ => {}
        }
    }
    extended.or(plain).filter(|f| !f.is_empty())
}

/// Splits a header value at `;` outside quoted strings.
fn split_params(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            current.push(c);
            escaped = false;
            continue;
        }
        match c {
            '\\' if in_quotes => {
                current.push(c);
                escaped = true;
            }
            '"' => {
                in_quotes = !in_quotes;
                current.push(c);
            }
            ';' if !in_quotes => out.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    out.push(current);
    out
}

fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"') else {
        return value.to_owned();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            '"' => break,
            _ => out.push(c),
        }
    }
    out
}

/// How much of an abandoned upload body is read (and discarded) before answering; beyond
/// this the connection is closed instead.
const MAX_DRAIN: usize = 64 << 20;

/// `POST /files`.
pub async fn upload(
    State(state): State<SharedState>,
    Query(query): Query<FilesQuery>,
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
    let result = upload_inner(&state, &query, &headers, ReceiverStream::new(rx).boxed()).await;
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

fn entry_for(path: &Path) -> UploadedEntry {
    UploadedEntry {
        path: path.to_string_lossy().into_owned(),
        name: path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        r#type: "file".to_owned(),
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
        return Ok(vec![entry_for(&path)]);
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
        written.push(entry_for(&path));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_keep_directories() {
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="/home/user/dir/a.txt""#)
                .as_deref(),
            Some("/home/user/dir/a.txt")
        );
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="a;b \"q\".txt""#).as_deref(),
            Some(r#"a;b "q".txt"#)
        );
        assert_eq!(
            disposition_filename(
                "form-data; name=file; filename*=UTF-8''d%C3%ADr%2Fx.txt; filename=x"
            )
            .as_deref(),
            Some("dír/x.txt")
        );
        assert_eq!(disposition_filename(r#"form-data; name="file""#), None);
        assert_eq!(
            disposition_filename(r#"form-data; name="file"; filename="""#),
            None
        );
    }

    #[test]
    fn accept_encoding() {
        assert_eq!(negotiate_encoding(None).unwrap(), Encoding::Identity);
        assert_eq!(negotiate_encoding(Some("gzip")).unwrap(), Encoding::Gzip);
        assert_eq!(
            negotiate_encoding(Some("br;q=1, gzip;q=0.5")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(
            negotiate_encoding(Some("gzip;q=0")).unwrap(),
            Encoding::Identity
        );
        assert_eq!(negotiate_encoding(Some("br")).unwrap(), Encoding::Identity);
        assert_eq!(
            negotiate_encoding(Some("identity;q=0, gzip")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(
            negotiate_encoding(Some("*;q=0, gzip")).unwrap(),
            Encoding::Gzip
        );
        assert_eq!(negotiate_encoding(Some("*")).unwrap(), Encoding::Identity);
        assert!(matches!(
            negotiate_encoding(Some("br, identity;q=0")),
            Err(FilesError::NotAcceptable(_))
        ));
        assert!(matches!(
            negotiate_encoding(Some("*;q=0")),
            Err(FilesError::NotAcceptable(_))
        ));
    }

    #[test]
    fn signatures() {
        let q = |path: &str, sig: Option<String>, exp: Option<i64>| FilesQuery {
            path: Some(path.to_owned()),
            username: None,
            signature: sig,
            signature_expiration: exp.map(|e| e.to_string()),
        };
        let headers = HeaderMap::new();
        // No token: everything is allowed.
        authorize(None, &headers, &q("a", None, None), FileOperation::Read, 0).unwrap();
        let good = file_signature("a", FileOperation::Read, "", "tok", None);
        authorize(
            Some("tok"),
            &headers,
            &q("a", Some(good.clone()), None),
            FileOperation::Read,
            0,
        )
        .unwrap();
        // Wrong operation, path, or missing signature.
        assert!(
            authorize(
                Some("tok"),
                &headers,
                &q("a", Some(good.clone()), None),
                FileOperation::Write,
                0
            )
            .is_err()
        );
        assert!(
            authorize(
                Some("tok"),
                &headers,
                &q("b", Some(good), None),
                FileOperation::Read,
                0
            )
            .is_err()
        );
        assert!(
            authorize(
                Some("tok"),
                &headers,
                &q("a", None, None),
                FileOperation::Read,
                0
            )
            .is_err()
        );
        // Expiry.
        let exp = file_signature("a", FileOperation::Read, "", "tok", Some(100));
        authorize(
            Some("tok"),
            &headers,
            &q("a", Some(exp.clone()), Some(100)),
            FileOperation::Read,
            100,
        )
        .unwrap();
        assert!(
            authorize(
                Some("tok"),
                &headers,
                &q("a", Some(exp), Some(100)),
                FileOperation::Read,
                101
            )
            .is_err()
        );
        // Header wins over signature; a wrong header fails.
        let mut with_header = HeaderMap::new();
        with_header.insert(HEADER_ACCESS_TOKEN, HeaderValue::from_static("tok"));
        authorize(
            Some("tok"),
            &with_header,
            &q("a", None, None),
            FileOperation::Write,
            0,
        )
        .unwrap();
        with_header.insert(HEADER_ACCESS_TOKEN, HeaderValue::from_static("nope"));
        assert!(
            authorize(
                Some("tok"),
                &with_header,
                &q("a", None, None),
                FileOperation::Write,
                0
            )
            .is_err()
        );
    }

    #[test]
    fn metadata_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse_metadata_headers(&headers).unwrap(), None);
        headers.insert("x-metadata-author", HeaderValue::from_static("me"));
        headers.insert("content-type", HeaderValue::from_static("x"));
        assert_eq!(
            parse_metadata_headers(&headers).unwrap(),
            Some(vec![("author".to_owned(), "me".to_owned())])
        );
        headers.insert("x-metadata-bad", HeaderValue::from_bytes(b"\xff").unwrap());
        assert!(parse_metadata_headers(&headers).is_err());
    }
}
