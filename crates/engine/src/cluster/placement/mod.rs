//! Where a sandbox runs in a cluster: best-of-K sampling over the nodes that may take it (E2B's
//! placement, K = 3), each scored on what it has promised (allocated + starts in flight + the
//! request) plus part of what it measurably uses, against its capacity times an overcommit
//! ratio. A node with the template warm in its pool, or its tree in its cache, gets a bonus:
//! a claim or a cache hit costs a fraction of a cold start. Sampling instead of taking the
//! global minimum keeps replicas that decide at once from all picking the same node.
//!
//! The node's own admission has the final word: [`Placer`] yields candidates one at a time, a
//! node that refuses for capacity is skipped without counting as a failure, and other failures
//! exclude the node and count towards [`PlacementConfig::max_failures`].

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rand::Rng;
use rand::seq::{IteratorRandom, SliceRandom};

#[cfg(test)]
mod tests;

/// A node as its last report and the placements since describe it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLoad {
    pub id: String,
    pub status: NodeStatus,
    /// vCPUs and memory the node offers to sandboxes.
    pub cpus: f64,
    pub memory_mib: u64,
    /// Promised to the sandboxes it runs.
    pub cpu_allocated: f64,
    pub memory_allocated_mib: u64,
    /// Promised to starts not yet reported as running.
    pub cpu_in_flight: f64,
    pub memory_in_flight_mib: u64,
    /// Measured use, in vCPUs.
    pub cpu_used: f64,
    /// Warm pool members per template.
    pub warm: BTreeMap<String, u32>,
    /// Templates whose built tree the node has.
    pub cached: BTreeSet<String>,
    /// What a memory checkpoint written on it depends on (kernel, CRIU, CPU features, tree).
    pub checkpoint_key: Option<String>,
}

/// A node's health as the cluster sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStatus {
    Ready,
    /// Finishing what it runs; takes nothing new.
    Draining,
    /// Its heartbeat is late: no new placements until it reports again.
    Suspect,
    Dead,
}

/// What is to be placed.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub template: String,
    pub cpus: f64,
    pub memory_mib: u64,
    /// A resume from a checkpoint runs only where this key matches.
    pub checkpoint_key: Option<String>,
    /// Tried first if it may take the request (the node holding a paused sandbox's state).
    pub preferred: Option<String>,
}

/// Placement's knobs (E2B's defaults where it has them).
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementConfig {
    /// Nodes sampled per decision.
    pub k: usize,
    /// Allocated CPU may reach this multiple of a node's vCPUs.
    pub cpu_overcommit: f64,
    /// Allocated memory may reach this multiple of a node's memory (limits are caps; an idle
    /// sandbox uses a small part of its limit).
    pub memory_overcommit: f64,
    /// Weight of measured CPU use next to what is promised.
    pub usage_weight: f64,
    /// Taken off the score (a share of capacity) of a node with the template warm, or cached:
    /// such a node wins unless it is that much busier than the others.
    pub warm_bonus: f64,
    pub cached_bonus: f64,
    /// Failures other than a capacity refusal before placement gives up.
    pub max_failures: u32,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            k: 3,
            cpu_overcommit: 4.0,
            memory_overcommit: 2.0,
            usage_weight: 0.5,
            warm_bonus: 0.15,
            cached_bonus: 0.05,
            max_failures: 3,
        }
    }
}

/// Why nothing could be placed, with E2B's codes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No ready node has room.
    #[error(
        "sandbox_capacity_unavailable: no node has room for this sandbox; try again shortly or add nodes"
    )]
    CapacityUnavailable,
    /// Ready nodes exist, but none can restore this checkpoint.
    #[error(
        "sandbox_no_compatible_node: no ready node can restore this sandbox's state (it needs the same kernel, CRIU, CPU features and template tree)"
    )]
    NoCompatibleNode,
    /// Nodes failed (not refused) this many times.
    #[error(
        "sandbox_create_failed: {failures} nodes failed to start the sandbox; see the server log"
    )]
    CreateFailed { failures: u32 },
}

