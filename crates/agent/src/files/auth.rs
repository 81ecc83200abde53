//! Authorization of `/files`: when the sandbox has an access token, a request needs the
//! `X-Access-Token` header or a valid URL signature (see [`file_signature`]), as with envd.

use axum::http::HeaderMap;
use bulkhead_envd::rest::{FileOperation, HEADER_ACCESS_TOKEN, file_signature};

use super::error::FilesError;
use super::request::FilesQuery;
use crate::http::constant_time_eq;

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
        // envd's exact message: clients match on it.
        return Err(FilesError::Unauthorized(
            "signature is already expired".into(),
        ));
    }
    Ok(())
}

/// The current time in Unix seconds, for signature expiry.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

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

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        fn query(
            path: &str,
            user: &str,
            signature: Option<String>,
            expiration: Option<String>,
        ) -> FilesQuery {
            FilesQuery {
                path: Some(path.to_owned()),
                username: Some(user.to_owned()),
                signature,
                signature_expiration: expiration,
            }
        }

        proptest! {
            #[test]
            fn signed_urls_work_until_they_expire(
                path in any::<String>(),
                user in "[a-z]{0,8}",
                token in "[A-Za-z0-9]{1,32}",
                expiration in prop::option::of(0_i64..4_000_000_000),
                now in 0_i64..4_000_000_000,
                write in any::<bool>(),
            ) {
                let operation = if write { FileOperation::Write } else { FileOperation::Read };
                let other = if write { FileOperation::Read } else { FileOperation::Write };
                let signature = file_signature(&path, operation, &user, &token, expiration);
                let q = query(&path, &user, Some(signature), expiration.map(|e| e.to_string()));
                let headers = HeaderMap::new();
                let result = authorize(Some(&token), &headers, &q, operation, now);
                prop_assert_eq!(result.is_ok(), expiration.is_none_or(|e| e >= now));
                prop_assert!(authorize(Some(&token), &headers, &q, other, now).is_err());
                let wrong_token = format!("{token}x");
                prop_assert!(authorize(Some(&wrong_token), &headers, &q, operation, now).is_err());
            }

            #[test]
            fn any_other_signature_is_refused(
                path in "[a-z/]{0,12}",
                token in "[A-Za-z0-9]{1,16}",
                signature in any::<String>(),
                expiration in prop::option::of(any::<String>()),
            ) {
                let parsed = expiration.as_deref().and_then(|e| e.trim().parse::<i64>().ok());
                let good = file_signature(&path, FileOperation::Read, "", &token, parsed);
                let q = query(&path, "", Some(signature.clone()), expiration);
                let result = authorize(Some(&token), &HeaderMap::new(), &q, FileOperation::Read, 0);
                match result {
                    Ok(()) => prop_assert_eq!(signature, good),
                    Err(FilesError::Unauthorized(_)) => {}
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                }
            }
        }
    }
}
