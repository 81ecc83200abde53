//! [`ClusterNode`]: one [`Node`] made of many, so that the engine runs sandboxes across machines
//! without knowing it. It places each start with best-of-K [`placement`](super::placement) over
//! the members a [`NodeDirectory`] names, tags every handle a member returns with that member's
//! id (`DriverHandle::node`), and sends every later call about the sandbox there. Members never
//! read the tag. A handle without one, or naming a member the directory no longer lists, is a
//! sandbox that has gone: [`DriverError::NotRunning`], as a node answers for a handle it does
//! not own.
//!
//! What goes where:
//! - **starts** are placed: a capacity refusal by the member's own admission
//!   ([`StartError::NoFreeSlot`], or [`DriverError::NoCapacity`] from a member that is itself a
//!   router) moves on to the next node without counting; other failures count towards
//!   [`PlacementConfig::max_failures`] and, once placement gives up, the last one is returned.
//!   When no node can take it, [`DriverError::NoCapacity`] (the API's 503
//!   `sandbox_capacity_unavailable`).
//! - **checkpoints** stay on the node that wrote them: the router remembers each directory's
//!   node (and asks the members when it does not know, after a restart), and a restore runs
//!   there or nowhere. Moving a checkpoint to another node (object storage, a compatible
//!   kernel, CRIU and CPU) is a later issue; until then a full or draining holder answers
//!   `NoCapacity`.
//! - **warm pools** are per node: a claim takes from a member with stock, chosen by
//!   placement's warm bonus; the pool's other verbs gather from every member.
//! - **network links** follow the sandbox's handle; the router remembers which member holds
//!   each sandbox's link, and asks all of them when it does not know.
//! - the **per-node questions** (`driver_name`, `capabilities`, `has_egress`,
//!   `checkpoint_key`) are answered for the cluster as a whole, since the engine asks them
//!   without naming a sandbox: the capabilities every member has (a cluster mixing a node that
//!   checkpoints with one that does not, does not pause), egress only if every member has it,
//!   a checkpoint key only if every member has the same one, and the members' driver names
//!   joined with `+` when they differ.
//!
//! Between the directory's answers the router counts its own placements on top of the loads
//! it was given ([`NodeLoad::reserve`]; see `ledger`).

mod directory;
mod ledger;
mod node;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::placement::{NodeLoad, NodeStatus, PlacementConfig, PlacementError, Placer, Request};
use crate::node::driver::{AgentStream, DriverError, DriverHandle, SandboxSpec, StartError};
use crate::node::{AgentPath, Node};
pub use directory::{
    ClientFactory, Member, NodeDirectory, StaticDirectory, StaticMember, StoreDirectory,
};
use ledger::Ledger;

/// How many times one placement starts over because a node it was starting on was lost.
const MAX_LOST: usize = 3;

pub struct ClusterNode {
    directory: Arc<dyn NodeDirectory>,
    cfg: PlacementConfig,
    view: Mutex<View>,
    ledger: Ledger,
    /// Checkpoint directory → the member holding it, until it is removed (a snapshot's stays,
    /// a path and an id, for as long as the router runs).
    checkpoints: Mutex<HashMap<PathBuf, String>>,
    /// Sandbox id → the member holding its network link.
    links: Mutex<HashMap<String, String>>,
    /// Member id → cancelled when the directory stops listing it as alive (dead, or gone), so
    /// that a start in flight there moves on instead of waiting out a node that will not
    /// answer (see `place`).
    alive: Mutex<HashMap<String, CancellationToken>>,
}

/// The directory's last answer.
struct View {
    members: Arc<[Member]>,
    at: Option<Instant>,
}

/// A member to send a call to.
struct Route {
    id: String,
    node: Arc<dyn Node>,
    agents: Arc<dyn AgentPath>,
}

/// Which members may take a placement.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Any,
    /// Any, for a warm pool member: a node's warm stock is no reason to add to it (each
    /// claim takes from the node with stock, so pools that follow their stock end up on one
    /// node, which then takes every create).
    Pool,
    /// Only this one: it holds the checkpoint to restore.
    Holder(&'a str),
}

