//! What a node says about itself in every heartbeat: capacity, what it has promised, its warm
//! pools and cached templates, and what its checkpoints depend on. Stored as JSON in the node's
//! row (fields may be added; an older reader ignores them, a newer one defaults them).

use std::collections::{BTreeMap, BTreeSet};

use bulkhead_store::{NodeRow, NodeStatus as StoreStatus};
use serde::{Deserialize, Serialize};

use super::placement::{NodeLoad, NodeStatus};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeReport {
    /// Bulkhead's version on the node.
    pub version: String,
    /// Its driver (`jail`, `microvm`, `fake`).
    pub driver: String,
    /// vCPUs and memory it offers to sandboxes.
    pub cpus: f64,
    pub memory_mib: u64,
    /// Promised to running sandboxes.
    pub cpu_allocated: f64,
    pub memory_allocated_mib: u64,
    /// Measured CPU use, in vCPUs.
    pub cpu_used: f64,
    /// Sandboxes running.
    pub sandboxes: u64,
    /// Creates in progress on it (its own admission counts them).
    pub starts_in_flight: u64,
    /// Warm pool members per template.
    pub warm: BTreeMap<String, u32>,
    /// Templates whose built tree is in its cache.
    pub cached: BTreeSet<String>,
    /// What a memory checkpoint written there depends on; None where checkpoints are not
    /// supported.
    pub checkpoint_key: Option<String>,
    /// It runs an egress proxy (sandboxes there may have network access).
    pub egress: bool,
}

impl NodeReport {
    /// Reads a stored report; an unreadable one counts as a node that offers nothing (it is
    /// never chosen) rather than failing the listing it is in.
    pub fn from_json(v: &serde_json::Value) -> NodeReport {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a report is plain data")
    }

    /// The node as placement sees it.
    pub fn load(&self, id: &str, status: NodeStatus) -> NodeLoad {
        NodeLoad {
            id: id.to_string(),
            status,
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            cpu_allocated: self.cpu_allocated,
            memory_allocated_mib: self.memory_allocated_mib,
            // What replicas placed since this report, they count themselves (`reserve`).
            cpu_in_flight: 0.0,
            memory_in_flight_mib: 0,
            cpu_used: self.cpu_used,
            warm: self.warm.clone(),
            cached: self.cached.clone(),
            checkpoint_key: self.checkpoint_key.clone(),
        }
    }
}

impl From<StoreStatus> for NodeStatus {
    fn from(s: StoreStatus) -> Self {
        match s {
            StoreStatus::Ready => NodeStatus::Ready,
            StoreStatus::Draining => NodeStatus::Draining,
            StoreStatus::Suspect => NodeStatus::Suspect,
            StoreStatus::Dead => NodeStatus::Dead,
        }
    }
}

/// Every registered node as placement sees it.
pub fn loads(rows: &[NodeRow]) -> Vec<NodeLoad> {
    rows.iter()
        .map(|r| NodeReport::from_json(&r.report).load(&r.id, r.status.into()))
        .collect()
}
