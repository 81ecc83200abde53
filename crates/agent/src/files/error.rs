//! The errors of `/files` and the HTTP status and E2B error body each maps to.

use std::io;
use std::path::{Path, PathBuf};

use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::creds::CredsError;
use crate::http::error_json;
use crate::paths::PathError;
use crate::report::error_chain;
use crate::users::UserError;

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
    /// The query string does not parse (e.g. a parameter given twice).
    #[error(
        "The query string is invalid; send `path`, `username`, `signature` and `signature_expiration` at most once each"
    )]
    Query(#[source] QueryRejection),
    /// A query parameter is not UTF-8 once percent-decoded.
    #[error(
        "The query parameter {0:?} is not valid UTF-8 once percent-decoded; send UTF-8 paths and user names"
    )]
    NotUtf8(String),
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
    /// The file is a program that is running (`ETXTBSY`), e.g. `/usr/bin/python3` under a kernel.
    #[error("'{}' is a program that is running and cannot be written while it runs", .0.display())]
    Busy(PathBuf),
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
            | FilesError::Query(_)
            | FilesError::NotUtf8(_)
            | FilesError::IsDirectory(_)
            | FilesError::NotRegular(_)
            | FilesError::ParentNotDirectory(_)
            | FilesError::Path(_) => StatusCode::BAD_REQUEST,
            FilesError::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            FilesError::Busy(_) => StatusCode::CONFLICT,
            FilesError::NotFound(_) => StatusCode::NOT_FOUND,
            FilesError::Forbidden { .. } => StatusCode::FORBIDDEN,
            FilesError::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            FilesError::Creds(_) | FilesError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Maps an I/O error of `operation` on `path` (done as `user`) to the error the client sees.
    pub fn from_io(user: &str, operation: &'static str, path: &Path, error: io::Error) -> Self {
        match error.raw_os_error() {
            Some(libc::ENOENT) => FilesError::NotFound(path.to_owned()),
            Some(libc::EISDIR) => FilesError::IsDirectory(path.to_owned()),
            Some(libc::ENOTDIR | libc::EEXIST) => FilesError::ParentNotDirectory(path.to_owned()),
            Some(libc::EACCES | libc::EPERM | libc::EROFS) => FilesError::Forbidden {
                user: user.to_owned(),
                operation,
                path: path.to_owned(),
            },
            Some(libc::ETXTBSY) => FilesError::Busy(path.to_owned()),
            // open(2) of a Unix socket or a device without a driver.
            Some(libc::ENXIO) => FilesError::NotRegular(path.to_owned()),
            Some(libc::ENOSPC | libc::EDQUOT) => FilesError::NoSpace(path.to_owned()),
            Some(libc::ENAMETOOLONG) => FilesError::Path(PathError::KernelTooLong),
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
            tracing::warn!(error = %error_chain(&self), "file request failed");
        }
        error_json(status, error_chain(&self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_mistakes_are_4xx() {
        let path = Path::new("/x");
        let status = |errno| {
            FilesError::from_io("u", "read", path, io::Error::from_raw_os_error(errno)).status()
        };
        assert_eq!(status(libc::ENAMETOOLONG), StatusCode::BAD_REQUEST);
        assert_eq!(status(libc::ENOENT), StatusCode::NOT_FOUND);
        assert_eq!(status(libc::EACCES), StatusCode::FORBIDDEN);
        // Read-only mounts (/proc, /dev, /sys) and running programs are the client's to avoid.
        assert_eq!(status(libc::EROFS), StatusCode::FORBIDDEN);
        assert_eq!(status(libc::ETXTBSY), StatusCode::CONFLICT);
        assert_eq!(status(libc::EIO), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            FilesError::NotUtf8("path".into()).status(),
            StatusCode::BAD_REQUEST
        );
    }
}