impl ClusterNode {
    /// A router over `directory`'s members (asked once now, so that the per-node questions
    /// have answers before the first placement).
    pub async fn new(directory: Arc<dyn NodeDirectory>, cfg: PlacementConfig) -> Arc<Self> {
        let router = ClusterNode {
            directory,
            cfg,
            view: Mutex::new(View {
                members: Arc::from(Vec::new()),
                at: None,
            }),
            ledger: Ledger::default(),
            checkpoints: Mutex::new(HashMap::new()),
            links: Mutex::new(HashMap::new()),
            alive: Mutex::new(HashMap::new()),
        };
        router.refresh().await;
        Arc::new(router)
    }

    /// Ask the directory again.
    pub async fn refresh(&self) -> Arc<[Member]> {
        let members: Arc<[Member]> = Arc::from(self.directory.members().await);
        self.alive.lock().expect("alive lock").retain(|id, token| {
            let listed = members
                .iter()
                .any(|m| &m.id == id && m.load.status != NodeStatus::Dead);
            if !listed {
                tracing::warn!(node = %id, "node left the cluster: calls in flight there give up");
                token.cancel();
            }
            listed
        });
        let mut view = self.view.lock().expect("view lock");
        view.members = members.clone();
        view.at = Some(Instant::now());
        self.ledger.refreshed();
        members
    }

    /// Cancelled once the directory no longer lists `member` as alive.
    fn lost(&self, member: &str) -> CancellationToken {
        self.alive
            .lock()
            .expect("alive lock")
            .entry(member.to_string())
            .or_default()
            .clone()
    }

    /// The members as the directory last named them.
    pub fn members(&self) -> Arc<[Member]> {
        self.view.lock().expect("view lock").members.clone()
    }

    /// The members, asking the directory again if its answer is older than it allows.
    async fn current(&self) -> Arc<[Member]> {
        let stale = {
            let view = self.view.lock().expect("view lock");
            view.at
                .is_none_or(|at| at.elapsed() >= self.directory.refresh_every())
        };
        if stale {
            self.refresh().await
        } else {
            self.members()
        }
    }

    /// Each member's load with what this router placed since the directory answered.
    fn loads(&self, members: &[Member]) -> Vec<NodeLoad> {
        let mut loads: Vec<NodeLoad> = members.iter().map(|m| m.load.clone()).collect();
        self.ledger
            .apply(&mut loads, self.directory.self_reported());
        loads
    }

    fn route_to(&self, id: &str) -> Option<Route> {
        self.members().iter().find(|m| m.id == id).map(|m| Route {
            id: m.id.clone(),
            node: m.node.clone(),
            agents: m.agents.clone(),
        })
    }

    /// The member that runs `h`; a handle naming none of them is a sandbox that has gone.
    fn route(&self, h: &DriverHandle) -> Result<Route, DriverError> {
        let route = h.node.as_deref().and_then(|id| self.route_to(id));
        if route.is_none() {
            tracing::debug!(node = ?h.node, pid = h.pid, "a handle of no member of the cluster: gone");
        }
        route.ok_or(DriverError::NotRunning)
    }

