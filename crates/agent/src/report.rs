//! Rendering errors as text: one line with the whole chain of causes, for logs and for the
//! messages the agent sends back (the agent's clients are the host and the SDK user, who both
//! need the innermost cause, e.g. the errno, to act on it).
//!
//! A leaf: it imports nothing from the crate, so any module may use it. The function itself is
//! `bulkhead_common::error_chain`, the one the server uses too.

pub use bulkhead_common::error_chain;
