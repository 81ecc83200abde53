//! E2B control-plane JSON shapes (field names exactly as on the wire).

use std::collections::BTreeMap;

use bulkhead_engine::{
    LifecyclePolicy, NetworkRule, OnTimeout, SandboxInfo, SandboxNetwork, SecretInfo,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ApiError;

pub const CLIENT_ID: &str = "bulkhead";

/// E2B's `clientID`: the node a sandbox runs on in a cluster (its `--node-id`), else
/// [`CLIENT_ID`].
fn client_id(s: &SandboxInfo) -> String {
    s.node.clone().unwrap_or_else(|| CLIENT_ID.to_string())
}

/// `NewSandbox` (POST /sandboxes) and `NewSandboxV2` (POST /v2/sandboxes). Unknown fields are
/// ignored so newer SDKs keep working.
#[derive(Debug, Serialize, Deserialize, Default, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// `volumeMounts: [{name, path}]` (E2B `SandboxVolumeMount`).
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<SandboxVolumeMount>>,
    /// Pause instead of kill at the TTL's end (what the SDKs send for `lifecycle.on_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// The auto-pause keeps memory (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    /// The lifecycle as one object (`onTimeout`/`on_timeout`, `autoResume`/`auto_resume`),
    /// accepted too; the fields above win when both are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleBody>,
}

/// E2B `SandboxVolumeMount`: a volume (by name) and where it is mounted.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq, ToSchema)]
pub struct SandboxVolumeMount {
    pub name: String,
    pub path: String,
}

/// `SandboxAutoResumeConfig`.
#[derive(Debug, Serialize, Deserialize, Default, ToSchema)]
#[schema(as = SandboxAutoResumeConfig)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: bool,
}

/// A create body's `lifecycle` object.
#[derive(Debug, Serialize, Deserialize, Default, ToSchema)]
#[schema(as = NewSandboxLifecycle)]
pub struct LifecycleBody {
    #[serde(default, alias = "onTimeout", skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
    #[serde(default, alias = "autoResume", skip_serializing_if = "Option::is_none")]
    /// A boolean or `{"enabled": bool}`.
    #[schema(value_type = Option<Object>)]
    pub auto_resume: Option<serde_json::Value>,
}

impl NewSandbox {
    /// The engine's lifecycle settings from either spelling (E2B's rules: auto-resume needs
    /// `on_timeout: pause`, and never with a filesystem-only auto-pause).
    pub fn lifecycle(&self) -> Result<LifecyclePolicy, ApiError> {
        let mut p = LifecyclePolicy::default();
        if let Some(l) = &self.lifecycle {
            if let Some(t) = &l.on_timeout {
                p.on_timeout = OnTimeout::parse(t).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "lifecycle.on_timeout must be kill or pause (got {t:?})"
                    ))
                })?;
            }
            match &l.auto_resume {
                Some(serde_json::Value::Bool(b)) => p.auto_resume = *b,
                Some(v) => p.auto_resume = v["enabled"].as_bool().unwrap_or(false),
                None => {}
            }
        }
        if let Some(pause) = self.auto_pause {
            p.on_timeout = if pause {
                OnTimeout::Pause
            } else {
                OnTimeout::Kill
            };
        }
        if let Some(m) = self.auto_pause_memory {
            p.pause_memory = m;
        }
        if let Some(r) = &self.auto_resume {
            p.auto_resume = r.enabled;
        }
        if p.auto_resume && p.on_timeout != OnTimeout::Pause {
            return Err(ApiError::bad_request(
                "autoResume needs autoPause (lifecycle.on_timeout: pause)",
            ));
        }
        if p.auto_resume && !p.pause_memory {
            return Err(ApiError::bad_request(
                "autoResume cannot be used with autoPauseMemory false: a filesystem-only pause is resumed with connect",
            ));
        }
        Ok(p)
    }
}

