//! The cluster roles of the binary, on the same bootstrap as `serve`:
//!
//! - **node** ([`Prepared::start_node`]): this machine's drivers and egress network as a
//!   `LocalNode`, served over `bulkhead.node.v1` (crates/node) with the cluster's join token,
//!   and a heartbeat into the shared store every second (a refused one registers a new epoch,
//!   which the server then requires of every call).
//! - **api** ([`Prepared::start_cluster`]): the engine over a `ClusterNode` whose members are
//!   the nodes registered in the store, each reached by a `RemoteNode`; every replica also
//!   takes part in the health sweep (one at a time, under the `node-health` lease), pauses
//!   what it drives on draining nodes (`drain`), and registers and heartbeats as one of the
//!   API replicas, taking over the sandboxes of silent ones (`replica`).
//!
//! Paths on the wire are relative to a node's data directory: the API's template cache,
//! checkpoints and built templates stand for `images/`, `checkpoints/` and `templates/` there,
//! so a node keeps its template cache in `<data-dir>/images` (the default).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bulkhead_engine::cluster::placement::PlacementConfig;
use bulkhead_engine::cluster::{
    Beat, ClusterNode, HealthConfig, HealthSweeper, Heartbeat, Membership, NodeReport,
    ReconcileConfig, Reconciler, StoreDirectory, Sweep,
};
use bulkhead_engine::{AgentPath, Engine, LocalNode, Node};
use bulkhead_node::{NodeServer, PathMap, RemoteNode};
use bulkhead_store::{NodeRow, Store};
use tokio::task::JoinHandle;

use crate::drain::Drainer;
use crate::error::{ClusterError, StartError};
use crate::replica::Replica;
use crate::server::{BuiltTemplate, Prepared, Server};

/// How often a node reports and a replica refreshes its view of the nodes.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// What a node is called and how the API replicas reach it.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// `--node-id`: stable across restarts (E2B's `clientID` of its sandboxes).
    pub node_id: String,
    /// The URL replicas call it at (`http://host:port`).
    pub advertise: String,
    /// The cluster's join secret (`BULKHEAD_NODE_TOKEN`).
    pub token: String,
    /// How long past its deadline a sandbox may run before the node stops it itself.
    pub deadline_grace: Duration,
}

/// A running node daemon.
pub struct NodeDaemon {
    server: NodeServer,
    node: Arc<LocalNode>,
    /// The jail driver, when it runs sandboxes (its views and cgroups are tidied at the end).
    jail: Option<Arc<bulkhead_jail::JailDriver>>,
    heartbeat: JoinHandle<()>,
    listen: SocketAddr,
    drainer: Drainer,
}

impl Prepared {
    /// Starts this machine's drivers and network as a cluster node with `templates` cached,
    /// registers it and keeps reporting.
    pub async fn start_node(
        self,
        templates: Vec<BuiltTemplate>,
        settings: NodeSettings,
    ) -> Result<NodeDaemon, StartError> {
        let config = self.config();
        if self.store().backend() == "sqlite" && config.database_url.is_none() {
            return Err(ClusterError::NoSharedStore.into());
        }
        if settings.token.is_empty() {
            return Err(ClusterError::NoToken.into());
        }
        if config.image_cache_dir() != config.data_dir.join("images") {
            return Err(ClusterError::ImageCacheOutside.into());
        }
        let side = crate::node_side::build(config, self.store())?;
        let server = NodeServer::new(
            side.node.clone(),
            side.node.clone(),
            bulkhead_node::ServerConfig::new(&settings.node_id, &settings.token, &config.data_dir),
        );
        let cached: BTreeSet<String> = templates.iter().map(|t| t.recipe.id.clone()).collect();
        let mut hb = Heartbeat::new(self.store().clone(), &settings.node_id, &settings.advertise);
        let report = NodeReport::of_local(&side.node, cached.clone(), 0);
        let beat = hb
            .beat(&report, false, now_ms())
            .await
            .map_err(|e| StartError::from(ClusterError::Register(e)))?;
        server.set_epoch(beat.epoch());
        tracing::info!(node = %settings.node_id, epoch = beat.epoch(), advertise = %settings.advertise, "node registered");
        // Before serving: take back what the store has here, stop what it no longer assigns.
        let mut reconciler = Reconciler::new(
            self.store().clone(),
            &settings.node_id,
            side.node.clone() as Arc<dyn Node>,
            ReconcileConfig {
                deadline_grace: settings.deadline_grace,
            },
        );
        reconciler.round(now_ms(), true).await;
        let drainer = Drainer::new(self.store().clone(), &settings.node_id);
        let heartbeat = tokio::spawn(heartbeat_loop(
            hb,
            reconciler,
            drainer.clone(),
            side.node.clone(),
            server.clone(),
            cached,
        ));
        Ok(NodeDaemon {
            server,
            node: side.node,
            jail: side.jail,
            heartbeat,
            listen: config.listen,
            drainer,
        })
    }

