//! Rows of a cluster's shared state (see the `nodes` and `leases` tables): the nodes that
//! register and report themselves ([`NodeRow`]), and lease rows whose epoch is a fencing token
//! ([`LeaseRow`]). Times are unix milliseconds the caller gives: the store never reads a clock
//! for these, so every replica and test decides what "now" is.

/// The lease whose holder sweeps nodes whose heartbeats stopped ([`crate::Store::sweep_nodes`]).
pub const NODE_HEALTH_LEASE: &str = "node-health";

/// A node's health as the cluster sees it. Stored as the strings of [`NodeStatus::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeStatus {
    /// Heartbeating and taking new sandboxes.
    Ready,
    /// Heartbeating, finishing what it runs, taking nothing new (set by the node itself).
    Draining,
    /// Its heartbeat is late: no new placements; it becomes ready again when it reports.
    Suspect,
    /// Its heartbeat stopped for good: its epoch was bumped, so everything its incarnation
    /// sends is refused until it registers again.
    Dead,
}

impl NodeStatus {
    pub const ALL: [NodeStatus; 4] = [
        NodeStatus::Ready,
        NodeStatus::Draining,
        NodeStatus::Suspect,
        NodeStatus::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Draining => "draining",
            NodeStatus::Suspect => "suspect",
            NodeStatus::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The statuses a node may give itself in a heartbeat (`suspect` and `dead` are the sweep's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReportedStatus {
    Ready,
    Draining,
}

impl From<ReportedStatus> for NodeStatus {
    fn from(s: ReportedStatus) -> Self {
        match s {
            ReportedStatus::Ready => NodeStatus::Ready,
            ReportedStatus::Draining => NodeStatus::Draining,
        }
    }
}

/// A node as registered and last reported.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    pub id: String,
    /// 1 at the first registration, +1 at every later one and when the sweep declares it dead:
    /// calls of an older incarnation carry an older epoch and are refused.
    pub epoch: u64,
    /// Where the control plane reaches the node.
    pub addr: String,
    pub status: NodeStatus,
    /// What the node last reported (capacity, warm pools, cached templates, …), as it sent it.
    pub report: serde_json::Value,
    /// Unix milliseconds of the registration that gave it this epoch.
    pub registered_at: i64,
    /// Unix milliseconds of its last registration or accepted heartbeat.
    pub heartbeat_at: i64,
    /// An operator asked it to drain (`bulkhead node drain`); cleared by a registration.
    pub drain: bool,
}

/// One status change made by [`crate::Store::sweep_nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTransition {
    pub id: String,
    pub from: NodeStatus,
    pub to: NodeStatus,
    /// The node's epoch after the change (bumped when it became dead).
    pub epoch: u64,
}

/// Why a sandbox of a dead node ended (its `end_reason`).
pub const NODE_LOST: &str = "node_lost";

/// What one [`crate::Store::sweep_nodes`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Status changes, by node id.
    pub changes: Vec<NodeTransition>,
    /// Sandboxes of dead nodes marked `dead` in this round, by id.
    pub lost: Vec<LostSandbox>,
}

/// A sandbox that ended because its node died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostSandbox {
    pub id: String,
    pub node: String,
}

/// A sandbox a node answers for, as the node reads it back ([`crate::Store::node_sandboxes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSandbox {
    pub id: String,
    pub state: crate::SandboxState,
    /// Unix ms.
    pub end_at: i64,
    /// Its serialised handle on the node.
    pub driver_handle: String,
    pub end_reason: Option<String>,
    /// Its TTL's end pauses it rather than killing it (E2B `autoPause`).
    pub pauses_on_timeout: bool,
}

/// Why a node's heartbeat was refused ([`crate::StoreError::StaleEpoch`]); in every case the
/// node must register again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// No node with this id is registered.
    Unknown,
    /// The node registered again since: this epoch is an older incarnation's.
    Superseded { current: u64 },
    /// The sweep declared the node dead (and bumped its epoch).
    Dead,
}

impl std::fmt::Display for StaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaleReason::Unknown => f.write_str("it is not registered"),
            StaleReason::Superseded { current } => {
                write!(f, "it registered again since (epoch {current})")
            }
            StaleReason::Dead => f.write_str("it was declared dead"),
        }
    }
}

/// A lease's epoch: +1 whenever the lease changes hands, kept while one holder renews it.
/// Written next to every change the holder makes, it fences out a holder that lost the lease
/// without knowing (a stale epoch is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseEpoch(pub u64);

impl std::fmt::Display for LeaseEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A lease as stored (see [`crate::Store::acquire_lease`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    /// Who took it last (it stays after expiry or release, so that holder keeps the epoch if it
    /// takes the lease again before anyone else does).
    pub holder: String,
    pub epoch: LeaseEpoch,
    /// Unix milliseconds; the lease is free from this instant on.
    pub expires_at: i64,
}

impl LeaseRow {
    /// Whether the lease is held at `now_ms` (before its expiry).
    pub fn is_held_at(&self, now_ms: i64) -> bool {
        now_ms < self.expires_at
    }
}

/// An API replica as registered (the `replicas` table): it drives the sandboxes whose
/// `owner_replica` is its id, and the others forward their requests to `addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: String,
    /// The URL the other replicas forward requests to (`http://host:port`).
    pub addr: String,
    /// +1 at every registration: a heartbeat of an older incarnation is refused.
    pub epoch: u64,
    /// Unix milliseconds of its last registration or accepted heartbeat.
    pub heartbeat_at: i64,
}

impl ReplicaRow {
    /// Whether it counts as running at `now_ms`: heard from within `dead_after`.
    pub fn is_live_at(&self, now_ms: i64, dead_after: std::time::Duration) -> bool {
        let ms = i64::try_from(dead_after.as_millis()).unwrap_or(i64::MAX);
        self.heartbeat_at >= now_ms.saturating_sub(ms)
    }
}

/// A sandbox's owner and state ([`crate::Store::sandbox_owners`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxOwner {
    pub id: String,
    pub owner_replica: Option<String>,
    pub state: crate::SandboxState,
}
