//! Why a request is refused before the node runs anything (`CODE_INVALID_ARGUMENT`). A leaf.

use bulkhead_node_proto::paths::PathError;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;
use bulkhead_node_proto::{ConvertError, v1};

use crate::wire::DecodeError;

/// Why a request was refused before the node ran anything (`CODE_INVALID_ARGUMENT`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("The request body is not a message of the method: send its request message")]
    Decode(#[source] DecodeError),
    #[error(transparent)]
    Convert(ConvertError),
    #[error("{field} cannot be used: send a path under the node's data directory")]
    Path {
        field: &'static str,
        #[source]
        source: PathError,
    },
    #[error(
        "{field} cannot be used: send a directory under checkpoints/ of the node's data directory"
    )]
    NotCheckpoint { field: &'static str },
}

impl From<ConvertError> for RequestError {
    fn from(e: ConvertError) -> Self {
        RequestError::Convert(e)
    }
}

impl From<RequestError> for Box<v1::NodeError> {
    fn from(e: RequestError) -> Self {
        Box::new(v1::NodeError::new(NodeCode::InvalidArgument, &e))
    }
}

/// The refusal of a body that is not the method's request.
pub(crate) fn invalid(e: DecodeError) -> Box<v1::NodeError> {
    RequestError::Decode(e).into()
}
