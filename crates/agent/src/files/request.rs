//! The query of `/files` requests and resolving it: the user to act as, the path, and running
//! work with that user's credentials.

use std::path::PathBuf;

use axum::extract::Query;
use axum::http::Uri;
use serde::Deserialize;

use super::error::FilesError;
use crate::creds;
use crate::paths;
use crate::state::SharedState;
use crate::users::User;

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

impl FilesQuery {
    /// Parses the query of `uri`. Values must decode to UTF-8: a path with other bytes would
    /// otherwise be decoded lossily and name a different file than the client meant.
    pub fn from_uri(uri: &Uri) -> Result<Self, FilesError> {
        for pair in uri.query().unwrap_or("").split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if std::str::from_utf8(&urlencoding::decode_binary(value.as_bytes())).is_err() {
                return Err(FilesError::NotUtf8(
                    String::from_utf8_lossy(&urlencoding::decode_binary(name.as_bytes()))
                        .into_owned(),
                ));
            }
        }
        Ok(Query::try_from_uri(uri).map_err(FilesError::Query)?.0)
    }
}

/// The user a request acts as: `username`, or the default user when absent or empty.
pub fn resolve_user(state: &SharedState, query: &FilesQuery) -> Result<User, FilesError> {
    let name = query.username.as_deref().filter(|n| !n.is_empty());
    Ok(state.resolve_user(name)?.0)
}

/// The client's `path` resolved for `user` (see [`paths::resolve`]).
pub fn resolve_path(state: &SharedState, user: &User, path: &str) -> Result<PathBuf, FilesError> {
    Ok(paths::resolve(
        path,
        &user.home,
        state.settings().default_workdir.as_deref(),
    )?)
}

/// Runs `work` with `user`'s credentials on a blocking thread and flattens the result.
pub async fn as_user<T, F>(user: &User, work: F) -> Result<T, FilesError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FilesError> + Send + 'static,
{
    creds::run_as(&user.identity(), work).await?
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn uri(query: &str) -> Uri {
        format!("/files?{query}").parse().unwrap()
    }

    #[test]
    fn parses_the_query() {
        let q = FilesQuery::from_uri(&uri("path=%2Fa+b&username=u&signature=v1_x")).unwrap();
        assert_eq!(q.path.as_deref(), Some("/a b"));
        assert_eq!(q.username.as_deref(), Some("u"));
        assert_eq!(q.signature.as_deref(), Some("v1_x"));
        assert!(matches!(
            FilesQuery::from_uri(&uri("path=a&path=b")),
            Err(FilesError::Query(_))
        ));
        assert!(matches!(
            FilesQuery::from_uri(&uri("path=%FF")),
            Err(FilesError::NotUtf8(name)) if name == "path"
        ));
        let q = FilesQuery::from_uri(&"/files".parse().unwrap()).unwrap();
        assert!(q.path.is_none());
    }

    proptest! {
        #[test]
        fn utf8_values_round_trip(path in any::<String>(), user in any::<String>()) {
            let query = format!(
                "path={}&username={}",
                urlencoding::encode(&path),
                urlencoding::encode(&user)
            );
            let q = FilesQuery::from_uri(&uri(&query)).unwrap();
            prop_assert_eq!(q.path, Some(path));
            prop_assert_eq!(q.username, Some(user));
        }

        #[test]
        fn other_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..16)) {
            let encoded: String = bytes.iter().map(|b| format!("%{b:02X}")).collect();
            let result = FilesQuery::from_uri(&uri(&format!("signature=s&path={encoded}")));
            match String::from_utf8(bytes) {
                Ok(text) => prop_assert_eq!(result.unwrap().path, Some(text)),
                Err(_) => prop_assert!(matches!(result, Err(FilesError::NotUtf8(_)))),
            }
        }
    }
}
