//! Checks of client input (environment, metadata, secret values, timeouts) and the opaque page
//! tokens of paged listings. Every failure is a `BadRequest` (400) that says what to change.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;

use crate::error::EngineError;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Where a page starts: after the row a `nextToken` names (none or empty: the first page).
pub(crate) fn page_after(next_token: Option<&str>) -> Result<Option<(i64, String)>> {
    match next_token {
        Some(t) if !t.is_empty() => decode_token(t).map(Some),
        _ => Ok(None),
    }
}

/// `rows` were fetched with one more than `limit`: cut them to the page and return the token of
/// the next page (none on the last), keyed by each row's (time, id).
pub(crate) fn page_end<T>(
    rows: &mut Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> (i64, &str),
) -> Option<String> {
    if rows.len() <= limit {
        return None;
    }
    rows.truncate(limit);
    rows.last().map(|r| {
        let (at, id) = key(r);
        encode_token(at, id)
    })
}

pub(crate) fn encode_token(started_at: i64, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{started_at}:{id}"))
}

pub(crate) fn decode_token(t: &str) -> Result<(i64, String)> {
    let bad = || {
        EngineError::BadRequest(
            "Invalid nextToken: pass the X-Next-Token of the previous page".into(),
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .map_err(|_| bad())?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let (ts, id) = s.split_once(':').ok_or_else(bad)?;
    Ok((ts.parse().map_err(|_| bad())?, id.to_string()))
}

pub(crate) fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(EngineError::BadRequest(format!(
                "Invalid environment variable name {k:?}: names must be non-empty and contain no '=' or NUL"
            )));
        }
    }
    if env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > 1 << 20 {
        return Err(EngineError::BadRequest(
            "Environment variables exceed 1 MiB in total".into(),
        ));
    }
    Ok(())
}

pub(crate) fn validate_secret_value(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > 64 * 1024 || value.contains(['\r', '\n', '\0']) {
        return Err(EngineError::BadRequest(
            "Secret value must be 1 byte to 64 KiB without CR, LF or NUL (it is sent in HTTP headers)"
                .into(),
        ));
    }
    Ok(())
}

pub(crate) fn validate_metadata(md: &BTreeMap<String, String>) -> Result<()> {
    if md.len() > 256 || md.iter().any(|(k, v)| k.len() > 1024 || v.len() > 4096) {
        return Err(EngineError::BadRequest(
            "Metadata too large: at most 256 entries, keys ≤ 1 KiB and values ≤ 4 KiB".into(),
        ));
    }
    Ok(())
}

/// A TTL in seconds, checked against the server's maximum (at least one second).
pub(crate) fn check_timeout(secs: u64, max: Duration) -> Result<Duration> {
    let max = max.as_secs();
    if secs > max {
        return Err(EngineError::BadRequest(format!(
            "Timeout cannot be greater than {} hours",
            max / 3600
        )));
    }
    Ok(Duration::from_secs(secs.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let t = encode_token(1234, "abc");
        assert_eq!(decode_token(&t).unwrap(), (1234, "abc".to_string()));
        assert!(decode_token("!!!").is_err());
        assert!(
            decode_token(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("x")).is_err()
        );
    }

    #[test]
    fn env_validation() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "1".to_string());
        assert!(validate_env(&env).is_ok());
        env.insert("B=C".to_string(), "1".to_string());
        assert!(validate_env(&env).is_err());
    }
}
