//! What the engine's verbs take and give back: the engine-owned request and answer types
//! front ends translate to and from their wire formats.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bulkhead_store::SecretRow;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::clock::ms_to_dt;
use crate::node::driver::SandboxSpec;
use crate::node::network::SandboxNetwork;
use crate::sandbox::lifecycle::SandboxState;

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
    /// For templates built through the Template API: the user, workdir, env vars and start
    /// command their sandboxes run with. None: E2B's defaults (`user`, no start command).
    pub runtime: Option<Arc<TemplateRuntime>>,
}

/// How sandboxes of a built template start (the last USER/WORKDIR/ENV of its build, and its
/// start and ready commands).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TemplateRuntime {
    pub user: String,
    /// Absolute; None: the user's home.
    pub workdir: Option<String>,
    pub envs: BTreeMap<String, String>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

impl TemplateInfo {
    /// What a sandbox of this template is started with.
    pub fn spec(&self) -> SandboxSpec {
        SandboxSpec {
            template_id: self.id.clone(),
            rootfs: self.rootfs.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            pids_max: self.pids_max,
            disk_mb: self.disk_size_mb,
            volumes: Vec::new(),
        }
    }
}

/// Which of E2B's create calls a request came through: `POST /v2/sandboxes` is always secured
/// (the sandbox gets an envd access token), the older `POST /sandboxes` only when asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CreateGeneration {
    #[default]
    V1,
    V2,
}

#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    /// Template id or alias (`base` when empty).
    pub template: String,
    /// TTL in seconds.
    pub timeout: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    /// The client's `secure` flag (E2B's v1 create); `None` = secure, as the SDKs default.
    pub secure: Option<bool>,
    /// Which create call the request came through.
    pub generation: CreateGeneration,
    /// E2B `allow_internet_access`; None = the server's default.
    pub allow_internet_access: Option<bool>,
    /// E2B `network` (allowOut, denyOut, rules).
    pub network: Option<SandboxNetwork>,
    /// E2B `volumeMounts`: volumes (by name) to mount read-write at these paths.
    pub volume_mounts: Vec<crate::volume::types::MountRequest>,
    /// What the TTL's end does and whether traffic resumes it (E2B `autoPause`,
    /// `autoPauseMemory`, `autoResume`, `lifecycle`).
    pub lifecycle: LifecyclePolicy,
}

/// What happens at the end of a sandbox's TTL (E2B `SandboxOnTimeout`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    #[default]
    Kill,
    Pause,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "kill" => Some(OnTimeout::Kill),
            "pause" => Some(OnTimeout::Pause),
            _ => None,
        }
    }
}

/// A sandbox's lifecycle settings (E2B `SandboxLifecycle` plus the auto-pause's memory mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LifecyclePolicy {
    pub on_timeout: OnTimeout,
    /// The first envd request to the paused sandbox resumes it.
    pub auto_resume: bool,
    /// An auto-pause keeps memory (E2B `autoPauseMemory`, default true).
    pub pause_memory: bool,
}

impl Default for LifecyclePolicy {
    fn default() -> Self {
        LifecyclePolicy {
            on_timeout: OnTimeout::Kill,
            auto_resume: false,
            pause_memory: true,
        }
    }
}

/// A snapshot as shown to clients (E2B `SnapshotInfo`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotInfo {
    /// `<name>:default` when named, else `<id>:default` (E2B's template id with its tag).
    pub snapshot_id: String,
    /// Full names (`<name>:default`); empty when unnamed.
    pub names: Vec<String>,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    /// Whether sandboxes created from it get its memory (else they boot on its files).
    pub memory: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct SnapshotPage {
    pub items: Vec<SnapshotInfo>,
    pub next_token: Option<String>,
}

/// `POST /sandboxes/{id}/connect` and `/resume`: the new TTL and how to resume a paused one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeRequest {
    /// TTL in seconds from now; `None` = the server default.
    pub timeout: Option<u64>,
    /// false: boot afresh on the saved filesystem, ignoring saved memory (E2B `memory`).
    pub memory: bool,
}