impl NodeLoad {
    /// Lower is better; None when the request does not fit under the overcommit ratios.
    pub fn score(&self, req: &Request, cfg: &PlacementConfig) -> Option<f64> {
        let cpu_cap = self.cpus * cfg.cpu_overcommit;
        let mem_cap = self.memory_mib as f64 * cfg.memory_overcommit;
        if cpu_cap <= 0.0 || mem_cap <= 0.0 {
            return None;
        }
        let promised_cpu = req.cpus + self.cpu_allocated + self.cpu_in_flight;
        let promised_mem =
            (req.memory_mib + self.memory_allocated_mib + self.memory_in_flight_mib) as f64;
        if promised_cpu > cpu_cap || promised_mem > mem_cap {
            return None;
        }
        let cpu = (promised_cpu + cfg.usage_weight * self.cpu_used) / cpu_cap;
        let load = cpu.max(promised_mem / mem_cap);
        let bonus = if self.warm.get(&req.template).is_some_and(|&n| n > 0) {
            cfg.warm_bonus
        } else if self.cached.contains(&req.template) {
            cfg.cached_bonus
        } else {
            0.0
        };
        Some(load - bonus)
    }

    /// Counts a placement on this node until its next report says what it runs.
    pub fn reserve(&mut self, req: &Request) {
        self.cpu_in_flight += req.cpus;
        self.memory_in_flight_mib += req.memory_mib;
        if let Some(n) = self.warm.get_mut(&req.template) {
            *n = n.saturating_sub(1);
        }
    }

    fn may_take(&self, req: &Request) -> bool {
        self.status == NodeStatus::Ready
            && (req.checkpoint_key.is_none() || req.checkpoint_key == self.checkpoint_key)
    }
}

/// One request's walk over the nodes: [`Placer::next`] names a node to try, and the caller
/// reports a refusal or a failure before asking again.
#[derive(Debug)]
pub struct Placer<'a> {
    cfg: &'a PlacementConfig,
    nodes: &'a [NodeLoad],
    req: &'a Request,
    tried: HashSet<String>,
    failures: u32,
}

impl<'a> Placer<'a> {
    pub fn new(cfg: &'a PlacementConfig, nodes: &'a [NodeLoad], req: &'a Request) -> Self {
        Placer {
            cfg,
            nodes,
            req,
            tried: HashSet::new(),
            failures: 0,
        }
    }

    /// The next node to try: the preferred one first if it may take the request and has room,
    /// else the best of K sampled among those that have.
    pub fn next(&mut self, rng: &mut impl Rng) -> Result<&'a NodeLoad, PlacementError> {
        if self.failures >= self.cfg.max_failures {
            return Err(PlacementError::CreateFailed {
                failures: self.failures,
            });
        }
        let (cfg, req) = (self.cfg, self.req);
        let open: Vec<&'a NodeLoad> = self
            .nodes
            .iter()
            .filter(|n| !self.tried.contains(&n.id) && n.may_take(req))
            .collect();
        if let Some(preferred) = &req.preferred
            && let Some(n) = open.iter().find(|n| &n.id == preferred)
            && n.score(req, cfg).is_some()
        {
            self.tried.insert(n.id.clone());
            return Ok(n);
        }
        let fits = open
            .into_iter()
            .filter_map(|n| n.score(req, cfg).map(|s| (s, n)));
        // The sample comes in the nodes' order; shuffled, a tie goes to a random one of them
        // (idle nodes score alike, and the first would otherwise take every sandbox).
        let mut sample = fits.choose_multiple(rng, cfg.k.max(1));
        sample.shuffle(rng);
        let best = sample
            .into_iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, n)| n);
        match best {
            Some(n) => {
                self.tried.insert(n.id.clone());
                Ok(n)
            }
            None => Err(self.nothing_fits()),
        }
    }

    /// The node refused for capacity (its own admission): move on, not a failure.
    pub fn refused(&mut self) {}

    /// The node failed to start it: move on and count.
    pub fn failed(&mut self) {
        self.failures += 1;
    }

    fn nothing_fits(&self) -> PlacementError {
        // Nodes failed and none is left untried: the failure is the answer. If ready nodes
        // are left but full, capacity is what stops the create (a 503 the client may retry),
        // not the node that failed.
        let untried_ready = self
            .nodes
            .iter()
            .any(|n| !self.tried.contains(&n.id) && n.may_take(self.req));
        if self.failures > 0 && !untried_ready {
            return PlacementError::CreateFailed {
                failures: self.failures,
            };
        }
        let ready = self.nodes.iter().any(|n| n.status == NodeStatus::Ready);
        let compatible = self.nodes.iter().any(|n| n.may_take(self.req));
        if ready && !compatible {
            PlacementError::NoCompatibleNode
        } else {
            PlacementError::CapacityUnavailable
        }
    }
}
