//! The Connect framing both sides share (the parts of <https://connectrpc.com/docs/protocol> a
//! unary service needs; crates/envd has the codes): the two codecs of a message, and the JSON
//! error body with its `NodeError` detail.
//!
//! A failed unary call answers, whatever the request's codec, with the HTTP status of its
//! Connect code and `Content-Type: application/json`:
//!
//! ```text
//! {"code": "failed_precondition", "message": "Sandbox is not running",
//!  "details": [{"type": "bulkhead.node.v1.NodeError", "value": "<NodeError, binary, base64>"}]}
//! ```
//!
//! `value` is standard base64 written without padding (as connect-go does); either is read.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use bulkhead_envd::Code;
use bulkhead_node_proto::v1;
use bytes::Bytes;
use prost::Message;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `Content-Type` of a binary protobuf message.
pub const CONTENT_TYPE_PROTO: &str = "application/proto";
/// `Content-Type` of a proto3 JSON message (and of every error body).
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// The `type` of the error detail every failed call carries.
pub const DETAIL_TYPE: &str = "bulkhead.node.v1.NodeError";
/// The largest request or answer body either side reads (a `ReclaimOrphans` of thousands of
/// handles is far below it).
pub const MAX_BODY: usize = 16 << 20;

/// Standard base64: written without padding, read with or without.
pub const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// How a message is written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Binary protobuf (`application/proto`): what [`crate::RemoteNode`] sends.
    Proto,
    /// proto3 JSON (`application/json`): for curl.
    Json,
}

/// Why a message body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the body is not a valid binary protobuf message")]
    Proto(#[source] prost::DecodeError),
    #[error("the body is not a valid proto3 JSON message")]
    Json(#[source] serde_json::Error),
}

impl Codec {
    /// The codec of a `Content-Type` (parameters such as `charset` are ignored); `None` for
    /// any other type.
    pub fn from_content_type(content_type: &str) -> Option<Codec> {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case(CONTENT_TYPE_PROTO) {
            Some(Codec::Proto)
        } else if essence.eq_ignore_ascii_case(CONTENT_TYPE_JSON) {
            Some(Codec::Json)
        } else {
            None
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => CONTENT_TYPE_PROTO,
            Codec::Json => CONTENT_TYPE_JSON,
        }
    }

    pub fn encode<M: Message + Serialize>(self, message: &M) -> Bytes {
        match self {
            Codec::Proto => Bytes::from(message.encode_to_vec()),
            // The generated serde impls write plain data: they cannot fail.
            Codec::Json => Bytes::from(serde_json::to_vec(message).unwrap_or_default()),
        }
    }

    pub fn decode<M: Message + Default + DeserializeOwned>(
        self,
        body: &[u8],
    ) -> Result<M, DecodeError> {
        match self {
            Codec::Proto => M::decode(body).map_err(DecodeError::Proto),
            Codec::Json => serde_json::from_slice(body).map_err(DecodeError::Json),
        }
    }
}

/// One detail of a Connect error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The message's fully qualified name.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The message, binary protobuf, base64.
    pub value: String,
}

/// The JSON body of a failed unary call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: Code,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<ErrorDetail>,
}

impl ErrorBody {
    /// An error without a detail (only auth failures and unknown routes answer one).
    pub fn plain(code: Code, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The error a node answers for `detail`: its Connect code, its message, the detail.
    pub fn from_detail(detail: &v1::NodeError) -> ErrorBody {
        ErrorBody {
            code: detail.connect_code(),
            message: detail.message.clone(),
            details: vec![ErrorDetail {
                type_name: DETAIL_TYPE.to_string(),
                value: BASE64.encode(detail.encode_to_vec()),
            }],
        }
    }

    /// The body of an error answer: the Connect error it holds or, when it holds none (a
    /// proxy's error page), the code its HTTP status implies.
    pub fn parse(status: u16, body: &[u8]) -> ErrorBody {
        serde_json::from_slice(body).unwrap_or_else(|_| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let message = if text.is_empty() {
                format!("HTTP status {status}")
            } else {
                // A proxy's page can be long; the start says what it is.
                let cut: String = text.chars().take(200).collect();
                format!("HTTP status {status}: {cut}")
            };
            ErrorBody::plain(Code::from_http_status(status), message)
        })
    }