    /// Place `req` and run `attempt` on the chosen member, moving on as placement says.
    async fn place<F, Fut>(
        &self,
        req: &Request,
        scope: Scope<'_>,
        mut attempt: F,
    ) -> Result<DriverHandle, DriverError>
    where
        F: FnMut(Arc<dyn Node>) -> Fut,
        Fut: Future<Output = Result<DriverHandle, DriverError>>,
    {
        let mut last_failure = None;
        // A member lost mid-start means the directory changed: plan again over its new answer
        // (a bounded number of times).
        for _ in 0..=MAX_LOST {
            let members = self.current().await;
            let mut loads = self.loads(&members);
            match scope {
                Scope::Holder(id) => loads.retain(|l| l.id == id),
                Scope::Pool => {
                    for l in &mut loads {
                        l.warm.remove(&req.template);
                    }
                }
                Scope::Any => {}
            }
            let mut placer = Placer::new(&self.cfg, &loads, req);
            loop {
                let chosen = placer.next(&mut rand::rng());
                let load = match chosen {
                    Ok(load) => load,
                    Err(e) => return Err(gave_up(e, &scope, last_failure)),
                };
                let Some(member) = members.iter().find(|m| m.id == load.id) else {
                    placer.refused();
                    continue;
                };
                let ticket = Reservation {
                    ledger: &self.ledger,
                    ticket: Some(self.ledger.reserve(&member.id, req)),
                };
                let lost = self.lost(&member.id);
                // A node declared dead (or gone) while it starts the sandbox will not answer
                // in time: move on. If it ever finishes, the sandbox is nobody's and the node
                // stops it when it registers again (see `reconcile`).
                let outcome = tokio::select! {
                    done = attempt(member.node.clone()) => done,
                    () = lost.cancelled() => {
                        drop(ticket);
                        tracing::warn!(node = %member.id, template = %req.template, "node lost while starting a sandbox; placing it again");
                        last_failure = Some(DriverError::io(
                            format!("node {} was lost while starting the sandbox", member.id),
                            std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
                        ));
                        break;
                    }
                };
                match outcome {
                    Ok(mut h) => {
                        h.node = Some(member.id.clone());
                        ticket.started(&h);
                        tracing::debug!(node = %member.id, template = %req.template, "placed");
                        return Ok(h);
                    }
                    Err(e) if is_refusal(&e) => {
                        drop(ticket);
                        tracing::info!(node = %member.id, template = %req.template, error = &e as &dyn std::error::Error, "node refused the sandbox for capacity; trying another");
                        placer.refused();
                    }
                    Err(e) => {
                        drop(ticket);
                        tracing::warn!(node = %member.id, template = %req.template, error = &e as &dyn std::error::Error, "node failed to start the sandbox; trying another");
                        placer.failed();
                        last_failure = Some(e);
                    }
                }
            }
        }
        Err(last_failure.unwrap_or_else(|| DriverError::NoCapacity {
            reason: "nodes kept leaving the cluster during the start; try again".to_string(),
        }))
    }

    /// Take a warm member of `template`'s pool: from the member placement prefers among those
    /// with stock (the warm bonus, then the lightest load), else from any ready member whose
    /// own count says it has some.
    async fn take_warm(&self, template: &str) -> Option<DriverHandle> {
        let members = self.current().await;
        let mut loads = self.loads(&members);
        loads.retain(|l| l.warm.get(template).is_some_and(|&n| n > 0));
        // A claim adds nothing to a node's promises: its member was counted when it started.
        let req = Request {
            template: template.to_string(),
            cpus: 0.0,
            memory_mib: 0,
            checkpoint_key: None,
            preferred: None,
        };
        let mut placer = Placer::new(&self.cfg, &loads, &req);
        let mut tried = BTreeSet::new();
        loop {
            let chosen = placer.next(&mut rand::rng());
            let Ok(load) = chosen else { break };
            tried.insert(load.id.clone());
            if let Some(h) = self.take_from(&members, &load.id, template).await {
                return Some(h);
            }
            placer.refused();
        }
        for m in members
            .iter()
            .filter(|m| m.load.status == NodeStatus::Ready && !tried.contains(&m.id))
        {
            if m.node.pool_stock().get(template).is_some_and(|&n| n > 0)
                && let Some(h) = self.take_from(&members, &m.id, template).await
            {
                return Some(h);
            }
        }
        None
    }

    async fn take_from(
        &self,
        members: &[Member],
        id: &str,
        template: &str,
    ) -> Option<DriverHandle> {
        let m = members.iter().find(|m| m.id == id)?;
        let mut h = m.node.pool_take(template).await?;
        h.node = Some(m.id.clone());
        self.ledger.claimed(&m.id, template);
        Some(h)
    }

