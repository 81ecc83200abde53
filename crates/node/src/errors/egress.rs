//! The egress proxy's error (`NetworkError::Proxy`) from its kind and its messages.
//!
//! The detail carries the variant (`EgressErrorKind`) and the messages: the error's own, then
//! its causes'. The variants whose fields are text come back exact (`Ca`, `Roots`, `NoRuntime`,
//! `AlreadyAttached`, `NotAttached`; `Io` too, its `io::Error` an OS error by number or else a
//! chain of messages of kind `Other`). `Tls`, `Policy` and `Link` hold typed errors of rustls,
//! the policy parser and the host's link code that no text rebuilds: they come back as an
//! `Io` variant holding the same messages, so the error reads the same (message and chain) but
//! is not that variant. Nothing in the engine tells those variants apart.

use std::io;

use bulkhead_egress::EgressError;
use bulkhead_node_proto::convert::RemoteCause;
use bulkhead_node_proto::v1::EgressErrorKind as Kind;

use super::fault::DetailError;

/// The `EgressError` of kind `kind` whose message and causes are `messages`.
pub fn rebuild(kind: Kind, messages: Vec<String>) -> Result<EgressError, DetailError> {
    let Some(text) = messages.first() else {
        return Err(DetailError::Missing {
            field: "NodeError.causes (the egress error's message)",
        });
    };
    let exact = match kind {
        Kind::Ca => text
            .strip_prefix("egress CA at ")
            .and_then(|rest| rest.split_once(": "))
            .map(|(path, message)| EgressError::Ca {
                path: path.into(),
                message: message.to_string(),
            }),
        Kind::Roots => text
            .strip_prefix("upstream trust roots: ")
            .map(|roots| EgressError::Roots(roots.to_string())),
        Kind::NoRuntime => Some(EgressError::NoRuntime),
        Kind::AlreadyAttached => sandbox_id(
            text,
            " is already attached to the egress proxy; detach it first",
        )
        .map(EgressError::AlreadyAttached),
        Kind::NotAttached => {
            sandbox_id(text, " is not attached to the egress proxy").map(EgressError::NotAttached)
        }
        // `#[error("{0}")]`: the io::Error's message is the error's own, then its causes.
        Kind::Io if messages.len() >= 2 => Some(EgressError::Io(io_error(&messages[1..]))),
        Kind::Io | Kind::Tls | Kind::Policy | Kind::Link | Kind::Unspecified => None,
    };
    // A message this build's variant would not write (a newer node's wording) reads as text.
    Ok(exact
        .filter(|e| e.to_string() == *text)
        .unwrap_or_else(|| EgressError::Io(io_error(&messages))))
}

/// The sandbox id of `sandbox <id><suffix>`.
fn sandbox_id(text: &str, suffix: &str) -> Option<String> {
    text.strip_prefix("sandbox ")?
        .strip_suffix(suffix)
        .map(str::to_string)
}

/// An `io::Error` whose message and causes are `messages` (not empty): an OS error when the one
/// message is one (`... (os error N)`, which is whole in its number), else a chain of kind
/// `Other`.
pub fn io_error(messages: &[String]) -> io::Error {
    if let [only] = messages
        && let Some(code) = only
            .strip_suffix(')')
            .and_then(|t| t.rsplit_once("(os error "))
            .and_then(|(_, n)| n.parse::<i32>().ok())
    {
        let os = io::Error::from_raw_os_error(code);
        if os.to_string() == *only {
            return os;
        }
    }
    match RemoteCause::chain(messages.iter().cloned()) {
        Some(cause) => io::Error::other(cause),
        None => io::Error::from(io::ErrorKind::Other),
    }
}
