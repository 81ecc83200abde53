//! `NetworkError` ↔ its detail, and the plain `DriverError` of a `CODE_DRIVER` detail.

use bulkhead_engine::NetworkError;
use bulkhead_engine::driver::DriverError;
use bulkhead_node_proto::v1;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;

use super::egress;
use super::fault::{DetailError, driver_of};

/// The detail of a failed network call.
pub fn network_detail(e: &NetworkError) -> v1::NodeError {
    match e {
        NetworkError::NoProxy => v1::NodeError::new(NodeCode::NetworkNoProxy, e),
        NetworkError::Link(driver) => v1::NodeError {
            driver: Some(driver.into()),
            ..v1::NodeError::new(NodeCode::NetworkLink, e)
        },
        NetworkError::Proxy(egress) => v1::NodeError {
            egress: v1::EgressErrorKind::from(egress).into(),
            ..v1::NodeError::new(NodeCode::NetworkProxy, e)
        },
    }
}

/// The `NetworkError` a detail describes.
pub fn network_error(mut detail: v1::NodeError) -> Result<NetworkError, DetailError> {
    match detail.code() {
        NodeCode::NetworkNoProxy => Ok(NetworkError::NoProxy),
        NodeCode::NetworkLink => Ok(NetworkError::Link(driver_of(&mut detail)?)),
        NodeCode::NetworkProxy => {
            // An unknown kind (a newer node) still carries its messages.
            let kind = v1::EgressErrorKind::try_from(detail.egress)
                .unwrap_or(v1::EgressErrorKind::Unspecified);
            Ok(NetworkError::Proxy(egress::rebuild(kind, detail.causes)?))
        }
        _ => Err(DetailError::WrongCode {
            code: detail.code,
            expected: "the network codes",
        }),
    }
}

/// The `DriverError` of a `CODE_DRIVER` detail.
pub fn driver_error(mut detail: v1::NodeError) -> Result<DriverError, DetailError> {
    match detail.code() {
        NodeCode::Driver => driver_of(&mut detail),
        _ => Err(DetailError::WrongCode {
            code: detail.code,
            expected: "CODE_DRIVER",
        }),
    }
}
