//! One unary call from [`RemoteNode`](super::RemoteNode): the request in binary protobuf with
//! the node's epoch, the bearer token and a deadline; the answer decoded, or the Connect error
//! read into a `CallError`.

use std::time::Duration;

use bulkhead_node_proto::v1;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;

use super::client::RemoteNode;
use super::error::{CallError, RemoteError};
use crate::wire::{CONTENT_TYPE_PROTO, ErrorBody, MAX_BODY, Rpc};

impl RemoteNode {
    /// Sends `req` (with the epoch of the cached Info) and reads its answer within `timeout`.
    /// A stale-epoch refusal refreshes the cached Info, so the next call speaks to the node's
    /// new life; the refused call is not retried (what it named may be gone).
    pub(crate) async fn call<R: Rpc>(
        &self,
        req: R,
        timeout: Duration,
    ) -> Result<R::Response, CallError> {
        let result = self.send(req, self.epoch(), timeout).await;
        if let Err(e) = &result
            && e.is_stale()
            && let Err(refresh) = self.refresh_info().await
        {
            tracing::warn!(
                node = %self.base,
                error = &refresh as &dyn std::error::Error,
                "the node's epoch changed, and its Info could not be read again"
            );
        }
        result
    }

    /// One request and its answer, at `epoch`.
    pub(crate) async fn send<R: Rpc>(
        &self,
        mut req: R,
        epoch: u64,
        timeout: Duration,
    ) -> Result<R::Response, CallError> {
        req.set_context(v1::CallContext {
            node_epoch: epoch,
            generation: 0,
        });
        let request =
            http::Request::post(format!("{}/bulkhead.node.v1.Node/{}", self.base, R::METHOD))
                .header(http::header::CONTENT_TYPE, CONTENT_TYPE_PROTO)
                .header(http::header::AUTHORIZATION, self.auth.clone())
                .header("connect-protocol-version", "1")
                .header("connect-timeout-ms", timeout.as_millis().to_string())
                .body(Full::new(Bytes::from(req.encode_to_vec())))
                .map_err(|_| RemoteError::BadUrl {
                    url: self.base.clone(),
                })?;
        let answer = async {
            let resp = self
                .client
                .request(request)
                .await
                .map_err(|e| self.unreachable(e))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| self.unreachable_boxed(e))?
                .to_bytes();
            Ok::<_, CallError>((status, body))
        };
        let (status, body) =
            tokio::time::timeout(timeout, answer)
                .await
                .map_err(|_| RemoteError::Timeout {
                    node: self.base.clone(),
                    method: R::METHOD,
                    timeout,
                })??;
        if status == http::StatusCode::OK {
            return R::Response::decode(body).map_err(|e| {
                RemoteError::Decode {
                    node: self.base.clone(),
                    method: R::METHOD,
                    source: e.into(),
                }
                .into()
            });
        }
        let error = ErrorBody::parse(status.as_u16(), &body);
        Err(match error.detail() {
            Some(detail) => CallError::Node {
                method: R::METHOD,
                detail: Box::new(detail),
            },
            None => RemoteError::Untyped {
                node: self.base.clone(),
                method: R::METHOD,
                code: error.code,
                message: error.message,
            }
            .into(),
        })
    }

    pub(crate) fn unreachable(
        &self,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> RemoteError {
        self.unreachable_boxed(Box::new(e))
    }

    fn unreachable_boxed(&self, source: Box<dyn std::error::Error + Send + Sync>) -> RemoteError {
        RemoteError::Unreachable {
            node: self.base.clone(),
            source,
        }
    }
}
