use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use base64::Engine as _;
use bulkhead_envd::rest::{FileOperation, InitRequest, file_signature};
use bulkhead_store::{
    ApiKeyRow, EgressEventRow, SandboxFilter, SandboxRow, SandboxState, SecretRow, Store,
    StoreError,
};
use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::agent_client;
use crate::driver::{AgentStream, Driver, DriverHandle, SandboxSpec};
use crate::error::EngineError;
use crate::ids;
use crate::keys;
use crate::lifecycle::{self, Operation, Refusal, Step};
use crate::network::{self, EgressControl, SandboxNetwork, StoreAuditSink};

type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// TTL when the client gives none (E2B: 300 s).
    pub default_timeout: Duration,
    /// Largest TTL a client may ask for.
    pub max_timeout: Duration,
    /// Started, anonymous sandboxes kept ready per template.
    pub pool_size: usize,
    /// envd version reported to SDKs (they gate features on it).
    pub envd_version: String,
    /// Most sandboxes running at once (pool members not counted).
    pub max_sandboxes: usize,
    /// How long records of dead sandboxes are kept.
    pub dead_retention: Duration,
    /// How often the reaper looks for expired sandboxes.
    pub reap_interval: Duration,
    /// `allow_internet_access` when a create request does not say (operator setting; E2B's
    /// cloud defaults to true, Bulkhead to false).
    pub network_default_allow: bool,
    /// Environment every sandbox starts with (e.g. the CA bundle variables); a create
    /// request's own `envVars` override these.
    pub sandbox_env: BTreeMap<String, String>,
    /// How long egress audit events are kept.
    pub audit_retention: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            pool_size: 2,
            envd_version: bulkhead_envd::ENVD_VERSION.into(),
            max_sandboxes: 1000,
            dead_retention: Duration::from_secs(3600),
            reap_interval: Duration::from_millis(250),
            network_default_allow: false,
            sandbox_env: BTreeMap::new(),
            audit_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// A template the engine can start sandboxes from (its rootfs is already built).
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateInfo {
    pub id: String,
    pub aliases: Vec<String>,
    pub rootfs: PathBuf,
    pub content_hash: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
    pub pids_max: u64,
}