    /// The member holding the checkpoint in `dir`: the one remembered, else the first whose
    /// node recognises it (remembered from then on).
    async fn holder(&self, dir: &Path) -> Option<Route> {
        let known = self
            .checkpoints
            .lock()
            .expect("checkpoints lock")
            .get(dir)
            .cloned();
        if let Some(route) = known.and_then(|id| self.route_to(&id)) {
            return Some(route);
        }
        let members = self.members();
        let answers =
            futures::future::join_all(members.iter().map(|m| m.node.checkpoint_info(dir))).await;
        let m = members
            .iter()
            .zip(answers)
            .find_map(|(m, info)| info.map(|_| m))?;
        self.remember_checkpoint(dir, &m.id);
        self.route_to(&m.id)
    }

    fn remember_checkpoint(&self, dir: &Path, member: &str) {
        self.checkpoints
            .lock()
            .expect("checkpoints lock")
            .insert(dir.to_path_buf(), member.to_string());
    }

    /// Forgets `dir` and every checkpoint remembered under it; the members that held them.
    fn forget_under(&self, dir: &Path) -> BTreeSet<String> {
        let mut map = self.checkpoints.lock().expect("checkpoints lock");
        let mut holders = BTreeSet::new();
        map.retain(|d, member| {
            let under = d.starts_with(dir);
            if under {
                holders.insert(member.clone());
            }
            !under
        });
        holders
    }

    fn forget_checkpoint(&self, dir: &Path) {
        self.checkpoints
            .lock()
            .expect("checkpoints lock")
            .remove(dir);
    }

    /// The request that places a sandbox of `spec`.
    fn request(spec: &SandboxSpec) -> Request {
        Request {
            template: spec.template_id.clone(),
            cpus: f64::from(spec.cpu_count),
            memory_mib: spec.memory_mb,
            checkpoint_key: None,
            preferred: None,
        }
    }
}

/// A start's reservation in the ledger: released unless the start succeeded, also when the
/// placement is dropped mid-start (its client went away), so no start counts forever.
struct Reservation<'a> {
    ledger: &'a Ledger,
    ticket: Option<u64>,
}

impl Reservation<'_> {
    fn started(mut self, handle: &DriverHandle) {
        if let Some(t) = self.ticket.take() {
            self.ledger.started(t, handle);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.ledger.release(t);
        }
    }
}

/// A member refused for capacity (its own admission): not a failure.
fn is_refusal(e: &DriverError) -> bool {
    matches!(
        e,
        DriverError::Start(StartError::NoFreeSlot { .. }) | DriverError::NoCapacity { .. }
    )
}

/// The error of a placement that found no member: the last member's failure when members
/// failed, else a capacity refusal saying why.
fn gave_up(e: PlacementError, scope: &Scope<'_>, last_failure: Option<DriverError>) -> DriverError {
    let reason = match (&e, scope) {
        (PlacementError::CreateFailed { .. }, _) => {
            return last_failure.unwrap_or_else(|| DriverError::Start(StartError::setup(e)));
        }
        (_, Scope::Holder(id)) => format!(
            "node {id}, which holds its checkpoint, is full, draining or unreachable; try again \
             shortly (resuming on another node is not supported yet)"
        ),
        (PlacementError::NoCompatibleNode, Scope::Any | Scope::Pool) => {
            "no ready node can run it (it needs \
             the same kernel, CRIU, CPU features and template tree)"
                .to_string()
        }
        (PlacementError::CapacityUnavailable, Scope::Any | Scope::Pool) => {
            "every ready node is full; try again shortly or add nodes".to_string()
        }
    };
    DriverError::NoCapacity { reason }
}

#[async_trait]
impl AgentPath for ClusterNode {
    async fn open(&self, handle: &DriverHandle) -> Result<AgentStream, DriverError> {
        self.route(handle)?.agents.open(handle).await
    }
}
