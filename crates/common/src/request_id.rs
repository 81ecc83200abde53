//! Request ids: one per API request, taken from a client's `X-Request-Id` when it is sane, else
//! generated; carried in tracing spans (so every log line of the request names it) and sent to
//! the sandbox's agent on the calls the request causes, where the agent logs it too.
//!
//! The id travels inside the server as a task-local ([`scope`]/[`current`]), so the engine's
//! agent calls pick it up without every verb taking a parameter. Work moved to another task
//! (`tokio::spawn`) does not carry it unless wrapped in [`scope`] again.

use std::future::Future;

/// The header on requests and responses (HTTP header names are case-insensitive).
pub const HEADER: &str = "x-request-id";

/// Longest client id accepted; longer ones are replaced (they would bloat every log line).
pub const MAX_LEN: usize = 128;

tokio::task_local! {
    static CURRENT: String;
}

/// A client's id if it is safe to log and echo: 1 to [`MAX_LEN`] characters of
/// `A-Za-z0-9-_.:` (covers UUIDs, ULIDs and most tracing ids; nothing that could forge a log
/// line or a header).
pub fn accept(candidate: &str) -> Option<&str> {
    let ok = !candidate.is_empty()
        && candidate.len() <= MAX_LEN
        && candidate
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    ok.then_some(candidate)
}

/// A new random id: 16 hex digits.
pub fn generate() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The client's id if [`accept`]ed, else a new one.
pub fn accept_or_generate(candidate: Option<&str>) -> String {
    candidate
        .and_then(accept)
        .map_or_else(generate, str::to_owned)
}

/// Runs `fut` with `id` as the current request id.
pub async fn scope<F: Future>(id: String, fut: F) -> F::Output {
    CURRENT.scope(id, fut).await
}

/// `fut` with the current request id (if any), for handing to `tokio::spawn`: a spawned task
/// does not inherit task-locals.
pub fn propagate<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    let id = current();
    async move {
        match id {
            Some(id) => scope(id, fut).await,
            None => fut.await,
        }
    }
}

/// The id of the request this task is serving, if any.
pub fn current() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_sane_ids_only() {
        assert_eq!(accept("abc-123_X.y:z"), Some("abc-123_X.y:z"));
        assert_eq!(accept(&"a".repeat(MAX_LEN)).map(str::len), Some(MAX_LEN));
        for bad in [
            "",
            "a b",
            "a\nb",
            "é",
            "a/b",
            "<script>",
            &"a".repeat(MAX_LEN + 1),
        ] {
            assert_eq!(accept(bad), None, "{bad:?}");
        }
        assert_eq!(accept_or_generate(Some("bad id")).len(), 16);
        assert_ne!(generate(), generate());
    }

    #[tokio::test]
    async fn scope_sets_current() {
        assert_eq!(current(), None);
        let seen = scope("r1".into(), async { current() }).await;
        assert_eq!(seen.as_deref(), Some("r1"));
        let spawned = scope("r2".into(), async {
            tokio::spawn(propagate(async { current() })).await.unwrap()
        })
        .await;
        assert_eq!(spawned.as_deref(), Some("r2"));
    }
}