/// `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (PUT …/network). Inbound
/// settings (`allowPublicTraffic`, `maskRequestHost`, `httpsPorts`) and `dnsServers` (the proxy
/// answers DNS itself) are accepted and ignored; a SOCKS5 `egressProxy` is refused.
#[derive(Debug, Serialize, Deserialize, Default, ToSchema)]
#[schema(as = SandboxNetworkUpdateConfig)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<BTreeMap<String, Vec<NetworkRule>>>,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Refused when set: sandbox traffic leaves only through Bulkhead's own egress proxy.
    #[schema(value_type = Option<Object>)]
    pub egress_proxy: Option<serde_json::Value>,
    /// Only in the update body (snake_case on the wire, like create's top-level field).
    #[serde(default, rename = "allow_internet_access")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
}

impl NetworkConfig {
    pub fn into_engine(self) -> Result<SandboxNetwork, ApiError> {
        if self.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
            return Err(ApiError::bad_request(
                "network.egressProxy is not supported by Bulkhead: sandbox traffic leaves only \
                 through its own egress proxy; remove egressProxy",
            ));
        }
        Ok(SandboxNetwork {
            allow_out: self.allow_out.unwrap_or_default(),
            deny_out: self.deny_out.unwrap_or_default(),
            rules: self.rules.unwrap_or_default(),
        })
    }
}

/// `NewSecret` (POST /secrets).
#[derive(Debug, Deserialize, Default, ToSchema)]
pub struct NewSecret {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `SecretUpdate` (POST /secrets/{id}).
#[derive(Debug, Deserialize, Default, ToSchema)]
pub struct SecretUpdate {
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `Secret`: metadata only, the value is write-only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    pub name: String,
    pub current_version: i64,
    pub metadata: BTreeMap<String, String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<&SecretInfo> for Secret {
    fn from(s: &SecretInfo) -> Self {
        Secret {
            secret_id: s.id.clone(),
            name: s.name.clone(),
            current_version: s.version,
            metadata: s.metadata.clone(),
            created_at: rfc3339(&s.created_at),
            updated_at: rfc3339(&s.updated_at),
        }
    }
}

/// One egress decision (Bulkhead-specific `GET /sandboxes/{id}/network/events`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressEvent {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[schema(format = DateTime)]
    pub timestamp: String,
    pub protocol: String,
    pub host: Option<String>,
    pub ip: Option<String>,
    pub port: i64,
    pub allowed: bool,
    pub rule: String,
    pub bytes_out: i64,
    pub bytes_in: i64,
}

impl From<&bulkhead_engine::EgressEvent> for EgressEvent {
    fn from(e: &bulkhead_engine::EgressEvent) -> Self {
        EgressEvent {
            sandbox_id: e.sandbox_id.clone(),
            timestamp: rfc3339(&e.at),
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

/// `ConnectSandbox` / `ConnectSandboxV2`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = ConnectSandbox)]
pub struct ConnectBody {
    pub timeout: Option<i64>,
    /// false: resume a paused sandbox by booting afresh on its files.
    pub memory: Option<bool>,
}

/// `SandboxPauseRequest` (`requireHealthyGuest` is accepted and ignored: the engine always
/// needs the agent to answer after a restore).
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = SandboxPauseRequest)]
pub struct PauseBody {
    pub memory: Option<bool>,
}

/// `ResumedSandbox` (older resume; `autoPause` is accepted and ignored).
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = ResumedSandbox)]
pub struct ResumeBody {
    pub timeout: Option<i64>,
    pub memory: Option<bool>,
}

/// `SandboxSnapshotRequest`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = SandboxSnapshotRequest)]
pub struct SnapshotBody {
    pub name: Option<String>,
    pub memory: Option<bool>,
}

/// `SandboxForkRequest`.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = SandboxForkRequest)]
pub struct ForkBody {
    pub timeout: Option<i64>,
    pub count: Option<i64>,
}

/// `SnapshotInfo`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

impl From<&bulkhead_engine::SnapshotInfo> for SnapshotInfo {
    fn from(s: &bulkhead_engine::SnapshotInfo) -> Self {
        SnapshotInfo {
            snapshot_id: s.snapshot_id.clone(),
            names: s.names.clone(),
        }
    }
}

#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = SandboxTimeoutRequest)]
pub struct TimeoutBody {
    pub timeout: Option<i64>,
}

#[derive(Debug, Deserialize, Default, ToSchema)]
#[schema(as = SandboxRefreshRequest)]
pub struct RefreshBody {
    pub duration: Option<i64>,
}

