//! One unary call: pick the codec from `Content-Type`, read the body (at most
//! [`MAX_BODY`](crate::wire::MAX_BODY)), decode the method's request, refuse a stale epoch, run
//! the handler of `methods` in its own task and answer in the request's codec
//! (or a Connect error, always JSON).

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use bulkhead_envd::Code;
use bulkhead_node_proto::v1;
use bytes::Bytes;

use super::methods as m;
use super::request;
use super::shared::{Shared, detail_response, error_response};
use crate::wire::{Codec, ErrorBody, MAX_BODY, Rpc};

pub(crate) async fn call(
    State(shared): State<Arc<Shared>>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(codec) = Codec::from_content_type(content_type) else {
        // The Connect protocol's answer to a codec the server does not speak.
        return error_response(
            415,
            &ErrorBody::plain(
                Code::Unimplemented,
                "Send the request as application/proto or application/json",
            ),
        );
    };
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(_) => {
            let body = ErrorBody::plain(
                Code::ResourceExhausted,
                format!("The request body could not be read whole (at most {MAX_BODY} bytes)"),
            );
            return error_response(body.code.http_status(), &body);
        }
    };
    let call = Call {
        shared,
        codec,
        body,
    };
    match method.as_str() {
        "Info" => call.run(m::info, false).await,
        "Owns" => call.run(m::owns, true).await,
        "Start" => call.run(m::start, true).await,
        "Claimed" => call.run(m::claimed, true).await,
        "Stop" => call.run(m::stop, true).await,
        "Wait" => call.run(m::wait, true).await,
        "Adopt" => call.run(m::adopt, true).await,
        "Usage" => call.run(m::usage, true).await,
        "Thaw" => call.run(m::thaw, true).await,
        "ReclaimOrphans" => call.run(m::reclaim_orphans, true).await,
        "InitAgent" => call.run(m::init_agent, true).await,
        "AgentInfo" => call.run(m::agent_info, true).await,
        "Reachable" => call.run(m::reachable, true).await,
        "Checkpoint" => call.run(m::checkpoint, true).await,
        "CheckpointInfo" => call.run(m::checkpoint_info, true).await,
        "RemoveCheckpoint" => call.run(m::remove_checkpoint, true).await,
        "CopyCheckpoint" => call.run(m::copy_checkpoint, true).await,
        "Restore" => call.run(m::restore, true).await,
        "Changes" => call.run(m::changes, true).await,
        "ExportChanges" => call.run(m::export_changes, true).await,
        "AttachNetwork" => call.run(m::attach_network, true).await,
        "SetNetworkPolicy" => call.run(m::set_network_policy, true).await,
        "DetachNetwork" => call.run(m::detach_network, true).await,
        "FlushAudit" => call.run(m::flush_audit, true).await,
        "PoolTake" => call.run(m::pool_take, true).await,
        "PoolPut" => call.run(m::pool_put, true).await,
        "PoolTakeSurplus" => call.run(m::pool_take_surplus, true).await,
        "PoolDrain" => call.run(m::pool_drain, true).await,
        "PoolStock" => call.run(m::pool_stock, true).await,
        "PoolMembers" => call.run(m::pool_members, true).await,
        _ => error_response(
            404,
            &ErrorBody::plain(
                Code::Unimplemented,
                format!("bulkhead.node.v1.Node has no method '{method}'"),
            ),
        ),
    }
}

struct Call {
    shared: Arc<Shared>,
    codec: Codec,
    body: Bytes,
}

impl Call {
    /// Decode, check the epoch (unless `any_epoch`), run `handler` to its end, answer.
    async fn run<R, F, Fut>(self, handler: F, check_epoch: bool) -> Response
    where
        R: Rpc,
        F: FnOnce(Arc<Shared>, R) -> Fut,
        Fut: Future<Output = Result<R::Response, Box<v1::NodeError>>> + Send + 'static,
    {
        let req: R = match self.codec.decode(&self.body) {
            Ok(req) => req,
            Err(e) => return detail_response(&request::invalid(e)),
        };
        if check_epoch {
            let caller = req.context().map_or(0, |c| c.node_epoch);
            if let Err(stale) = self.shared.check_epoch(caller) {
                return detail_response(&stale);
            }
        }
        // Its own task: a caller that hangs up does not cut a start or a checkpoint in half.
        match tokio::spawn(handler(self.shared.clone(), req)).await {
            Ok(Ok(answer)) => (
                http::StatusCode::OK,
                [(http::header::CONTENT_TYPE, self.codec.content_type())],
                Body::from(self.codec.encode(&answer)),
            )
                .into_response(),
            Ok(Err(detail)) => detail_response(&detail),
            Err(e) => {
                tracing::error!(
                    method = R::METHOD,
                    error = &e as &dyn std::error::Error,
                    "a node call panicked"
                );
                error_response(
                    500,
                    &ErrorBody::plain(
                        Code::Internal,
                        "The node failed while serving the call: see the node's log",
                    ),
                )
            }
        }
    }
}
