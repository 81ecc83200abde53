//! What the conversions of this module share: why a detail cannot become an error, and the
//! pieces of a detail every error reads (its driver fault, its chain of causes). A leaf.

use bulkhead_engine::driver::DriverError;
use bulkhead_node_proto::ConvertError;
use bulkhead_node_proto::convert::RemoteCause;
use bulkhead_node_proto::v1;

/// Why a `NodeError` detail cannot become the error a method returns.
#[derive(Debug, thiserror::Error)]
pub enum DetailError {
    #[error("the node answered error code {code}, which is not one of {expected}")]
    WrongCode { code: i32, expected: &'static str },
    #[error("the node's error detail is malformed")]
    Convert(#[from] ConvertError),
    #[error("the node's error detail has no {field}")]
    Missing { field: &'static str },
}

/// The `DriverError` of a `CODE_DRIVER`, `CODE_NETWORK_LINK` or `CODE_AGENT_REACH` detail.
pub(crate) fn driver_of(detail: &mut v1::NodeError) -> Result<DriverError, DetailError> {
    let fault = detail.driver.take().ok_or(DetailError::Missing {
        field: "NodeError.driver",
    })?;
    Ok(DriverError::try_from(fault)?)
}

/// The chain of `causes`, which must not be empty.
pub(crate) fn cause_chain(
    causes: Vec<String>,
    field: &'static str,
) -> Result<RemoteCause, DetailError> {
    RemoteCause::chain(causes).ok_or(DetailError::Missing { field })
}
