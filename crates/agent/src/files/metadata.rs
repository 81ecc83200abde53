//! File metadata: `X-Metadata-<key>` upload headers, stored as `user.e2b.<key>` extended
//! attributes of the file.

use std::ffi::CString;
use std::io;

use axum::http::HeaderMap;
use bulkhead_envd::rest::{HEADER_METADATA_PREFIX, METADATA_XATTR_PREFIX};

use super::error::FilesError;

/// Longest metadata key (xattr names are limited to 255 bytes, minus the `user.e2b.` prefix).
const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();
/// Largest total size of metadata keys and values.
const MAX_METADATA_TOTAL: usize = 4096;

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
pub fn set_metadata(file: &std::fs::File, metadata: &[(String, String)]) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

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

    mod properties {
        use axum::http::HeaderValue;
        use proptest::prelude::*;

        use super::super::*;

        proptest! {
            #[test]
            fn accepted_metadata_fits_xattrs(entries in prop::collection::vec(("[a-z0-9-]{0,300}", prop::collection::vec(any::<u8>(), 0..200)), 0..8)) {
                let mut headers = HeaderMap::new();
                for (key, value) in &entries {
                    let (Ok(name), Ok(value)) = (
                        axum::http::HeaderName::try_from(format!("x-metadata-{key}")),
                        HeaderValue::from_bytes(value),
                    ) else {
                        continue;
                    };
                    headers.append(name, value);
                }
                if let Ok(Some(parsed)) = parse_metadata_headers(&headers) {
                    let total: usize = parsed.iter().map(|(k, v)| k.len() + v.len()).sum();
                    prop_assert!(total <= MAX_METADATA_TOTAL);
                    for (key, value) in parsed {
                        prop_assert!(!key.is_empty() && key.len() <= MAX_METADATA_KEY);
                        prop_assert!(value.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                    }
                }
            }
        }
    }
}
