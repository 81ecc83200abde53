//! E2B control-plane JSON shapes (field names exactly as on the wire).

use std::collections::BTreeMap;

use bulkhead_engine::{NetworkRule, SandboxInfo, SandboxNetwork, SecretInfo};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

pub const CLIENT_ID: &str = "bulkhead";

/// `NewSandbox` (POST /sandboxes) and `NewSandboxV2` (POST /v2/sandboxes). Unknown fields are
/// ignored so newer SDKs keep working.
#[derive(Debug, Serialize, Deserialize, Default)]
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
}

/// E2B `SandboxVolumeMount`: a volume (by name) and where it is mounted.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct SandboxVolumeMount {
    pub name: String,
    pub path: String,
}

/// `SandboxNetworkConfig` (create) and `SandboxNetworkUpdateConfig` (PUT …/network). Inbound
/// settings (`allowPublicTraffic`, `maskRequestHost`, `httpsPorts`) and `dnsServers` (the proxy
/// answers DNS itself) are accepted and ignored; a SOCKS5 `egressProxy` is refused.
#[derive(Debug, Serialize, Deserialize, Default)]
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
#[derive(Debug, Deserialize, Default)]
pub struct NewSecret {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `SecretUpdate` (POST /secrets/{id}).
#[derive(Debug, Deserialize, Default)]
pub struct SecretUpdate {
    #[serde(default)]
    pub value: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `Secret`: metadata only, the value is write-only.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    pub name: String,
    pub current_version: i64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
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
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressEvent {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
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

#[derive(Debug, Deserialize, Default)]
pub struct TimeoutBody {
    pub timeout: Option<i64>,
}

#[derive(Debug, Deserialize, Default)]
pub struct RefreshBody {
    pub duration: Option<i64>,
}

/// `Sandbox`: response of create / connect.
#[derive(Debug, Serialize, Deserialize)]
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
            client_id: CLIENT_ID.to_string(),
            envd_version: s.envd_version.clone(),
            envd_access_token: s.envd_access_token.clone(),
            traffic_access_token: None,
            domain: None,
            alias: s.alias.clone(),
        }
    }
}

/// `SandboxDetail` (GET /sandboxes/{id}) and `ListedSandbox` (lists) — the detail is a superset.
#[derive(Debug, Serialize, Deserialize)]
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
    pub started_at: String,
    pub end_at: String,
    pub envd_version: String,
    pub cpu_count: i64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: i64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: i64,
    pub state: String,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub allow_internet_access: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<SandboxNetwork>,
    pub lifecycle: serde_json::Value,
    pub volume_mounts: Vec<serde_json::Value>,
}

impl SandboxDetail {
    pub fn new(s: &SandboxInfo, include_token: bool) -> Self {
        SandboxDetail {
            sandbox_id: s.id.clone(),
            template_id: s.template_id.clone(),
            client_id: CLIENT_ID.to_string(),
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
            domain: None,
            allow_internet_access: s.allow_internet_access,
            network: s.network.clone(),
            lifecycle: serde_json::json!({ "onTimeout": "kill", "autoResume": false }),
            volume_mounts: Vec::new(),
        }
    }
}

pub fn rfc3339(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `SandboxMetric`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
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