impl TemplateInfo {
    fn spec(&self) -> SandboxSpec {
        SandboxSpec {
            template_id: self.id.clone(),
            rootfs: self.rootfs.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            pids_max: self.pids_max,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Template id or alias (`base` when empty).
    pub template: String,
    /// TTL in seconds.
    pub timeout: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// Issue an envd access token (v2 create is always secure).
    pub secure: bool,
    /// E2B `allow_internet_access`; None = the server's default.
    pub allow_internet_access: Option<bool>,
    /// E2B `network` (allowOut, denyOut, rules).
    pub network: Option<SandboxNetwork>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cpu_count: i64,
    pub memory_mb: i64,
    pub disk_size_mb: i64,
    pub state: &'static str,
    pub envd_access_token: Option<String>,
    pub envd_version: String,
    pub allow_internet_access: bool,
    pub network: Option<SandboxNetwork>,
}

/// A secret as shown to clients: never the value.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SecretInfo {
    pub id: String,
    pub name: String,
    pub version: i64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<&SecretRow> for SecretInfo {
    fn from(r: &SecretRow) -> Self {
        SecretInfo {
            id: r.id.clone(),
            name: r.name.clone(),
            version: r.version,
            metadata: r.metadata.clone(),
            created_at: ms_to_dt(r.created_at),
            updated_at: ms_to_dt(r.updated_at),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SecretPage {
    pub items: Vec<SecretInfo>,
    pub next_token: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Empty = running and paused.
    pub states: Vec<SandboxState>,
    pub metadata: BTreeMap<String, String>,
    pub template: Option<String>,
    pub started_after: Option<DateTime<Utc>>,
    /// 1..=100, default 100.
    pub limit: Option<usize>,
    pub next_token: Option<String>,
    pub order_desc: bool,
}

#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<SandboxInfo>,
    pub next_token: Option<String>,
    pub total_running: i64,
}

/// Resource usage with the CPU share already computed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Usage {
    pub timestamp: DateTime<Utc>,
    pub cpu_count: i64,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

struct Live {
    /// Where it is in its life; only [`lifecycle::transition`] decides the next one.
    state: SandboxState,
    handle: DriverHandle,
    end_at_ms: i64,
    access_token: Option<String>,
    cancel: CancellationToken,
    cpu_count: i64,
    /// Last CPU sample (ns of CPU time, wall ms) for the usage percentage.
    last_cpu: (u64, i64),
    /// The egress proxy serves a link for this sandbox.
    net_attached: bool,
}

pub struct Engine {
    store: Store,
    driver: Arc<dyn Driver>,
    cfg: EngineConfig,
    templates: RwLock<HashMap<String, Arc<TemplateInfo>>>,
    live: Mutex<HashMap<String, Live>>,
    pools: Mutex<HashMap<String, VecDeque<DriverHandle>>>,
    pool_wakeup: Notify,
    shutdown: CancellationToken,
    /// The warm-pool filler, awaited on shutdown so a start in flight is not orphaned.
    filler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The egress proxy; without it no sandbox may have network access.
    egress: OnceLock<Arc<dyn EgressControl>>,
    /// The proxy's audit sink, flushed before the trail is read.
    audit: OnceLock<Arc<StoreAuditSink>>,
    /// Serialises network changes (create's attach, updates, teardown) per engine, so two
    /// updates never both attach a link.
    net_lock: tokio::sync::Mutex<()>,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn ms_to_dt(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

impl Engine {
    pub fn new(store: Store, driver: Arc<dyn Driver>, cfg: EngineConfig) -> Arc<Self> {
        Arc::new(Self {
            store,
            driver,
            cfg,
            templates: RwLock::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            pool_wakeup: Notify::new(),
            shutdown: CancellationToken::new(),
            filler: Mutex::new(None),
            egress: OnceLock::new(),
            audit: OnceLock::new(),
            net_lock: tokio::sync::Mutex::new(()),
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

    pub fn store(&self) -> &Store {
        &self.store
    }

    // ----- templates -----

    /// Make a built template available; records it in the store.
    pub async fn register_template(&self, t: TemplateInfo) -> Result<()> {
        let now = now_ms();
        let created_at = match self.store.get_template(&t.id).await? {
            Some(row) => row.created_at,
            None => now,
        };
        self.store
            .upsert_template(&bulkhead_store::TemplateRow {
                id: t.id.clone(),
                alias: t.aliases.first().cloned(),
                content_hash: t.content_hash.clone(),
                status: "ready".into(),
                rootfs_path: t.rootfs.display().to_string(),
                cpu_count: t.cpu_count as i64,
                memory_mb: t.memory_mb as i64,
                disk_size_mb: t.disk_size_mb as i64,
                created_at,
                updated_at: now,
            })
            .await?;
        let t = Arc::new(t);
        let mut map = self.templates.write().expect("templates lock");
        map.insert(t.id.clone(), t.clone());
        for a in &t.aliases {
            map.insert(a.clone(), t.clone());
        }
        drop(map);
        self.pool_wakeup.notify_one();
        Ok(())
    }

    pub fn template(&self, id_or_alias: &str) -> Option<Arc<TemplateInfo>> {
        // `name:tag` → tags are not versioned separately yet; the default tag is the template.
        let name = id_or_alias.strip_suffix(":default").unwrap_or(id_or_alias);
        self.templates
            .read()
            .expect("templates lock")
            .get(name)
            .cloned()
    }

    pub fn templates(&self) -> Vec<Arc<TemplateInfo>> {
        let map = self.templates.read().expect("templates lock");
        let mut v: Vec<_> = map.values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v.dedup_by(|a, b| a.id == b.id);
        v
    }

    // ----- API keys -----

    /// Check an `X-API-Key` value.
    pub async fn authenticate(&self, key: &str) -> Result<Option<ApiKeyRow>> {
        Ok(keys::authenticate(&self.store, key).await?)
    }

    // ----- sandboxes -----

    pub async fn create(
        self: &Arc<Self>,
        owner: &ApiKeyRow,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let template_name = if req.template.is_empty() {
            "base"
        } else {
            req.template.as_str()
        };
        let template = self
            .template(template_name)
            .ok_or_else(|| EngineError::TemplateNotFound(template_name.to_string()))?;
        let timeout =
            self.check_timeout(req.timeout.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        validate_env(&req.env_vars)?;
        validate_metadata(&req.metadata)?;
        let allow_internet = req
            .allow_internet_access
            .unwrap_or(self.cfg.network_default_allow);
        let policy = self.check_network(allow_internet, req.network.as_ref())?;
        if self.live.lock().expect("live lock").len() >= self.cfg.max_sandboxes {
            return Err(EngineError::Capacity);
        }

        // Validated before anything starts; the new sandbox is `starting` until it is recorded.
        let created = lifecycle::transition(SandboxState::Starting, Operation::Create)
            .expect("a starting sandbox can be created");
        let id = ids::sandbox_id();
        let token = req.secure.then(|| ids::random_hex(20));
        let mut env = self.cfg.sandbox_env.clone();
        env.extend(req.env_vars.clone());
        let init = InitRequest {
            env_vars: Some(env),
            access_token: token.clone(),
            default_user: Some("user".into()),
            ..Default::default()
        };
        let handle = self.claim_and_init(&template, &init).await?;
        // Late binding: pool members have no link; one is made only for sandboxes whose
        // policy lets something out.
        let net_attached = network::egress_allowed(&policy);
        if net_attached && let Err(e) = self.attach_link(&id, &handle, policy).await {
            let _ = self.driver.stop(&handle).await;
            return Err(e);
        }

        let started = now_ms();
        let end_at = started + timeout.as_millis() as i64;
        let row = SandboxRow {
            id: id.clone(),
            template_id: template.id.clone(),
            alias: template.aliases.first().cloned(),
            state: created.after,
            owner_key_id: owner.id.clone(),
            metadata: req.metadata.clone(),
            env_vars: req.env_vars.clone(),
            envd_access_token: token.clone(),
            cpu_count: template.cpu_count as i64,
            memory_mb: template.memory_mb as i64,
            disk_size_mb: template.disk_size_mb as i64,
            started_at: started,
            end_at,
            driver_handle: Some(serde_json::to_string(&handle).expect("handle serializes")),
            end_reason: None,
            allow_internet,
            network: req
                .network
                .as_ref()
                .map(|n| serde_json::to_string(n).expect("network config serializes")),
        };
        if let Err(e) = self.store.insert_sandbox(&row).await {
            self.detach_link(&id);
            let _ = self.driver.stop(&handle).await;
            return Err(e.into());
        }
        self.track(&row, handle, net_attached);
        self.pool_wakeup.notify_one();
        tracing::info!(sandbox = %id, template = %template.id, "sandbox created");
        Ok(self.info_from_row(&row))
    }

    /// Take a warm sandbox (or start one) and give it its identity through `/init`.
    async fn claim_and_init(&self, t: &TemplateInfo, init: &InitRequest) -> Result<DriverHandle> {
        // A pooled sandbox may have died while waiting; try the pool a few times, then cold.
        for _ in 0..3 {
            let Some(handle) = self
                .pools
                .lock()
                .expect("pool lock")
                .get_mut(&t.id)
                .and_then(|q| q.pop_front())
            else {
                break;
            };
            match self.init_agent(&handle, init).await {
                Ok(()) => return Ok(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "pooled sandbox unusable, discarding it");
                    let _ = self.driver.stop(&handle).await;
                }
            }
        }
        let handle = self.driver.start(&t.spec()).await?;
        if let Err(e) = self.init_agent(&handle, init).await {
            let _ = self.driver.stop(&handle).await;
            return Err(e);
        }
        Ok(handle)
    }

    async fn init_agent(&self, handle: &DriverHandle, init: &InitRequest) -> Result<()> {
        let stream = self.driver.connect(handle).await?;
        agent_client::request(stream, http::Method::POST, "/init", Some(init), None)
            .await
            .map_err(|e| EngineError::Agent(e.to_string()))?;
        Ok(())
    }

    // ----- network -----

    /// Validate a network config and build its proxy policy (400 on bad input).
    fn check_network(
        &self,
        allow_internet: bool,
        net: Option<&SandboxNetwork>,
    ) -> Result<bulkhead_egress::NetworkPolicy> {
        let policy = net.cloned().unwrap_or_default().policy(allow_internet);
        policy
            .validate()
            .map_err(|e| EngineError::BadRequest(format!("Invalid network config: {e}")))?;
        if network::egress_allowed(&policy) && self.egress.get().is_none() {
            return Err(EngineError::BadRequest(
                "This server has no egress proxy, so sandboxes cannot have network access: \
                 leave allow_internet_access and network.allowOut unset"
                    .into(),
            ));
        }
        Ok(policy)
    }

    /// Give a sandbox its link and hand it to the egress proxy.
    async fn attach_link(
        &self,
        id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<()> {
        let egress = self
            .egress
            .get()
            .ok_or_else(|| EngineError::Network("no egress proxy is configured".into()))?;
        let tun = self.driver.open_network(handle).await?;
        egress
            .attach(id, tun, policy)
            .map_err(EngineError::Network)?;
        tracing::info!(sandbox = %id, "network link attached");
        Ok(())
    }

    fn detach_link(&self, id: &str) {
        if let Some(e) = self.egress.get() {
            e.detach(id);
        }
    }

    /// `PUT /sandboxes/{id}/network`: replace the whole network config (omitted fields are
    /// cleared; `allow_internet_access` omitted = the server default). Applies to new
    /// connections at once: a sandbox that becomes allowed gets a link, one that no longer is
    /// loses it.
    pub async fn update_network(
        &self,
        id: &str,
        allow_internet_access: Option<bool>,
        net: SandboxNetwork,
    ) -> Result<()> {
        let row = self.running_row(id, Operation::UpdateNetwork).await?;
        let allow_internet = allow_internet_access.unwrap_or(self.cfg.network_default_allow);
        let policy = self.check_network(allow_internet, Some(&net))?;
        let wanted = network::egress_allowed(&policy);
        let _guard = self.net_lock.lock().await;
        let (handle, attached) = {
            let live = self.live.lock().expect("live lock");
            let l = live
                .get(&row.id)
                .ok_or_else(|| EngineError::SandboxNotFound(row.id.clone()))?;
            (l.handle.clone(), l.net_attached)
        };
        match (attached, wanted) {
            (true, true) => self
                .egress
                .get()
                .ok_or_else(|| EngineError::Network("no egress proxy is configured".into()))?
                .set_policy(&row.id, policy)
                .map_err(EngineError::Network)?,
            (false, true) => self.attach_link(&row.id, &handle, policy).await?,
            (true, false) => self.detach_link(&row.id),
            (false, false) => {}
        }
        let still_live = match self.live.lock().expect("live lock").get_mut(&row.id) {
            Some(l) if l.state != SandboxState::Killing => {
                l.net_attached = wanted;
                true
            }
            _ => false,
        };
        if !still_live {
            // Killed while the link was being made: do not leave it behind.
            self.detach_link(&row.id);
            return Err(EngineError::SandboxNotFound(row.id.clone()));
        }
        let stored = (net != SandboxNetwork::default())
            .then(|| serde_json::to_string(&net).expect("network config serializes"));
        self.store
            .set_sandbox_network(&row.id, allow_internet, stored.as_deref())
            .await?;
        tracing::info!(sandbox = %row.id, allow_internet, link = wanted, "network config replaced");
        Ok(())
    }

    /// The newest `limit` egress decisions of a sandbox (running or ended), oldest first.
    pub async fn network_events(&self, id: &str, limit: usize) -> Result<Vec<EgressEventRow>> {
        let id = ids::normalize_sandbox_id(id);
        if !ids::is_valid_sandbox_id(id) {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        if let Some(a) = self.audit.get() {
            a.flush().await;
        }
        let events = self
            .store
            .list_egress_events(id, limit.clamp(1, 10_000) as i64)
            .await?;
        if events.is_empty() && self.store.get_sandbox(id).await?.is_none() {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        Ok(events)
    }

    // ----- secrets -----

    pub async fn create_secret(
        &self,
        name: &str,
        value: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<SecretInfo> {
        network::validate_secret_name(name).map_err(EngineError::BadRequest)?;
        validate_secret_value(value)?;
        validate_metadata(&metadata)?;
        let now = now_ms();
        let row = SecretRow {
            id: format!("sec_{}", ids::random_hex(12)),
            name: name.to_string(),
            value: value.to_string(),
            version: 1,
            metadata,
            created_at: now,
            updated_at: now,
        };
        self.store.insert_secret(&row).await.map_err(|e| match e {
            StoreError::Conflict { what } => EngineError::Conflict(what),
            e => e.into(),
        })?;
        tracing::info!(secret = %row.id, name = %row.name, "secret created");
        Ok(SecretInfo::from(&row))
    }

    /// By id or name.
    pub async fn get_secret(&self, id_or_name: &str) -> Result<SecretInfo> {
        self.store
            .get_secret(id_or_name)
            .await?
            .map(|r| SecretInfo::from(&r))
            .ok_or_else(|| EngineError::SecretNotFound(id_or_name.to_string()))
    }

    pub async fn update_secret(
        &self,
        id_or_name: &str,
        value: &str,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<SecretInfo> {
        validate_secret_value(value)?;
        if let Some(md) = &metadata {
            validate_metadata(md)?;
        }
        let row = self
            .store
            .update_secret(id_or_name, value, metadata.as_ref(), now_ms())
            .await?
            .ok_or_else(|| EngineError::SecretNotFound(id_or_name.to_string()))?;
        tracing::info!(secret = %row.id, version = row.version, "secret updated");
        Ok(SecretInfo::from(&row))
    }

    /// Returns false if there was no such secret.
    pub async fn delete_secret(&self, id_or_name: &str) -> Result<bool> {
        Ok(self.store.delete_secret(id_or_name).await?)
    }

    /// Oldest first; `limit` 1..=100 (default 100).
    pub async fn list_secrets(
        &self,
        limit: Option<usize>,
        next_token: Option<&str>,
    ) -> Result<SecretPage> {
        let limit = limit.unwrap_or(100).clamp(1, 100);
        let after = match next_token {
            Some(t) if !t.is_empty() => Some(decode_token(t)?),
            _ => None,
        };
        let mut rows = self.store.list_secrets(limit as i64 + 1, after).await?;
        let next_token = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|r| encode_token(r.created_at, &r.id))
        } else {
            None
        };
        Ok(SecretPage {
            items: rows.iter().map(SecretInfo::from).collect(),
            next_token,
        })
    }

    fn track(self: &Arc<Self>, row: &SandboxRow, handle: DriverHandle, net_attached: bool) {
        let cancel = CancellationToken::new();
        let live = Live {
            state: row.state,
            handle: handle.clone(),
            end_at_ms: row.end_at,
            access_token: row.envd_access_token.clone(),
            cancel: cancel.clone(),
            cpu_count: row.cpu_count,
            last_cpu: (0, row.started_at),
            net_attached,
        };
        self.live
            .lock()
            .expect("live lock")
            .insert(row.id.clone(), live);
        let engine = Arc::clone(self);
        let id = row.id.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = engine.driver.wait(&handle) => {
                    engine.finish(&id, "exited").await;
                }
                _ = cancel.cancelled() => {}
            }
        });
    }

    /// Remove a sandbox from the live set, tear it down and record why it ended.
    /// Returns false if it was not running.
    async fn finish(&self, id: &str, reason: &str) -> bool {
        // The sandbox stays in the live set as `killing` until it is torn down, so a second
        // kill, the watcher and the reaper all see it is on its way out (and get a refusal).
        let (handle, cancel) = {
            let mut live = self.live.lock().expect("live lock");
            let Some(l) = live.get_mut(id) else {
                return false;
            };
            let Ok(step) = lifecycle::transition(l.state, Operation::Kill) else {
                return false;
            };
            l.state = step.during;
            (l.handle.clone(), l.cancel.clone())
        };
        cancel.cancel();
        // Unconditionally (idempotent): a concurrent network update may have attached a link
        // after this sandbox left the live set.
        self.detach_link(id);
        if let Err(e) = self.driver.stop(&handle).await {
            tracing::error!(sandbox = %id, error = %e, "sandbox teardown failed");
        }
        if let Err(e) = self
            .store
            .set_sandbox_state(id, SandboxState::Dead, Some(reason))
            .await
        {
            tracing::error!(sandbox = %id, error = %e, "recording sandbox end failed");
        }
        let _ = self.store.set_sandbox_driver_handle(id, None).await;
        self.live.lock().expect("live lock").remove(id);
        tracing::info!(sandbox = %id, reason, "sandbox ended");
        true
    }

    fn check_timeout(&self, secs: u64) -> Result<Duration> {
        let max = self.cfg.max_timeout.as_secs();
        if secs > max {
            return Err(EngineError::BadRequest(format!(
                "Timeout cannot be greater than {} hours",
                max / 3600
            )));
        }
        Ok(Duration::from_secs(secs.max(1)))
    }

    /// Ask the lifecycle whether `op` may run on sandbox `id` now and, if it moves the sandbox
    /// through a transient state, put it there. Returns the normalized id and the step.
    fn enter<'a>(&self, id: &'a str, op: Operation) -> Result<(&'a str, Step)> {
        let id = ids::normalize_sandbox_id(id);
        if !ids::is_valid_sandbox_id(id) {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        let mut live = self.live.lock().expect("live lock");
        let entry = live.get_mut(id);
        let state = entry.as_ref().map_or(SandboxState::Dead, |l| l.state);
        let step = lifecycle::transition(state, op).map_err(|reason| refused(id, op, reason))?;
        if let Some(l) = entry {
            l.state = step.during;
        }
        Ok((id, step))
    }

    /// Put a sandbox in `state` at the end of an operation (if it is still live and not being
    /// killed meanwhile).
    fn settle(&self, id: &str, state: SandboxState) {
        if let Some(l) = self.live.lock().expect("live lock").get_mut(id)
            && l.state != SandboxState::Killing
        {
            l.state = state;
        }
    }

    /// The stored record of a sandbox `op` may run on (see [`Self::enter`]).
    async fn running_row(&self, id: &str, op: Operation) -> Result<SandboxRow> {
        let (id, _) = self.enter(id, op)?;
        match self.store.get_sandbox(id).await? {
            Some(row) if row.state != SandboxState::Dead => Ok(row),
            _ => Err(EngineError::SandboxNotFound(id.to_string())),
        }
    }

    /// Is the sandbox in the live set and not on its way out?
    pub fn is_live(&self, id: &str) -> bool {
        self.live
            .lock()
            .expect("live lock")
            .get(id)
            .is_some_and(|l| l.state != SandboxState::Killing)
    }

    pub async fn get(&self, id: &str) -> Result<SandboxInfo> {
        let row = self.running_row(id, Operation::Get).await?;
        Ok(self.info_from_row(&row))
    }

    pub async fn list(&self, req: &ListRequest) -> Result<ListPage> {
        let states = if req.states.is_empty() {
            vec![SandboxState::Running, SandboxState::Paused]
        } else {
            req.states.clone()
        };
        let filter = SandboxFilter {
            states,
            metadata: req.metadata.clone(),
            template_id: req
                .template
                .as_ref()
                .map(|t| self.template(t).map(|t| t.id.clone()).unwrap_or(t.clone())),
            started_after: req.started_after.map(|d| d.timestamp_millis()),
            owner_key_id: None,
        };
        let limit = req.limit.unwrap_or(100).clamp(1, 100);
        let after = match &req.next_token {
            Some(t) if !t.is_empty() => Some(decode_token(t)?),
            _ => None,
        };
        let mut rows = self
            .store
            .list_sandboxes(&filter, Some(limit as i64 + 1), req.order_desc, after)
            .await?;
        let next_token = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|r| encode_token(r.started_at, &r.id))
        } else {
            None
        };
        let total_running = self
            .store
            .count_sandboxes(&SandboxFilter {
                states: vec![SandboxState::Running],
                ..Default::default()
            })
            .await?;
        Ok(ListPage {
            items: rows.iter().map(|r| self.info_from_row(r)).collect(),
            next_token,
            total_running,
        })
    }

    pub async fn kill(&self, id: &str) -> Result<bool> {
        let id = ids::normalize_sandbox_id(id);
        Ok(self.finish(id, "killed").await)
    }

    /// `POST /sandboxes/{id}/timeout`: end_at = now + timeout (may shorten).
    pub async fn set_timeout(&self, id: &str, secs: u64) -> Result<()> {
        let row = self.running_row(id, Operation::SetTimeout).await?;
        let timeout = self.check_timeout(secs)?;
        let end_at = now_ms() + timeout.as_millis() as i64;
        self.set_end_at(&row.id, end_at).await
    }

    /// Connect to a running sandbox: extends the TTL to at least now + timeout, never shortens.
    /// Returns the info and whether the sandbox had to be resumed (never, until pause exists).
    pub async fn connect(&self, id: &str, secs: Option<u64>) -> Result<(SandboxInfo, bool)> {
        let (nid, step) = self.enter(id, Operation::Connect)?;
        if step.during == SandboxState::Resuming {
            // Nothing can be paused until the pause verb exists (a paused record adopted from
            // a newer server, say): leave it paused and say so rather than half-resume it.
            self.settle(nid, SandboxState::Paused);
            return Err(EngineError::Unsupported(Operation::Resume));
        }
        let row = self.running_row(nid, Operation::Get).await?;
        let timeout = self.check_timeout(secs.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        let wanted = now_ms() + timeout.as_millis() as i64;
        if wanted > row.end_at {
            self.set_end_at(&row.id, wanted).await?;
        }
        let row = self.running_row(&row.id, Operation::Get).await?;
        Ok((self.info_from_row(&row), false))
    }

    async fn set_end_at(&self, id: &str, end_at: i64) -> Result<()> {
        {
            let mut live = self.live.lock().expect("live lock");
            let Some(l) = live.get_mut(id) else {
                return Err(EngineError::SandboxNotFound(id.to_string()));
            };
            l.end_at_ms = end_at;
        }
        self.store.set_sandbox_end_at(id, end_at).await?;
        Ok(())
    }

    pub async fn usage(&self, id: &str) -> Result<Usage> {
        let row = self.running_row(id, Operation::Metrics).await?;
        let handle = self.handle(&row.id)?;
        let u = self.driver.usage(&handle).await?;
        let now = now_ms();
        let mut pct = 0.0;
        if let Some(l) = self.live.lock().expect("live lock").get_mut(&row.id) {
            let (prev_ns, prev_ms) = l.last_cpu;
            let wall_ns = ((now - prev_ms).max(1) as f64) * 1e6;
            pct = (u.cpu_usage_ns.saturating_sub(prev_ns) as f64
                / wall_ns
                / l.cpu_count.max(1) as f64
                * 100.0)
                .clamp(0.0, 100.0);
            l.last_cpu = (u.cpu_usage_ns, now);
        }
        Ok(Usage {
            timestamp: ms_to_dt(now),
            cpu_count: row.cpu_count,
            cpu_used_pct: (pct * 100.0).round() / 100.0,
            mem_used: u.mem_used_bytes,
            mem_total: if u.mem_limit_bytes > 0 {
                u.mem_limit_bytes
            } else {
                row.memory_mb as u64 * 1024 * 1024
            },
            mem_cache: u.mem_cache_bytes,
            disk_used: u.disk_used_bytes,
            disk_total: if u.disk_total_bytes > 0 {
                u.disk_total_bytes
            } else {
                row.disk_size_mb as u64 * 1024 * 1024
            },
        })
    }

    fn handle(&self, id: &str) -> Result<DriverHandle> {
        self.live
            .lock()
            .expect("live lock")
            .get(id)
            .map(|l| l.handle.clone())
            .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))
    }

    /// A fresh byte stream to a running sandbox's agent (for the routing proxy).
    pub async fn agent_stream(&self, id: &str) -> Result<AgentStream> {
        let (id, _) = self.enter(id, Operation::AgentTraffic)?;
        let handle = self.handle(id)?;
        Ok(self.driver.connect(&handle).await?)
    }

    /// Find the sandbox whose access token produced a signed `/files` URL (download/upload URLs
    /// carry no sandbox id when the SDK uses one sandbox URL for everything).
    pub fn find_by_file_signature(
        &self,
        path: &str,
        operation: FileOperation,
        username: &str,
        signature: &str,
        expiration: Option<i64>,
    ) -> Option<String> {
        let live = self.live.lock().expect("live lock");
        live.iter().find_map(|(id, l)| {
            let token = l.access_token.as_deref()?;
            let expected = file_signature(path, operation, username, token, expiration);
            keys::constant_time_eq(&expected, signature).then(|| id.clone())
        })
    }

    fn info_from_row(&self, row: &SandboxRow) -> SandboxInfo {
        // The live set is ahead of the store (TTL changes, transient states).
        let (end_at, state) = self
            .live
            .lock()
            .expect("live lock")
            .get(&row.id)
            .map_or((row.end_at, row.state), |l| (l.end_at_ms, l.state));
        SandboxInfo {
            id: row.id.clone(),
            template_id: row.template_id.clone(),
            alias: row.alias.clone(),
            metadata: row.metadata.clone(),
            started_at: ms_to_dt(row.started_at),
            end_at: ms_to_dt(end_at),
            cpu_count: row.cpu_count,
            memory_mb: row.memory_mb,
            disk_size_mb: row.disk_size_mb,
            state: lifecycle::e2b_state(state),
            envd_access_token: row.envd_access_token.clone(),
            envd_version: self.cfg.envd_version.clone(),
            allow_internet_access: row.allow_internet,
            network: row
                .network
                .as_deref()
                .and_then(|n| serde_json::from_str(n).ok()),
        }
    }

    // ----- background work -----

    /// Re-adopt sandboxes that survived a server restart, mark the rest dead and reclaim any
    /// driver leftovers. Call once before serving.
    pub async fn recover(self: &Arc<Self>) -> Result<usize> {
        let rows = self
            .store
            .list_sandboxes(
                &SandboxFilter {
                    states: vec![SandboxState::Running, SandboxState::Paused],
                    ..Default::default()
                },
                None,
                false,
                None,
            )
            .await?;
        let mut keep = Vec::new();
        for row in rows {
            let handle = row
                .driver_handle
                .as_deref()
                .and_then(|h| serde_json::from_str::<DriverHandle>(h).ok());
            match handle {
                Some(h)
                    if h.driver == self.driver.name()
                        && row.end_at > now_ms()
                        && self.driver.adopt(&h).await =>
                {
                    tracing::info!(sandbox = %row.id, "re-adopted running sandbox");
                    keep.push(h.clone());
                    // The links died with the previous server process (it held the TUN fds,
                    // so the devices are gone): give sandboxes with egress a new one.
                    let net_attached = self.reattach_after_restart(&row, &h).await;
                    self.track(&row, h, net_attached);
                }
                _ => {
                    tracing::info!(sandbox = %row.id, "sandbox did not survive the restart");
                    self.store
                        .set_sandbox_state(&row.id, SandboxState::Dead, Some("lost on restart"))
                        .await?;
                    self.store.set_sandbox_driver_handle(&row.id, None).await?;
                }
            }
        }
        let reclaimed = self.driver.reclaim_orphans(&keep).await?;
        if reclaimed > 0 {
            tracing::info!(reclaimed, "cleaned up leftover sandboxes");
        }
        Ok(keep.len())
    }

    async fn reattach_after_restart(&self, row: &SandboxRow, h: &DriverHandle) -> bool {
        let net: SandboxNetwork = row
            .network
            .as_deref()
            .and_then(|n| serde_json::from_str(n).ok())
            .unwrap_or_default();
        let policy = net.policy(row.allow_internet);
        if !network::egress_allowed(&policy) {
            return false;
        }
        match self.attach_link(&row.id, h, policy).await {
            Ok(()) => true,
            Err(e) => {
                // The sandbox keeps running without network (fail closed) rather than being
                // killed; a PUT /network retries.
                tracing::error!(sandbox = %row.id, error = %e, "could not restore the network link after a restart");
                false
            }
        }
    }

    /// Start the reaper and the warm-pool filler.
    pub fn start_background(self: &Arc<Self>) {
        let engine = Arc::clone(self);
        tokio::spawn(async move { engine.reaper().await });
        let engine = Arc::clone(self);
        let filler = tokio::spawn(async move { engine.pool_filler().await });
        *self.filler.lock().expect("filler lock") = Some(filler);
    }

    async fn reaper(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.reap_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_gc = now_ms();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shutdown.cancelled() => return,
            }
            let now = now_ms();
            let expired: Vec<String> = self
                .live
                .lock()
                .expect("live lock")
                .iter()
                .filter(|(_, l)| l.end_at_ms <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                self.finish(&id, "timeout").await;
            }
            if now - last_gc > 60_000 {
                last_gc = now;
                let cutoff = now - self.cfg.dead_retention.as_millis() as i64;
                if let Err(e) = self.store.delete_dead_sandboxes_before(cutoff).await {
                    tracing::warn!(error = %e, "pruning dead sandbox records failed");
                }
                let cutoff = now - self.cfg.audit_retention.as_millis() as i64;
                if let Err(e) = self.store.delete_egress_events_before(cutoff).await {
                    tracing::warn!(error = %e, "pruning egress audit events failed");
                }
            }
        }
    }

    async fn pool_filler(self: Arc<Self>) {
        loop {
            for t in self.templates() {
                loop {
                    if self.shutdown.is_cancelled() {
                        return;
                    }
                    let have = self
                        .pools
                        .lock()
                        .expect("pool lock")
                        .get(&t.id)
                        .map_or(0, |q| q.len());
                    if have >= self.cfg.pool_size {
                        break;
                    }
                    match self.driver.start(&t.spec()).await {
                        Ok(h) if self.shutdown.is_cancelled() => {
                            // Started while shutting down: nobody will claim it.
                            let _ = self.driver.stop(&h).await;
                            return;
                        }
                        Ok(h) => self
                            .pools
                            .lock()
                            .expect("pool lock")
                            .entry(t.id.clone())
                            .or_default()
                            .push_back(h),
                        Err(e) => {
                            tracing::warn!(template = %t.id, error = %e, "warm pool: starting a sandbox failed");
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            break;
                        }
                    }
                }
            }
            tokio::select! {
                _ = self.pool_wakeup.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Stop background work and warm-pool members. Running sandboxes keep running so the next
    /// server start re-adopts them.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let filler = self.filler.lock().expect("filler lock").take();
        if let Some(f) = filler {
            // Lets a start in flight finish and stop its sandbox (bounded by the driver's own
            // start timeout).
            let _ = f.await;
        }
        let pooled: Vec<DriverHandle> = self
            .pools
            .lock()
            .expect("pool lock")
            .drain()
            .flat_map(|(_, q)| q)
            .collect();
        for h in pooled {
            let _ = self.driver.stop(&h).await;
        }
    }

    pub fn pool_len(&self, template: &str) -> usize {
        self.pools
            .lock()
            .expect("pool lock")
            .get(template)
            .map_or(0, |q| q.len())
    }
}

/// The engine error for a refused operation: an ended sandbox is simply not found (the 404
/// every SDK expects); anything else names the operation, the sandbox and why.
fn refused(id: &str, op: Operation, reason: Refusal) -> EngineError {
    match reason {
        Refusal::Ended => EngineError::SandboxNotFound(id.to_string()),
        reason => EngineError::Refused {
            id: id.to_string(),
            op,
            reason,
        },
    }
}

fn encode_token(started_at: i64, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{started_at}:{id}"))
}

fn decode_token(t: &str) -> Result<(i64, String)> {
    let bad = || {
        EngineError::BadRequest(
            "Invalid nextToken: pass the X-Next-Token of the previous page".into(),
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .map_err(|_| bad())?;
    let s = String::from_utf8(raw).map_err(|_| bad())?;
    let (ts, id) = s.split_once(':').ok_or_else(bad)?;
    Ok((ts.parse().map_err(|_| bad())?, id.to_string()))
}

fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(EngineError::BadRequest(format!(
                "Invalid environment variable name {k:?}: names must be non-empty and contain no '=' or NUL"
            )));
        }
    }
    if env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > 1 << 20 {
        return Err(EngineError::BadRequest(
            "Environment variables exceed 1 MiB in total".into(),
        ));
    }
    Ok(())
}

fn validate_secret_value(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > 64 * 1024 || value.contains(['\r', '\n', '\0']) {
        return Err(EngineError::BadRequest(
            "Secret value must be 1 byte to 64 KiB without CR, LF or NUL (it is sent in HTTP headers)"
                .into(),
        ));
    }
    Ok(())
}

fn validate_metadata(md: &BTreeMap<String, String>) -> Result<()> {
    if md.len() > 256 || md.iter().any(|(k, v)| k.len() > 1024 || v.len() > 4096) {
        return Err(EngineError::BadRequest(
            "Metadata too large: at most 256 entries, keys ≤ 1 KiB and values ≤ 4 KiB".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let t = encode_token(1234, "abc");
        assert_eq!(decode_token(&t).unwrap(), (1234, "abc".to_string()));
        assert!(decode_token("!!!").is_err());
        assert!(
            decode_token(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("x")).is_err()
        );
    }

    #[test]
    fn env_validation() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "1".to_string());
        assert!(validate_env(&env).is_ok());
        env.insert("B=C".to_string(), "1".to_string());
        assert!(validate_env(&env).is_err());
    }
}
