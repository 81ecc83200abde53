//! The node's side: [`NodeServer`] serves `bulkhead.node.v1.Node` over any engine `Node` (a
//! `LocalNode` over this machine's driver) as an axum [`Router`].
//!
//! - every RPC: `POST /bulkhead.node.v1.Node/<Method>`, unary, `application/proto` or
//!   `application/json` (`unary`, `methods`);
//! - the data path: `GET /bulkhead.node.v1.Node/AgentStream`, an HTTP/1.1 upgrade to a byte
//!   stream to a sandbox's agent (`stream`).
//!
//! Every request must carry `Authorization: Bearer <token>` with the node's token (compared in
//! constant time, as digests, so not even its length shows); any other gets a bare 401
//! `unauthenticated`, before routing, so an unauthenticated caller learns nothing (not even
//! which paths exist). Calls carry the node's epoch as the caller last read it; one that
//! differs from the node's is refused as stale (`CODE_STALE_EPOCH`, `aborted`) before anything
//! runs. Epoch 0 is a node not yet registered: it accepts any. `Info` is always answered (it is
//! how a caller learns the epoch). The sandbox generation of `CallContext` is not checked here:
//! the `Node` trait does not carry it.
//!
//! A call runs to its end in its own task even if the caller goes away (a start half-made by a
//! dropped connection would leak a sandbox); a caller that gave up just does not read the answer.
//! For the same reason a `connect-timeout-ms` header is not enforced here: the caller's own
//! deadline ends its wait, not the node's work.

mod methods;
mod request;
mod shared;
mod stream;
mod unary;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use bulkhead_engine::{AgentPath, Node};
use bulkhead_envd::Code;

use crate::wire::ErrorBody;
use shared::{Shared, error_response};

pub use shared::ServerConfig;

/// Serves `bulkhead.node.v1.Node` over a node (see the module docs).
#[derive(Clone)]
pub struct NodeServer {
    shared: Arc<Shared>,
}

impl NodeServer {
    pub fn new(node: Arc<dyn Node>, agents: Arc<dyn AgentPath>, config: ServerConfig) -> Self {
        NodeServer {
            shared: Arc::new(Shared::new(node, agents, config)),
        }
    }

    /// The node's epoch from now on (what its registration or heartbeat learned); calls made
    /// for another epoch are refused. 0: accept any.
    pub fn set_epoch(&self, epoch: u64) {
        self.shared.epoch.store(epoch, Ordering::SeqCst);
    }

    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::SeqCst)
    }

    /// The routes; serve them with `axum::serve` (which keeps HTTP/1.1 upgrades working).
    pub fn router(&self) -> Router {
        Router::new()
            .route(crate::AGENT_STREAM_PATH, get(stream::agent_stream))
            .route("/bulkhead.node.v1.Node/{method}", post(unary::call))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                authenticate,
            ))
            .with_state(self.shared.clone())
    }
}

async fn authenticate(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !shared.authorized(header) {
        return error_response(
            Code::Unauthenticated.http_status(),
            &ErrorBody::plain(
                Code::Unauthenticated,
                "Send the node's token as `Authorization: Bearer <token>`",
            ),
        );
    }
    next.run(req).await
}

async fn not_found() -> Response {
    error_response(
        404,
        &ErrorBody::plain(
            Code::Unimplemented,
            "No such route: the node serves POST /bulkhead.node.v1.Node/<Method>",
        ),
    )
}
