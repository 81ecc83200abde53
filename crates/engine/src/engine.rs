//! The control plane's shared state: one [`Engine`] value (the store, the template registry,
//! the live set and its lifecycle, tenancy, builds) over one [`Node`] (where sandboxes run),
//! which the folders' `impl Engine` blocks extend with their verbs.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use bulkhead_store::Store;
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::node::driver::Driver;
use crate::node::network::{EgressControl, StoreAuditSink};
use crate::node::{AgentPath, LocalNode, Node};
use crate::pool::state::PoolState;
use crate::sandbox::admission::Admission;
use crate::sandbox::live::LiveSet;
use crate::tenancy::keys;
use crate::types::{Caller, TemplateInfo};
use crate::volume::state::Volumes;

type Result<T, E = EngineError> = std::result::Result<T, E>;

pub struct Engine {
    pub(crate) store: Store,
    /// Where the sandboxes run: every driver, pool and network call goes through it.
    pub(crate) node: Arc<dyn Node>,
    /// The byte streams to the sandboxes' agents (the same node, its data path).
    pub(crate) agents: Arc<dyn AgentPath>,
    /// The in-process node, for wiring its egress proxy (`set_egress`); `None` when the
    /// engine was given another node.
    local: Option<Arc<LocalNode>>,
    pub(crate) cfg: EngineConfig,
    pub(crate) templates: RwLock<HashMap<String, Arc<TemplateInfo>>>,
    pub(crate) live: LiveSet,
    /// Demand, warm checkpoints and the filler of the warm pools (`pool`).
    pub(crate) pools: PoolState,
    /// Creates running and waiting (see `admission`).
    pub(crate) admission: Admission,
    pub(crate) shutdown: CancellationToken,
    /// Serialises network updates per engine, so two updates never both attach a link.
    pub(crate) net_lock: tokio::sync::Mutex<()>,
    /// Volume storage and the volumes being mounted (`volume`).
    pub(crate) volumes: Volumes,
    /// Template builds through the Template API (`template_builds`).
    pub(crate) builds: crate::template::types::TemplateBuilds,
    /// Per-team rate limits, creates in flight, key last-use and credit state (`tenancy`).
    pub(crate) tenants: crate::tenancy::state::Tenants,
    /// Serialises take-over rounds of this API replica (`cluster::replicas`).
    pub(crate) takeover: tokio::sync::Mutex<()>,
}

impl Engine {
    /// An engine over this machine's `driver` (a [`LocalNode`] in process).
    pub fn new(store: Store, driver: Arc<dyn Driver>, cfg: EngineConfig) -> Arc<Self> {
        let local = LocalNode::new(driver);
        Self::build(store, local.clone(), local.clone(), Some(local), cfg)
    }

    /// An engine over any node (its control and data paths).
    pub fn with_node(
        store: Store,
        node: Arc<dyn Node>,
        agents: Arc<dyn AgentPath>,
        cfg: EngineConfig,
    ) -> Arc<Self> {
        Self::build(store, node, agents, None, cfg)
    }

    fn build(
        store: Store,
        node: Arc<dyn Node>,
        agents: Arc<dyn AgentPath>,
        local: Option<Arc<LocalNode>>,
        cfg: EngineConfig,
    ) -> Arc<Self> {
        let admission = Admission::new(cfg.admission);
        Arc::new(Self {
            store,
            node,
            agents,
            local,
            cfg,
            templates: RwLock::new(HashMap::new()),
            live: LiveSet::default(),
            pools: PoolState::default(),
            admission,
            shutdown: CancellationToken::new(),
            net_lock: tokio::sync::Mutex::new(()),
            volumes: Volumes::default(),
            builds: Default::default(),
            tenants: Default::default(),
            takeover: tokio::sync::Mutex::new(()),
        })
    }

    /// Install the in-process node's egress proxy (once, before `recover`). `audit` is
    /// flushed before the audit trail is read, so readers see every event recorded before
    /// their request. An engine given another node wires that node's proxy there.
    pub fn set_egress(&self, egress: Arc<dyn EgressControl>, audit: Option<Arc<StoreAuditSink>>) {
        match &self.local {
            Some(node) => node.set_egress(egress, audit),
            None => tracing::warn!("set_egress on an engine without an in-process node: ignored"),
        }
    }

    /// Check an `X-API-Key` value; the caller every other verb is given. The key's last use
    /// is written in the background, at most once a minute per key (not a write per request).
    pub async fn authenticate(&self, key: &str) -> Result<Option<Caller>> {
        let caller = keys::authenticate(&self.store, key).await?;
        if let Some(c) = &caller {
            let now = crate::clock::now_ms();
            if self.tenants.touch_due(&c.key_id, now) {
                let store = self.store.clone();
                let id = c.key_id.clone();
                tokio::spawn(async move {
                    if let Err(e) = store.touch_api_key(&id, now).await {
                        tracing::warn!(key = %id, error = %e, "recording the key's last use failed");
                    }
                });
            }
        }
        Ok(caller)
    }
}
