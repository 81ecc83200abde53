//! The engine's shared state: one [`Engine`] value that every verb module extends with its own
//! `impl Engine` block (`create`, `kill`, `timeout`, `connect`, `usage`, `network_ops`,
//! `secrets`, `signed_urls`, `sandboxes`, `templates`, `recovery`, `reaper`, `filler`,
//! `pool_source`). It
//! imports only leaf modules, so no verb module depends on another.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use bulkhead_store::Store;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::node::driver::{Driver, DriverHandle};
use crate::node::network::{EgressControl, StoreAuditSink};
use crate::pool::gold::PoolSources;
use crate::pool::policy::Demand;
use crate::sandbox::admission::Admission;
use crate::sandbox::live::LiveSet;
use crate::tenancy::keys;
use crate::types::{Caller, TemplateInfo};
use crate::volume::storage::VolumeStorage;

type Result<T, E = EngineError> = std::result::Result<T, E>;

pub struct Engine {
    pub(crate) store: Store,
    pub(crate) driver: Arc<dyn Driver>,
    pub(crate) cfg: EngineConfig,
    pub(crate) templates: RwLock<HashMap<String, Arc<TemplateInfo>>>,
    pub(crate) live: LiveSet,
    pub(crate) pools: Mutex<HashMap<String, VecDeque<DriverHandle>>>,
    pub(crate) pool_wakeup: Notify,
    /// Creates per template, which the filler sizes each pool to.
    pub(crate) pool_demand: Mutex<HashMap<String, Demand>>,
    /// Creates running and waiting (see `admission`).
    pub(crate) admission: Admission,
    /// Per heavy template, the warm checkpoint its pool is restored from.
    pub(crate) pool_sources: PoolSources,
    pub(crate) shutdown: CancellationToken,
    /// The warm-pool filler, awaited on shutdown so a start in flight is not orphaned.
    pub(crate) filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The egress proxy; without it no sandbox may have network access.
    pub(crate) egress: OnceLock<Arc<dyn EgressControl>>,
    /// The proxy's audit sink, flushed before the trail is read.
    pub(crate) audit: OnceLock<Arc<StoreAuditSink>>,
    /// Serialises network changes (create's attach, updates, teardown) per engine, so two
    /// updates never both attach a link.
    pub(crate) net_lock: tokio::sync::Mutex<()>,
    /// Host storage of volumes; without it the volume verbs answer "no volume storage".
    pub(crate) volume_storage: OnceLock<Arc<dyn VolumeStorage>>,
    /// Volumes that creates in flight are mounting (id → count): not deletable meanwhile.
    pub(crate) volumes_mounting: Mutex<HashMap<String, usize>>,
    /// Template builds through the Template API (`template_builds`).
    pub(crate) builds: crate::template::types::TemplateBuilds,
    /// Per-team rate limits, creates in flight, key last-use and credit state (`tenancy`).
    pub(crate) tenants: crate::tenancy::state::Tenants,
}

impl Engine {
    pub fn new(store: Store, driver: Arc<dyn Driver>, cfg: EngineConfig) -> Arc<Self> {
        let admission = Admission::new(cfg.admission);
        Arc::new(Self {
            store,
            driver,
            cfg,
            templates: RwLock::new(HashMap::new()),
            live: LiveSet::default(),
            pools: Mutex::new(HashMap::new()),
            pool_wakeup: Notify::new(),
            pool_demand: Mutex::new(HashMap::new()),
            admission,
            pool_sources: PoolSources::default(),
            shutdown: CancellationToken::new(),
            filler: Mutex::new(None),
            egress: OnceLock::new(),
            audit: OnceLock::new(),
            net_lock: tokio::sync::Mutex::new(()),
            volume_storage: OnceLock::new(),
            volumes_mounting: Mutex::new(HashMap::new()),
            builds: Default::default(),
            tenants: Default::default(),
        })
    }

    /// Install the egress proxy (once, before `recover`). `audit` is flushed before the audit
    /// trail is read, so readers see every event recorded before their request.
    pub fn set_egress(&self, egress: Arc<dyn EgressControl>, audit: Option<Arc<StoreAuditSink>>) {
        let _ = self.egress.set(egress);
        if let Some(a) = audit {
            let _ = self.audit.set(a);
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
