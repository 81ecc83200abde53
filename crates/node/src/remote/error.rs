//! How a call from [`RemoteNode`](super::RemoteNode) fails ([`RemoteError`] for its own
//! failures, `CallError` for those and the node's typed answer) and how a failure becomes the
//! error type of the trait method that made the call. A leaf.

use std::io;
use std::time::Duration;

use bulkhead_engine::driver::DriverError;
use bulkhead_engine::{AgentCallError, NetworkError};
use bulkhead_envd::Code;
use bulkhead_node_proto::v1;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;

use crate::errors;

/// The client's own failures (no answer, or an answer it cannot read).
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{url:?} is not a node URL: give http://host:port")]
    BadUrl { url: String },
    #[error("the node's token cannot be sent in a header (it has control characters)")]
    BadToken,
    #[error("The node at {node} could not be reached")]
    Unreachable {
        node: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("The node at {node} did not answer {method} within {timeout:?}")]
    Timeout {
        node: String,
        method: &'static str,
        timeout: Duration,
    },
    #[error("The node at {node} answered {method} with a body that is not its answer")]
    Decode {
        node: String,
        method: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("The node at {node} failed {method} ({code}): {message}")]
    Untyped {
        node: String,
        method: &'static str,
        code: Code,
        message: String,
    },
    #[error("The node at {node} refused {method}: {message}")]
    Refused {
        node: String,
        method: &'static str,
        message: String,
    },
    #[error("The path cannot be sent to the node")]
    Path(#[from] super::paths::PathMapError),
}

impl RemoteError {
    /// The `io::ErrorKind` closest to the failure (for the untyped `DriverError::Io` it
    /// becomes).
    fn kind(&self) -> io::ErrorKind {
        match self {
            RemoteError::BadUrl { .. } | RemoteError::BadToken | RemoteError::Path(_) => {
                io::ErrorKind::InvalidInput
            }
            RemoteError::Unreachable { .. } => io::ErrorKind::ConnectionRefused,
            RemoteError::Timeout { .. } => io::ErrorKind::TimedOut,
            RemoteError::Decode { .. } => io::ErrorKind::InvalidData,
            RemoteError::Refused { .. } => io::ErrorKind::InvalidInput,
            RemoteError::Untyped { code, .. } => match code {
                Code::NotFound => io::ErrorKind::NotFound,
                Code::AlreadyExists => io::ErrorKind::AlreadyExists,
                Code::PermissionDenied | Code::Unauthenticated => io::ErrorKind::PermissionDenied,
                Code::InvalidArgument | Code::OutOfRange => io::ErrorKind::InvalidInput,
                Code::DeadlineExceeded => io::ErrorKind::TimedOut,
                Code::Unavailable => io::ErrorKind::ConnectionRefused,
                Code::Unimplemented => io::ErrorKind::Unsupported,
                Code::ResourceExhausted => io::ErrorKind::QuotaExceeded,
                Code::Canceled => io::ErrorKind::Interrupted,
                _ => io::ErrorKind::Other,
            },
        }
    }
}

/// How a call failed: the node's typed detail, or something else.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The node answered the error it saw (its `NodeError` detail).
    Node {
        method: &'static str,
        detail: Box<v1::NodeError>,
    },
    /// No typed answer.
    Remote(RemoteError),
}

impl From<RemoteError> for CallError {
    fn from(e: RemoteError) -> Self {
        CallError::Remote(e)
    }
}

impl CallError {
    /// An untyped failure: the node's detail did not name an error of the method (a refusal:
    /// stale, invalid argument) or there was none.
    fn untyped(self, node: &str) -> RemoteError {
        match self {
            CallError::Remote(e) => e,
            CallError::Node { method, detail } => match detail.code() {
                NodeCode::StaleEpoch | NodeCode::StaleGeneration | NodeCode::InvalidArgument => {
                    RemoteError::Refused {
                        node: node.to_string(),
                        method,
                        message: RemoteMessage(&detail).to_string(),
                    }
                }
                _ => RemoteError::Untyped {
                    node: node.to_string(),
                    method,
                    code: detail.connect_code(),
                    message: detail.message.clone(),
                },
            },
        }
    }

    /// The failure as a `DriverError`: the node's own, or an untyped `Io` error saying which
    /// call failed.
    pub(crate) fn into_driver(self, node: &str) -> DriverError {
        if let CallError::Node { detail, .. } = &self
            && detail.code() == NodeCode::Driver
            && let Ok(e) = errors::driver_error((**detail).clone())
        {
            return e;
        }
        let e = self.untyped(node);
        DriverError::io(
            "A call to the sandbox's node failed",
            io::Error::new(e.kind(), e),
        )
    }

    pub(crate) fn into_network(self, node: &str) -> NetworkError {
        if let CallError::Node { detail, .. } = &self
            && matches!(
                detail.code(),
                NodeCode::NetworkNoProxy | NodeCode::NetworkLink | NodeCode::NetworkProxy
            )
            && let Ok(e) = errors::network_error((**detail).clone())
        {
            return e;
        }
        NetworkError::Link(self.into_driver(node))
    }

    pub(crate) fn into_agent_call(self, node: &str) -> AgentCallError {
        if let CallError::Node { detail, .. } = &self
            && let Ok(e) = errors::agent_call_error((**detail).clone())
        {
            return e;
        }
        AgentCallError::Reach(self.into_driver(node))
    }

    /// The failure as the client's own error (the node's detail by its code and message).
    pub(crate) fn into_remote(self, node: &str) -> RemoteError {
        match self {
            CallError::Remote(e) => e,
            CallError::Node { method, detail } => RemoteError::Untyped {
                node: node.to_string(),
                method,
                code: detail.connect_code(),
                message: detail.message.clone(),
            },
        }
    }

    pub(crate) fn is_stale(&self) -> bool {
        matches!(self, CallError::Node { detail, .. } if detail.code() == NodeCode::StaleEpoch)
    }
}

/// A detail's message and its causes, joined (for a refusal's text).
struct RemoteMessage<'a>(&'a v1::NodeError);

impl std::fmt::Display for RemoteMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)?;
        for cause in &self.0.causes {
            if !self.0.message.ends_with(cause.as_str()) {
                write!(f, ": {cause}")?;
            }
        }
        Ok(())
    }
}
