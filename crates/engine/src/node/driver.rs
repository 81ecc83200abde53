//! The isolation driver contract, re-exported from `bulkhead-driver` (where the jail and later
//! the microvm driver find it without depending on the engine), so engine modules keep using
//! `crate::node::driver::…`.

pub use bulkhead_driver::*;
