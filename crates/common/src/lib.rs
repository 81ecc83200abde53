//! The helpers every Bulkhead binary (server and agent) shares, kept in one place so there is
//! exactly one of each: how an error and its causes are rendered as text, how secrets are
//! compared, the request id that ties a request's log lines together from the API to the
//! agent, the confined walk of trees a sandbox writes ([`confined`]) and the one way to copy
//! them ([`copy`]). Depends on nothing of
//! Bulkhead's, so any crate may use it.

pub mod confined;
pub mod copy;
pub mod request_id;

/// Renders an error and its chain of sources as `outer: inner: innermost`, for logs and for the
/// messages whose reader needs the innermost cause (e.g. the errno) to act on it.
///
/// A source whose text the outer message already ends with is skipped, so `#[error(transparent)]`
/// wrappers and messages that embed their cause do not repeat it.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// Constant-time string comparison for secrets (access tokens, URL signatures, key hashes). The
/// length is not secret: the values compared have fixed lengths.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn chains_causes_without_repeating_embedded_ones() {
        let e = E(
            "outer",
            Some(Box::new(E("inner", Some(Box::new(E("errno 2", None)))))),
        );
        assert_eq!(error_chain(&e), "outer: inner: errno 2");
        let embedded = E(
            "could not open: errno 2",
            Some(Box::new(E("errno 2", None))),
        );
        assert_eq!(error_chain(&embedded), "could not open: errno 2");
    }

    #[test]
    fn compares_whole_strings() {
        assert!(constant_time_eq("tok", "tok"));
        assert!(!constant_time_eq("tok", "tok2"));
        assert!(!constant_time_eq("tok", "tox"));
        assert!(constant_time_eq("", ""));
    }
}
