//! The audit record of one egress decision and the sink that receives it. A leaf, so the
//! per-sandbox context and the connection helpers can both emit events without importing
//! each other.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One egress decision. `bytes_out` = sandbox → upstream, `bytes_in` = upstream → sandbox.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AuditEvent {
    pub sandbox_id: String,
    pub at: DateTime<Utc>,
    /// `tcp` | `tls` | `http` | `dns`
    pub protocol: &'static str,
    pub host: Option<String>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub allowed: bool,
    pub rule: String,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// Receives audit events; `record` is called on the proxy's hot path and must not block.
pub trait AuditSink: Send + Sync {
    fn record(&self, event: AuditEvent);
}
