//! E2B control-plane JSON shapes (field names exactly as on the wire).

use std::collections::BTreeMap;

use bulkhead_engine::SandboxInfo;
use serde::{Deserialize, Serialize};

pub const CLIENT_ID: &str = "bulkhead";

/// `NewSandbox` (POST /sandboxes) and `NewSandboxV2` (POST /v2/sandboxes). Unknown fields are
/// ignored so newer SDKs keep working.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    pub timeout: Option<i64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    pub secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
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
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
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
            client_id: CLIENT_ID,
            envd_version: s.envd_version.clone(),
            envd_access_token: s.envd_access_token.clone(),
            traffic_access_token: None,
            domain: None,
            alias: s.alias.clone(),
        }
    }
}

/// `SandboxDetail` (GET /sandboxes/{id}) and `ListedSandbox` (lists) — the detail is a superset.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
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
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub allow_internet_access: bool,
    pub lifecycle: serde_json::Value,
    pub volume_mounts: Vec<serde_json::Value>,
}

impl SandboxDetail {
    pub fn new(s: &SandboxInfo, include_token: bool) -> Self {
        SandboxDetail {
            sandbox_id: s.id.clone(),
            template_id: s.template_id.clone(),
            client_id: CLIENT_ID,
            alias: s.alias.clone(),
            started_at: rfc3339(&s.started_at),
            end_at: rfc3339(&s.end_at),
            envd_version: s.envd_version.clone(),
            cpu_count: s.cpu_count,
            memory_mb: s.memory_mb,
            disk_size_mb: s.disk_size_mb,
            state: s.state,
            metadata: s.metadata.clone(),
            envd_access_token: if include_token {
                s.envd_access_token.clone()
            } else {
                None
            },
            domain: None,
            allow_internet_access: false,
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