    /// Starts an API replica of a cluster: the engine over every node registered in the store,
    /// driving the sandboxes it creates or takes over; the other replicas reach it at
    /// `advertise`.
    pub async fn start_cluster(
        self,
        templates: Vec<BuiltTemplate>,
        token: String,
        replica: String,
        advertise: String,
    ) -> Result<Server, StartError> {
        let config = self.config().clone();
        if self.store().backend() == "sqlite" && config.database_url.is_none() {
            return Err(ClusterError::NoSharedStore.into());
        }
        if token.is_empty() {
            return Err(ClusterError::NoToken.into());
        }
        let paths = PathMap::new()
            .with(config.image_cache_dir(), "images")
            .and_then(|m| m.with(config.data_dir.join("checkpoints"), "checkpoints"))
            .and_then(|m| m.with(config.data_dir.join("templates"), "templates"))
            .map_err(|e| StartError::from(ClusterError::Paths(e)))?;
        let clients = Clients::default();
        let store = self.store().clone();
        clients.connect_all(&store, &token, &paths).await;
        let lookup = clients.clone();
        let directory = StoreDirectory::new(store.clone(), move |row| lookup.get(row));
        let cluster = ClusterNode::new(Arc::new(directory), PlacementConfig::default()).await;
        let connector = {
            let (clients, store, cluster) = (clients.clone(), store.clone(), cluster.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(HEARTBEAT);
                loop {
                    tick.tick().await;
                    clients.connect_all(&store, &token, &paths).await;
                    // Calls about running sandboxes use the router's last view: a node that
                    // came back (a new epoch, maybe a new address) is reached within a second.
                    cluster.refresh().await;
                }
            })
        };
        let membership = Replica::register(Membership::new(store.clone(), &replica, advertise))
            .await
            .map_err(ClusterError::from)?;
        let mut server = self
            .start_on(
                templates,
                cluster.clone() as Arc<dyn Node>,
                cluster as Arc<dyn AgentPath>,
                None,
                vec![connector],
                Some((replica.clone(), membership)),
            )
            .await?;
        let evacuation = tokio::spawn(crate::drain::evacuate_loop(
            store.clone(),
            server.engine().clone(),
        ));
        let sweeper = tokio::spawn(sweep_loop(
            HealthSweeper::new(store, replica, HealthConfig::default()),
            server.engine().clone(),
        ));
        server.add_task(sweeper);
        server.add_task(evacuation);
        Ok(server)
    }
}

impl NodeDaemon {
    /// Its drain (SIGTERM): report `draining`, wait for the sandboxes here to go.
    pub fn drainer(&self) -> Drainer {
        self.drainer.clone()
    }

    pub async fn bind(&self) -> Result<tokio::net::TcpListener, StartError> {
        tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: self.listen,
                source,
            })
    }

    /// Serves the node protocol until `signal`.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        axum::serve(listener, self.server.router())
            .with_graceful_shutdown(signal)
            .await
            .map_err(StartError::Serve)
    }

    /// Stops reporting (the sweep then marks the node suspect, then dead), stops the warm pool
    /// members it holds and drops the template views no sandbox uses, as `serve` does. Running
    /// sandboxes keep running; the node's next start registers under a new epoch.
    pub async fn shutdown(self) {
        self.heartbeat.abort();
        for h in self.node.pool_drain(None).await {
            let _ = self.node.stop(&h).await;
        }
        if let Some(jail) = &self.jail {
            if let Err(e) = jail.prune_lowers() {
                tracing::warn!(error = %e, "pruning idmapped template views failed");
            }
            jail.release_cgroup_parent();
        }
    }
}

/// Reports every second, and reconciles with the store after each beat (a registration
/// takes back what the store has here and stops the rest).
async fn heartbeat_loop(
    mut hb: Heartbeat,
    mut reconciler: Reconciler,
    drainer: Drainer,
    node: Arc<LocalNode>,
    server: NodeServer,
    cached: BTreeSet<String>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        let report = NodeReport::of_local(&node, cached.clone(), 0);
        let registered = match hb.beat(&report, drainer.is_draining(), now_ms()).await {
            Ok(Beat::Registered { epoch, previous }) => {
                tracing::warn!(epoch, ?previous, "node registered again under a new epoch");
                server.set_epoch(epoch);
                true
            }
            Ok(Beat::Reported { .. }) => false,
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed; retrying");
                false
            }
        };
        reconciler.round(now_ms(), registered).await;
    }
}

/// Takes part in the health sweep; the sandboxes it finds lost with their nodes leave the
/// engine's live set (those other replicas drive leave theirs at their next check,
/// `Engine::release_taken`).
async fn sweep_loop(mut sweeper: HealthSweeper, engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        match sweeper.round(now_ms()).await {
            Ok(Sweep::Swept { lost, .. }) if !lost.is_empty() => {
                let ids: Vec<String> = lost.into_iter().map(|l| l.id).collect();
                engine.forget_lost(&ids).await;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "node health sweep failed; retrying"),
        }
    }
}

/// One client per node incarnation, made as nodes appear in the store (connecting reads the
/// node's Info, which is async; the directory's lookup is not).
#[derive(Clone, Default)]
struct Clients(Arc<Mutex<HashMap<String, Connected>>>);

/// A node's client and the epoch it was made for.
type Connected = (u64, Arc<RemoteNode>);

impl Clients {
    fn get(&self, row: &NodeRow) -> Option<(Arc<dyn Node>, Arc<dyn AgentPath>)> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (epoch, node) = map.get(&row.id)?;
        (*epoch == row.epoch).then(|| {
            (
                node.clone() as Arc<dyn Node>,
                node.clone() as Arc<dyn AgentPath>,
            )
        })
    }

    async fn connect_all(&self, store: &Store, token: &str, paths: &PathMap) {
        let rows = match store.list_nodes().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "listing the cluster's nodes failed");
                return;
            }
        };
        for row in rows {
            let known = {
                let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                map.get(&row.id).is_some_and(|(e, _)| *e == row.epoch)
            };
            if known || row.status == bulkhead_store::NodeStatus::Dead {
                continue;
            }
            match RemoteNode::connect(&row.addr, token, paths.clone()).await {
                Ok(node) => {
                    tracing::info!(node = %row.id, epoch = row.epoch, addr = %row.addr, "connected to node");
                    self.0
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(row.id.clone(), (row.epoch, Arc::new(node)));
                }
                Err(e) => {
                    tracing::warn!(node = %row.id, addr = %row.addr, error = %e, "cannot reach node")
                }
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
