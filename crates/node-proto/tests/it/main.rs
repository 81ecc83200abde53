//! Integration tests of the node protocol, one binary:
//!
//! - [`round_trip`]: every converted type survives Rust → message → binary → message → Rust and
//!   the proto3 JSON form unchanged (proptest);
//! - [`errors`]: each `DriverError` variant does too, and `NodeError` keeps its code;
//! - [`refusals`]: unknown enum values, missing fields and bad paths give the typed
//!   `ConvertError`; `DataDir` confines paths;
//! - [`contract`]: the service has an RPC for every method of the engine's `Node` trait, and
//!   nothing else.

mod contract;
mod errors;
mod refusals;
mod round_trip;

use std::fmt::Debug;

use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `m` through the binary and the JSON form: both give it back equal. Returns the decoded one.
pub fn over_the_wire<M>(m: &M) -> M
where
    M: Message + Default + Serialize + DeserializeOwned + PartialEq + Debug,
{
    let bytes = m.encode_to_vec();
    let decoded = M::decode(bytes.as_slice()).expect("the binary form decodes");
    assert_eq!(&decoded, m, "binary round trip");
    let json = serde_json::to_string(m).expect("encodes as JSON");
    let from_json: M = serde_json::from_str(&json).expect("the JSON form decodes");
    assert_eq!(&from_json, m, "JSON round trip of {json}");
    decoded
}