impl Default for ResumeRequest {
    fn default() -> Self {
        ResumeRequest {
            timeout: None,
            memory: true,
        }
    }
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
    pub lifecycle: LifecyclePolicy,
    /// For a paused sandbox: whether its checkpoint kept memory (E2B `pauseMode` full /
    /// filesystem).
    pub pause_memory: Option<bool>,
    /// The domain its ports are served under (`{port}-{id}.{domain}`), when the operator
    /// configured one.
    pub domain: Option<String>,
    /// The cluster node it runs on (its `--node-id`); None on a single machine.
    pub node: Option<String>,
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

impl CreateRequest {
    /// Does the new sandbox get an envd access token?
    pub fn is_secure(&self) -> bool {
        self.generation == CreateGeneration::V2 || self.secure.unwrap_or(true)
    }
}

/// Who is calling: the identity every engine verb is given, so limits and ownership attach in
/// the engine and not in the front ends. Sandboxes, volumes and usage belong to the team:
/// every key of a team sees them, no key of another team does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Id of the API key that authenticated the request.
    pub key_id: String,
    /// The team the key belongs to (`default` for keys made before teams).
    pub team_id: String,
}

/// An API key as listed (never the key itself, which is shown once at creation).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub name: String,
    /// First characters of the key (e.g. `e2b_1a2b3c`), to recognise it.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub team_id: String,
    /// Last request with it, to the minute (see `Engine::authenticate`).
    pub last_used_at: Option<DateTime<Utc>>,
}

impl ApiKey {
    /// The identity a request authenticated with this key acts as.
    pub fn caller(&self) -> Caller {
        Caller {
            key_id: self.id.clone(),
            team_id: self.team_id.clone(),
        }
    }
}

impl From<&bulkhead_store::ApiKeyRow> for ApiKey {
    fn from(r: &bulkhead_store::ApiKeyRow) -> Self {
        ApiKey {
            id: r.id.clone(),
            name: r.name.clone(),
            prefix: r.prefix.clone(),
            created_at: ms_to_dt(r.created_at),
            revoked_at: r.revoked_at.map(ms_to_dt),
            team_id: r.team_id.clone(),
            last_used_at: r.last_used_at.map(ms_to_dt),
        }
    }
}

/// One egress decision of a sandbox (the audit trail).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EgressEvent {
    pub sandbox_id: String,
    pub at: DateTime<Utc>,
    /// `tcp` | `tls` | `http` | `dns`.
    pub protocol: String,
    pub host: Option<String>,
    pub ip: Option<String>,
    pub port: i64,
    pub allowed: bool,
    /// The rule that decided.
    pub rule: String,
    pub bytes_out: i64,
    pub bytes_in: i64,
}

impl From<&bulkhead_store::EgressEventRow> for EgressEvent {
    fn from(e: &bulkhead_store::EgressEventRow) -> Self {
        EgressEvent {
            sandbox_id: e.sandbox_id.clone(),
            at: ms_to_dt(e.at),
            protocol: e.protocol.clone(),
            host: e.host.clone(),
            ip: e.ip.clone(),
            port: e.port,
            allowed: e.allowed,
            rule: e.rule.clone(),
            bytes_out: e.bytes_out,
            bytes_in: e.bytes_in,
        }
    }
}

/// Where a template's build stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateStatus {
    Building,
    Ready,
    Error,
}

impl TemplateStatus {
    /// E2B's `buildStatus` value.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateStatus::Building => "building",
            TemplateStatus::Ready => "ready",
            TemplateStatus::Error => "error",
        }
    }
}

impl TemplateInfo {
    /// A registered template's rootfs is built, so it is ready (builds in progress are not
    /// registered yet).
    pub fn status(&self) -> TemplateStatus {
        TemplateStatus::Ready
    }
}
