//! The control plane's part of the warm pools: demand per template (what the filler sizes
//! each pool to), each heavy template's warm checkpoint, the filler task and its wake-up. The
//! members themselves are the node's (`Node::pool_*`).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::pool::gold::PoolSources;
use crate::pool::policy::Demand;

#[derive(Default)]
pub(crate) struct PoolState {
    /// Wakes the filler (a claim, a new template).
    pub(crate) wakeup: Notify,
    /// Creates per template.
    pub(crate) demand: Mutex<HashMap<String, Demand>>,
    /// Per heavy template, the warm checkpoint its pool is restored from.
    pub(crate) sources: PoolSources,
    /// The filler, awaited on shutdown so a start in flight is not orphaned.
    pub(crate) filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
}
