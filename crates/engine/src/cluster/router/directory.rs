//! Who a cluster's members are and how loaded each is: a [`NodeDirectory`] answers with
//! [`Member`]s (an id, the node's control and data paths, its [`NodeLoad`]). Two of them: the
//! [`StaticDirectory`] (a fixed list: tests, and later a `--node` flag), which knows only each
//! member's capacity and asks the members for their pools, and the [`StoreDirectory`], which
//! reads the nodes' own heartbeat reports from the store and makes one client per node
//! incarnation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bulkhead_store::{NodeRow, Store};

use crate::cluster::placement::{NodeLoad, NodeStatus};
use crate::cluster::report::NodeReport;
use crate::node::{AgentPath, Node};

/// One node of the cluster as the router sees it.
#[derive(Clone)]
pub struct Member {
    /// The id its handles carry (`DriverHandle::node`).
    pub id: String,
    pub node: Arc<dyn Node>,
    pub agents: Arc<dyn AgentPath>,
    pub load: NodeLoad,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("id", &self.id)
            .field("load", &self.load)
            .finish_non_exhaustive()
    }
}

/// Where a [`super::ClusterNode`] learns its members.
#[async_trait]
pub trait NodeDirectory: Send + Sync + 'static {
    /// Every member now, with its load.
    async fn members(&self) -> Vec<Member>;

    /// Are the loads the nodes' own reports (which count what their sandboxes were promised,
    /// and lag behind this router's placements until their next report)? When false (the
    /// static directory knows only capacity), the router adds what it started and stopped on
    /// each member itself.
    fn self_reported(&self) -> bool {
        true
    }

    /// How long an answer stays good enough for placement (the nodes' heartbeat period).
    fn refresh_every(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// A member of a [`StaticDirectory`]: the node and what it offers.
pub struct StaticMember {
    pub id: String,
    pub node: Arc<dyn Node>,
    pub agents: Arc<dyn AgentPath>,
    /// Capacity, status and cached templates; its warm pools and checkpoint key are asked of
    /// the node at every answer, and what it was promised is counted by the router.
    pub load: NodeLoad,
}

impl StaticMember {
    /// A ready member offering `cpus` vCPUs and `memory_mib` to sandboxes.
    pub fn new<N: Node + AgentPath>(
        id: impl Into<String>,
        node: Arc<N>,
        cpus: f64,
        memory_mib: u64,
    ) -> Self {
        let id = id.into();
        StaticMember {
            load: NodeLoad {
                id: id.clone(),
                status: NodeStatus::Ready,
                cpus,
                memory_mib,
                cpu_allocated: 0.0,
                memory_allocated_mib: 0,
                cpu_in_flight: 0.0,
                memory_in_flight_mib: 0,
                cpu_used: 0.0,
                warm: Default::default(),
                cached: Default::default(),
                checkpoint_key: None,
            },
            id,
            node: node.clone(),
            agents: node,
        }
    }
}

/// A fixed list of members. Cheap to ask (nothing leaves the process), so the router asks it
/// before every placement.
pub struct StaticDirectory {
    members: Mutex<Vec<StaticMember>>,
}

impl StaticDirectory {
    pub fn new(members: Vec<StaticMember>) -> Self {
        StaticDirectory {
            members: Mutex::new(members),
        }
    }

    /// Set a member's status (drain it, or bring it back); false if there is no such member.
    pub fn set_status(&self, id: &str, status: NodeStatus) -> bool {
        let mut members = self.members.lock().expect("directory lock");
        match members.iter_mut().find(|m| m.id == id) {
            Some(m) => {
                m.load.status = status;
                true
            }
            None => false,
        }
    }
}

#[async_trait]
impl NodeDirectory for StaticDirectory {
    async fn members(&self) -> Vec<Member> {
        let members = self.members.lock().expect("directory lock");
        members
            .iter()
            .map(|m| {
                let mut load = m.load.clone();
                load.warm = m
                    .node
                    .pool_stock()
                    .into_iter()
                    .map(|(t, n)| (t, u32::try_from(n).unwrap_or(u32::MAX)))
                    .collect();
                load.checkpoint_key = m.node.checkpoint_key();
                Member {
                    id: m.id.clone(),
                    node: m.node.clone(),
                    agents: m.agents.clone(),
                    load,
                }
            })
            .collect()
    }

    fn self_reported(&self) -> bool {
        false
    }

    fn refresh_every(&self) -> Duration {
        Duration::ZERO
    }
}

/// Makes the clients of a registered node (its control and data paths), or `None` when it
/// cannot be reached (no usable address): it is then left out of the cluster.
pub type ClientFactory =
    dyn Fn(&NodeRow) -> Option<(Arc<dyn Node>, Arc<dyn AgentPath>)> + Send + Sync;

/// The registered nodes (`Store::list_nodes`), each with the load of its last heartbeat report
/// and the status the store gives it.
pub struct StoreDirectory {
    store: Store,
    factory: Box<ClientFactory>,
    refresh_every: Duration,
    /// One client per node and epoch: a new incarnation (a restart, a return after being
    /// declared dead) gets a new client, since the old one's calls would be refused.
    clients: Mutex<HashMap<String, Client>>,
    /// The last answer, given again while the store cannot be read.
    last: Mutex<Vec<Member>>,
}

struct Client {
    epoch: u64,
    node: Arc<dyn Node>,
    agents: Arc<dyn AgentPath>,
}

impl StoreDirectory {
    pub fn new(
        store: Store,
        factory: impl Fn(&NodeRow) -> Option<(Arc<dyn Node>, Arc<dyn AgentPath>)>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        StoreDirectory {
            store,
            factory: Box::new(factory),
            refresh_every: Duration::from_secs(1),
            clients: Mutex::new(HashMap::new()),
            last: Mutex::new(Vec::new()),
        }
    }

    /// Read the store at most this often (default: a second, the heartbeat period).
    pub fn with_refresh_every(mut self, every: Duration) -> Self {
        self.refresh_every = every;
        self
    }

    fn client(&self, clients: &mut HashMap<String, Client>, row: &NodeRow) -> Option<Member> {
        let fresh = clients.get(&row.id).is_some_and(|c| c.epoch == row.epoch);
        if !fresh {
            match (self.factory)(row) {
                Some((node, agents)) => {
                    clients.insert(
                        row.id.clone(),
                        Client {
                            epoch: row.epoch,
                            node,
                            agents,
                        },
                    );
                }
                None => {
                    clients.remove(&row.id);
                    return None;
                }
            }
        }
        let c = clients.get(&row.id)?;
        Some(Member {
            id: row.id.clone(),
            node: c.node.clone(),
            agents: c.agents.clone(),
            load: NodeReport::from_json(&row.report).load(&row.id, row.status.into()),
        })
    }
}

#[async_trait]
impl NodeDirectory for StoreDirectory {
    async fn members(&self) -> Vec<Member> {
        let rows = match self.store.list_nodes().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot list the cluster's nodes; placing on the last known list"
                );
                return self.last.lock().expect("directory lock").clone();
            }
        };
        let members: Vec<Member> = {
            let mut clients = self.clients.lock().expect("directory lock");
            clients.retain(|id, _| rows.iter().any(|r| &r.id == id));
            rows.iter()
                .filter_map(|row| self.client(&mut clients, row))
                .collect()
        };
        *self.last.lock().expect("directory lock") = members.clone();
        members
    }

    fn refresh_every(&self) -> Duration {
        self.refresh_every
    }
}
