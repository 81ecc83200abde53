//! The data path: `GET /bulkhead.node.v1.Node/AgentStream` with `Connection: Upgrade`,
//! `Upgrade: bulkhead-agent`, the sandbox's handle in [`HANDLE_HEADER`](crate::HANDLE_HEADER)
//! (its `DriverHandle` message, binary protobuf, base64) and the caller's epoch in
//! [`EPOCH_HEADER`](crate::EPOCH_HEADER). The node opens the agent stream first, so a sandbox
//! that cannot be reached is a Connect error as any call's; then it answers 101 and splices the
//! upgraded connection with the agent's stream until either side ends, when both are closed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine as _;
use bulkhead_engine::driver::DriverHandle;
use bulkhead_node_proto::v1;
use hyper_util::rt::TokioIo;
use prost::Message;

use super::request::RequestError;
use super::shared::{Shared, detail_response};
use crate::wire::BASE64;
use crate::{AGENT_STREAM_PROTOCOL, EPOCH_HEADER, HANDLE_HEADER};

/// Why an upgrade request is refused before the node opens anything.
#[derive(Debug, thiserror::Error)]
enum UpgradeError {
    #[error(
        "Ask for the agent stream with `Connection: Upgrade` and `Upgrade: {AGENT_STREAM_PROTOCOL}`"
    )]
    NotAnUpgrade,
    #[error("Send the sandbox's handle in {HANDLE_HEADER} (its DriverHandle message, base64)")]
    Handle,
    #[error("{EPOCH_HEADER} is not a decimal number")]
    Epoch,
}

fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn refuse(e: UpgradeError) -> Response {
    detail_response(&v1::NodeError::new(
        v1::node_error::Code::InvalidArgument,
        &e,
    ))
}

pub(crate) async fn agent_stream(State(s): State<Arc<Shared>>, mut req: Request) -> Response {
    let upgrade =
        header(&req, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case(AGENT_STREAM_PROTOCOL));
    let connection = header(&req, "connection").is_some_and(|c| {
        c.split(',')
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
    });
    if !(upgrade && connection) {
        return refuse(UpgradeError::NotAnUpgrade);
    }
    let caller_epoch = match header(&req, EPOCH_HEADER) {
        Some(text) => match text.trim().parse::<u64>() {
            Ok(epoch) => epoch,
            Err(_) => return refuse(UpgradeError::Epoch),
        },
        None => 0,
    };
    if let Err(stale) = s.check_epoch(caller_epoch) {
        return detail_response(&stale);
    }
    let Some(message) = header(&req, HANDLE_HEADER)
        .and_then(|text| BASE64.decode(text.trim()).ok())
        .and_then(|bytes| v1::DriverHandle::decode(bytes.as_slice()).ok())
    else {
        return refuse(UpgradeError::Handle);
    };
    let handle = match DriverHandle::try_from(message) {
        Ok(h) => h,
        Err(e) => return detail_response(&Box::<v1::NodeError>::from(RequestError::from(e))),
    };
    let mut agent = match s.agents.open(&handle).await {
        Ok(stream) => stream,
        Err(e) => return detail_response(&v1::NodeError::from(&e)),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "the caller left before the agent stream was upgraded"
                );
                return;
            }
        };
        let mut caller = TokioIo::new(upgraded);
        // Each direction ends at its EOF (passed on as a shutdown); when both have, or either
        // fails, both streams are dropped here, which closes them.
        if let Err(e) = tokio::io::copy_bidirectional(&mut caller, &mut agent).await {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "an agent stream ended with an error"
            );
        }
    });
    Response::builder()
        .status(http::StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "upgrade")
        .header(http::header::UPGRADE, AGENT_STREAM_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_default()
}
