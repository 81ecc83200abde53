//! The crate's public error: what went wrong while setting up or steering a sandbox's egress.

use std::path::PathBuf;

use crate::policy::PolicyError;

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("egress CA at {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("upstream trust roots: {0}")]
    Roots(String),
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error(
        "attach must be called from inside a tokio runtime (multi-threaded): the userspace stack runs on it"
    )]
    NoRuntime,
    #[error("sandbox {0} is already attached to the egress proxy; detach it first")]
    AlreadyAttached(String),
    #[error("sandbox {0} is not attached to the egress proxy")]
    NotAttached(String),
    #[error("invalid network policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("the sandbox's network link")]
    Link(#[from] bulkhead_host::link::LinkError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
