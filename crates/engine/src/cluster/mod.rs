//! A cluster's control-plane logic over the store's shared state: what a node reports about
//! itself ([`report`]), the node-side heartbeat that registers and re-registers it
//! ([`heartbeat`]), the one-owner sweep that marks silent nodes suspect and then dead under a
//! lease ([`health`]), where a sandbox goes ([`placement`]), and the [`router`] that makes many
//! nodes one for the engine; on the node, the [`reconcile`]r that stops what the cluster gave
//! up on or what ran past its deadline; among API [`replicas`], who drives each sandbox, the
//! forwarding decision and the take-over of a silent replica's sandboxes. PostgreSQL is the only shared state: nodes push a heartbeat every
//! second; no replica polls nodes.

pub mod health;
pub mod heartbeat;
mod local;
pub mod placement;
pub mod reconcile;
pub mod replicas;
pub mod report;
pub mod router;

pub use health::{HealthConfig, HealthSweeper, Sweep};
pub use heartbeat::{Beat, Heartbeat};
pub use reconcile::{ReconcileConfig, Reconciled, Reconciler};
pub use replicas::{Membership, ReplicaError, Route};
pub use report::NodeReport;
pub use router::{
    ClusterNode, Member, NodeDirectory, StaticDirectory, StaticMember, StoreDirectory,
};
