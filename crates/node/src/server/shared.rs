//! What every handler reads ([`Shared`]: the node, its token, data directory and epoch) and
//! how an error is answered. A leaf.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bulkhead_engine::{AgentPath, Node};
use bulkhead_node_proto::DataDir;
use bulkhead_node_proto::v1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::wire::{CONTENT_TYPE_JSON, ErrorBody};

/// How a node serves the protocol.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The node's configured name (`InfoResponse.node_id`): stable across restarts.
    pub node_id: String,
    /// The secret every caller presents as `Authorization: Bearer <token>`. An empty token
    /// admits nobody.
    pub token: String,
    /// The root of every path on the wire (see node.proto's header).
    pub data_dir: PathBuf,
    /// The longest a `Wait` poll is held before it answers `exited: false` (a caller's
    /// `timeout_ms` is capped to it).
    pub max_wait: Duration,
}

impl ServerConfig {
    pub fn new(node_id: impl Into<String>, token: impl Into<String>, data_dir: &Path) -> Self {
        ServerConfig {
            node_id: node_id.into(),
            token: token.into(),
            data_dir: data_dir.to_path_buf(),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// What every handler reads.
pub(crate) struct Shared {
    pub(crate) node: Arc<dyn Node>,
    pub(crate) agents: Arc<dyn AgentPath>,
    pub(crate) node_id: String,
    /// SHA-256 of the token (compared in constant time with the presented token's).
    token_digest: [u8; 32],
    token_set: bool,
    pub(crate) data: DataDir,
    pub(crate) epoch: AtomicU64,
    pub(crate) max_wait: Duration,
}

impl Shared {
    pub(crate) fn new(
        node: Arc<dyn Node>,
        agents: Arc<dyn AgentPath>,
        config: ServerConfig,
    ) -> Self {
        Shared {
            node,
            agents,
            node_id: config.node_id,
            token_digest: Sha256::digest(config.token.as_bytes()).into(),
            token_set: !config.token.is_empty(),
            data: DataDir::new(config.data_dir),
            epoch: AtomicU64::new(0),
            max_wait: config.max_wait,
        }
    }

    pub(crate) fn authorized(&self, header: Option<&str>) -> bool {
        let Some(token) = header.and_then(bearer) else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let equal: bool = digest.ct_eq(&self.token_digest).into();
        equal && self.token_set && !token.is_empty()
    }

    /// Refuses a call made for another life of the node.
    pub(crate) fn check_epoch(&self, caller: u64) -> Result<(), Box<v1::NodeError>> {
        let ours = self.epoch.load(Ordering::SeqCst);
        if ours == 0 || caller == ours {
            return Ok(());
        }
        Err(Box::new(v1::NodeError::new(
            v1::node_error::Code::StaleEpoch,
            &StaleEpoch { caller, ours },
        )))
    }
}

/// The refusal of a stale call.
#[derive(Debug, thiserror::Error)]
#[error(
    "The call was made for epoch {caller} of this node, which is now at epoch {ours} (it \
     restarted): read Info again, and the handles and pools it holds now"
)]
struct StaleEpoch {
    caller: u64,
    ours: u64,
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A Connect error answer.
pub(crate) fn error_response(status: u16, body: &ErrorBody) -> Response {
    let status =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(http::header::CONTENT_TYPE, CONTENT_TYPE_JSON)],
        Body::from(body.to_json()),
    )
        .into_response()
}

/// The answer of a call that failed with `detail`.
pub(crate) fn detail_response(detail: &v1::NodeError) -> Response {
    let body = ErrorBody::from_detail(detail);
    error_response(body.code.http_status(), &body)
}
