//! Conversions between the generated messages ([`crate::v1`]) and the Rust types of the driver,
//! envd and (feature `egress`) egress crates. Rust → message is `From<&T>` (or `TryFrom<&T>` for
//! types with host paths, which must be wire paths: see [`crate::paths`]); message → Rust is
//! `TryFrom<message>`, failing with a [`ConvertError`] that names the field and what to send.
//!
//! - [`driver`]: handles, specs, capabilities, checkpoint and change types, resource usage;
//! - [`error`]: `DriverError` ↔ `DriverFault`, the `NodeError` detail and its Connect code;
//! - [`agent`]: the agent's `InitRequest` and `AgentInfo`;
//! - [`egress`] (feature `egress`): `NetworkPolicy` and `EgressError`'s kind.

pub mod agent;
pub mod driver;
#[cfg(feature = "egress")]
pub mod egress;
pub mod error;

use std::path::{Path, PathBuf};

use crate::paths::{self, PathError};

pub use error::RemoteCause;

/// Why a message cannot become its Rust type (or a Rust value its message).
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{field} is missing: it is required; set it")]
    MissingField { field: &'static str },
    #[error(
        "{field} is {value}, which is not a {enum_name} value this build knows (0 is unset): send \
         one of the values node.proto lists, or upgrade this side if the peer is newer"
    )]
    UnknownEnum {
        field: &'static str,
        enum_name: &'static str,
        value: i32,
    },
    #[error("{field} is not a path relative to the node's data directory")]
    BadPath {
        field: &'static str,
        #[source]
        source: PathError,
    },
    #[error("{field} is not valid JSON: send the driver's data as JSON text")]
    BadJson {
        field: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{field} is {value}, out of range: {expected}")]
    OutOfRange {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "this NodeError is not a driver error (its code is {code}): read it as the error its code \
         names"
    )]
    NotADriverError { code: i32 },
}

/// A required message field.
pub(crate) fn required<T>(value: Option<T>, field: &'static str) -> Result<T, ConvertError> {
    value.ok_or(ConvertError::MissingField { field })
}

/// An enum field, refusing values this build does not know and the unset value 0.
pub(crate) fn known<E: TryFrom<i32>>(
    value: i32,
    field: &'static str,
    enum_name: &'static str,
) -> Result<E, ConvertError> {
    let unknown = ConvertError::UnknownEnum {
        field,
        enum_name,
        value,
    };
    if value == 0 {
        return Err(unknown);
    }
    E::try_from(value).map_err(|_| unknown)
}

/// The error for an enum field left at its unset value 0.
pub(crate) fn unset(field: &'static str, enum_name: &'static str) -> ConvertError {
    ConvertError::UnknownEnum {
        field,
        enum_name,
        value: 0,
    }
}

/// A host path for the wire: it must already be relative to the node's data directory.
pub(crate) fn wire_path(path: &Path, field: &'static str) -> Result<String, ConvertError> {
    paths::check(path)
        .map(str::to_string)
        .map_err(|source| ConvertError::BadPath { field, source })
}

/// A wire path, checked.
pub(crate) fn host_path(text: String, field: &'static str) -> Result<PathBuf, ConvertError> {
    let path = PathBuf::from(text);
    paths::check(&path).map_err(|source| ConvertError::BadPath { field, source })?;
    Ok(path)
}
