//! `GET /files` (download) and `POST /files` (upload).
//!
//! Both stream: a download is read from disk chunk by chunk (compressed on a blocking thread
//! when the client accepts gzip), an upload is written to disk as the body arrives (decompressed
//! on a blocking thread when it is gzip-encoded). Files are opened with the requesting user's
//! credentials, so permissions are the user's and new files and directories belong to the user.
//!
//! Authorization: when the sandbox has an access token, a request needs the `X-Access-Token`
//! header or a valid URL signature (see [`bulkhead_envd::rest::file_signature`]).
//!
//! One concern per module; the modules import one another directly (never through this one):
//! [`error`] and [`request`] are shared, [`auth`], [`encoding`], [`gzip`], [`metadata`] and
//! [`disposition`] are leaves of the two handlers in [`download`] and [`upload`].

pub mod auth;
pub mod disposition;
pub mod download;
pub mod encoding;
pub mod error;
pub mod gzip;
pub mod metadata;
pub mod request;
pub mod upload;

pub use auth::authorize;
pub use disposition::disposition_filename;
pub use download::download;
pub use encoding::{Encoding, negotiate_encoding};
pub use error::FilesError;
pub use metadata::parse_metadata_headers;
pub use request::FilesQuery;
pub use upload::upload;