    /// The `NodeError` detail, when there is one that decodes.
    pub fn detail(&self) -> Option<v1::NodeError> {
        self.details
            .iter()
            .filter(|d| d.type_name == DETAIL_TYPE)
            .find_map(|d| {
                let bytes = BASE64.decode(d.value.trim()).ok()?;
                v1::NodeError::decode(bytes.as_slice()).ok()
            })
    }

    pub fn to_json(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// A request of the service: each starts with its `CallContext`.
pub trait Rpc: Message + Default + Serialize + DeserializeOwned + Send + 'static {
    /// The method's name (the last part of its path).
    const METHOD: &'static str;
    /// Its answer.
    type Response: Message + Default + Serialize + DeserializeOwned + Send + 'static;

    fn context(&self) -> Option<&v1::CallContext>;
    fn set_context(&mut self, context: v1::CallContext);
}

macro_rules! rpcs {
    ($($method:literal: $req:ident => $resp:ident),* $(,)?) => {$(
        impl Rpc for v1::$req {
            const METHOD: &'static str = $method;
            type Response = v1::$resp;

            fn context(&self) -> Option<&v1::CallContext> {
                self.context.as_ref()
            }

            fn set_context(&mut self, context: v1::CallContext) {
                self.context = Some(context);
            }
        }
    )*};
}

rpcs! {
    "Info": InfoRequest => InfoResponse,
    "Owns": OwnsRequest => OwnsResponse,
    "Start": StartRequest => StartResponse,
    "Claimed": ClaimedRequest => ClaimedResponse,
    "Stop": StopRequest => StopResponse,
    "Wait": WaitRequest => WaitResponse,
    "Adopt": AdoptRequest => AdoptResponse,
    "Usage": UsageRequest => UsageResponse,
    "Thaw": ThawRequest => ThawResponse,
    "ReclaimOrphans": ReclaimOrphansRequest => ReclaimOrphansResponse,
    "InitAgent": InitAgentRequest => InitAgentResponse,
    "AgentInfo": AgentInfoRequest => AgentInfoResponse,
    "Reachable": ReachableRequest => ReachableResponse,
    "Checkpoint": CheckpointRequest => CheckpointResponse,
    "CheckpointInfo": CheckpointInfoRequest => CheckpointInfoResponse,
    "RemoveCheckpoint": RemoveCheckpointRequest => RemoveCheckpointResponse,
    "CopyCheckpoint": CopyCheckpointRequest => CopyCheckpointResponse,
    "Restore": RestoreRequest => RestoreResponse,
    "Changes": ChangesRequest => ChangesResponse,
    "ExportChanges": ExportChangesRequest => ExportChangesResponse,
    "AttachNetwork": AttachNetworkRequest => AttachNetworkResponse,
    "SetNetworkPolicy": SetNetworkPolicyRequest => SetNetworkPolicyResponse,
    "DetachNetwork": DetachNetworkRequest => DetachNetworkResponse,
    "FlushAudit": FlushAuditRequest => FlushAuditResponse,
    "PoolTake": PoolTakeRequest => PoolTakeResponse,
    "PoolPut": PoolPutRequest => PoolPutResponse,
    "PoolTakeSurplus": PoolTakeSurplusRequest => PoolTakeSurplusResponse,
    "PoolDrain": PoolDrainRequest => PoolDrainResponse,
    "PoolStock": PoolStockRequest => PoolStockResponse,
    "PoolMembers": PoolMembersRequest => PoolMembersResponse,
}
