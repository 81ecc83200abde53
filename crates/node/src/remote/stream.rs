//! `impl AgentPath for RemoteNode`: a byte stream to a sandbox's agent is an HTTP/1.1 upgrade
//! of `GET /bulkhead.node.v1.Node/AgentStream` (see the server's `stream` module); the upgraded
//! connection is the stream. Refusals and the node's errors come back as for a unary call.

use async_trait::async_trait;
use base64::Engine as _;
use bulkhead_engine::AgentPath;
use bulkhead_engine::driver::{AgentStream, DriverError, DriverHandle};
use bulkhead_node_proto::v1;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use prost::Message;

use super::client::RemoteNode;
use super::error::{CallError, RemoteError};
use crate::wire::{BASE64, ErrorBody, MAX_BODY};
use crate::{AGENT_STREAM_PATH, AGENT_STREAM_PROTOCOL, EPOCH_HEADER, HANDLE_HEADER};

const METHOD: &str = "AgentStream";

impl RemoteNode {
    async fn open_stream(&self, handle: &DriverHandle) -> Result<AgentStream, CallError> {
        let message = v1::DriverHandle::from(handle).encode_to_vec();
        let request = http::Request::get(format!("{}{AGENT_STREAM_PATH}", self.base))
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, AGENT_STREAM_PROTOCOL)
            .header(http::header::AUTHORIZATION, self.auth.clone())
            .header(HANDLE_HEADER, BASE64.encode(message))
            .header(EPOCH_HEADER, self.epoch().to_string())
            .body(Full::new(Bytes::new()))
            .map_err(|_| RemoteError::BadUrl {
                url: self.base.clone(),
            })?;
        let timeout = self.cfg.call_timeout;
        let timed_out = || RemoteError::Timeout {
            node: self.base.clone(),
            method: METHOD,
            timeout,
        };
        let resp = tokio::time::timeout(timeout, self.client.request(request))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        if status == http::StatusCode::SWITCHING_PROTOCOLS {
            let upgraded = tokio::time::timeout(timeout, hyper::upgrade::on(resp))
                .await
                .map_err(|_| timed_out())?
                .map_err(|e| self.unreachable(e))?;
            return Ok(Box::new(TokioIo::new(upgraded)));
        }
        let body =
            tokio::time::timeout(timeout, Limited::new(resp.into_body(), MAX_BODY).collect())
                .await
                .map_err(|_| timed_out())?
                .map(|b| b.to_bytes())
                .unwrap_or_default();
        let error = ErrorBody::parse(status.as_u16(), &body);
        Err(match error.detail() {
            Some(detail) => CallError::Node {
                method: METHOD,
                detail: Box::new(detail),
            },
            None => RemoteError::Untyped {
                node: self.base.clone(),
                method: METHOD,
                code: error.code,
                message: error.message,
            }
            .into(),
        })
    }
}

#[async_trait]
impl AgentPath for RemoteNode {
    async fn open(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        match self.open_stream(handle).await {
            Ok(stream) => Ok(stream),
            Err(e) => {
                if e.is_stale()
                    && let Err(refresh) = self.refresh_info().await
                {
                    tracing::warn!(
                        node = %self.base,
                        error = &refresh as &dyn std::error::Error,
                        "the node's epoch changed, and its Info could not be read again"
                    );
                }
                Err(e.into_driver(&self.base))
            }
        }
    }
}
