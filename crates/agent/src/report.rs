//! Rendering errors as text: one line with the whole chain of causes, for logs and for the
//! messages the agent sends back (the agent's clients are the host and the SDK user, who both
//! need the innermost cause, e.g. the errno, to act on it).
//!
//! A leaf: it imports nothing from the crate, so any module may use it.

/// Renders an error and its chain of sources as `outer: inner: innermost`.
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
