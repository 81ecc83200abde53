//! What the `bulkhead` binary shares with the workspace's other tools (`bulkhead-bench`): the
//! small HTTP client for a running server ([`client`]) and the argument groups that say how to
//! reach it and where a server keeps its state ([`args`]).

pub mod args;
pub mod client;