/// `Sandbox`: response of create / connect.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
}

impl From<&SandboxInfo> for Sandbox {
    fn from(s: &SandboxInfo) -> Self {
        Sandbox {
            sandbox_id: s.id.clone(),
            template_id: s.template_id.clone(),
            client_id: client_id(s),
            envd_version: s.envd_version.clone(),
            envd_access_token: s.envd_access_token.clone(),
            // The official code-interpreter SDKs send this (not the envd token) on their
            // `/contexts` calls, and port 49999 needs one of the two on every route.
            traffic_access_token: s
                .envd_access_token
                .as_deref()
                .map(bulkhead_envd::rest::traffic_access_token),
            domain: s.domain.clone(),
            alias: s.alias.clone(),
        }
    }
}

/// `SandboxDetail` (GET /sandboxes/{id}) and `ListedSandbox` (lists) — the detail is a superset.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[schema(format = DateTime)]
    pub started_at: String,
    #[schema(format = DateTime)]
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: i64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: i64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: i64,
    /// `running` or `paused` (E2B's states), or Bulkhead's transient `starting`, `pausing`,
    /// `resuming`.
    #[schema(example = "running")]
    pub state: String,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub allow_internet_access: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    pub lifecycle: SandboxLifecycle,
    /// `full` or `filesystem`: what a paused sandbox's checkpoint kept (only when paused).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "full")]
    pub pause_mode: Option<String>,
    pub volume_mounts: Vec<SandboxVolumeMount>,
}

/// E2B `SandboxLifecycle`: what happens at the TTL's end.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    /// `kill` or `pause`.
    #[schema(example = "kill")]
    pub on_timeout: String,
    pub auto_resume: bool,
}

impl SandboxDetail {
    pub fn new(s: &SandboxInfo, include_token: bool) -> Self {
        SandboxDetail {
            sandbox_id: s.id.clone(),
            template_id: s.template_id.clone(),
            client_id: client_id(s),
            alias: s.alias.clone(),
            started_at: rfc3339(&s.started_at),
            end_at: rfc3339(&s.end_at),
            envd_version: s.envd_version.clone(),
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            disk_size_mb: s.disk_size_mb,
            state: s.state.to_string(),
            metadata: s.metadata.clone(),
            envd_access_token: if include_token {
                s.envd_access_token.clone()
            } else {
                None
            },
            domain: s.domain.clone(),
            allow_internet_access: s.allow_internet_access,
            network: s.network.clone(),
            lifecycle: SandboxLifecycle {
                on_timeout: s.lifecycle.on_timeout.as_str().to_string(),
                auto_resume: s.lifecycle.auto_resume,
            },
            pause_mode: s
                .pause_memory
                .map(|m| if m { "full" } else { "filesystem" }.to_string()),
            volume_mounts: Vec::new(),
        }
    }
}

pub fn rfc3339(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `SandboxMetric`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    #[schema(format = DateTime)]
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: i64,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

impl From<&bulkhead_engine::Usage> for SandboxMetric {
    fn from(u: &bulkhead_engine::Usage) -> Self {
        SandboxMetric {
            timestamp: rfc3339(&u.timestamp),
            timestamp_unix: u.timestamp.timestamp(),
            cpu_count: u.cpu_count,
            cpu_used_pct: u.cpu_used_pct,
            mem_used: u.mem_used,
            mem_total: u.mem_total,
            mem_cache: u.mem_cache,
            disk_used: u.disk_used,
            disk_total: u.disk_total,
        }
    }
}

/// E2B `SandboxesWithMetrics` (GET /sandboxes/metrics): the latest metric per sandbox ID.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

/// E2B `Template` as listed by GET /templates (the fields Bulkhead knows).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Template)]
#[serde(rename_all = "camelCase")]
pub struct TemplateListed {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    /// `ready`, `building` or `error`.
    #[schema(example = "ready")]
    pub build_status: String,
}

/// E2B `SandboxForkResult`: one fork's sandbox, or why it failed.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = SandboxForkResult)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ForkError>,
}

/// A failed fork's status and message (E2B's `Error` without `error_code`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkError {
    pub code: u16,
    pub message: String,
}
