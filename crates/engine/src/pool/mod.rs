//! Warm pools: how big each template's pool should be (`policy`), where members come from
//! (`source`, `gold`: cold starts or a warm checkpoint) and the filler that keeps them stocked.

pub(crate) mod filler;
pub(crate) mod gold;
pub(crate) mod policy;
pub(crate) mod source;
pub(crate) mod state;
