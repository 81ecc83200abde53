//! Database URLs: which backend a URL names, the SQLite forms sqlx needs (create mode, paths
//! encoded), and redaction of passwords for messages and logs.

use std::path::{Path, PathBuf};

use crate::{Result, StoreError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

pub(super) fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    }
}

/// Classifies the URL and, for SQLite, makes sure the file and its directory get created.
pub(super) fn normalize_url(url: &str) -> Result<(Backend, String)> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok((Backend::Postgres, url.to_owned()));
    }
    let Some(rest) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    else {
        return Err(StoreError::InvalidUrl { url: redact(url) });
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(StoreError::InvalidUrl {
            url: url.to_owned(),
        });
    }
    if is_sqlite_memory(url) {
        return Ok((Backend::Sqlite, url.to_owned()));
    }
    let has_mode = query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("mode=")));
    let mut query = query.unwrap_or("").to_owned();
    if !has_mode {
        // sqlx opens read-write without creating by default; a fresh data dir needs the file.
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str("mode=rwc");
    }
    let decoded = urlencoding_decode(path);
    if let Some(parent) = Path::new(&decoded)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    // `sqlite://` + relative path would make the first component a URL host; `sqlite:` keeps the
    // path opaque, and absolute paths read naturally as `sqlite:///abs`.
    let url = if path.starts_with('/') {
        format!("sqlite://{path}?{query}")
    } else {
        format!("sqlite:{path}?{query}")
    };
    Ok((Backend::Sqlite, url))
}

pub(super) fn is_sqlite_memory(url: &str) -> bool {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    path == ":memory:" || query.split('&').any(|kv| kv == "mode=memory")
}

/// Percent-encodes a filesystem path for a `sqlite://` URL (sqlx decodes it again).
pub(super) fn encode_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn urlencoding_decode(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Hides the password of a `postgres://user:pass@host` URL for messages and logs.
pub(super) fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, host)) = rest.split_once('@')
        && let Some((user, _password)) = userinfo.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_get_create_mode() {
        let dir = tempfile::tempdir().unwrap();
        let abs = dir.path().join("sub/x.db");
        let (b, url) = normalize_url(&format!("sqlite://{}", abs.display())).unwrap();
        assert_eq!(b, Backend::Sqlite);
        assert_eq!(url, format!("sqlite://{}?mode=rwc", abs.display()));
        assert!(
            abs.parent().unwrap().is_dir(),
            "parent directory is created"
        );

        let (_, url) = normalize_url("sqlite:rel.db?mode=ro").unwrap();
        assert_eq!(url, "sqlite:rel.db?mode=ro");
        let (_, url) = normalize_url("sqlite::memory:").unwrap();
        assert_eq!(url, "sqlite::memory:");
        assert!(matches!(
            normalize_url("mysql://x"),
            Err(StoreError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn path_encoding_round_trips() {
        let p = Path::new("/tmp/a b/c?d#e%f.db");
        let enc = encode_path(p);
        assert!(!enc.contains(' ') && !enc.contains('?') && !enc.contains('#'));
        assert_eq!(urlencoding_decode(&enc), p);
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("sqlite:///x.db"), "sqlite:///x.db");
    }
}
