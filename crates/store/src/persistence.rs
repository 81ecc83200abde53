//! Rows of the persistence tables: a sandbox's lifecycle settings and checkpoint
//! ([`PersistenceRow`]) and snapshots ([`SnapshotRow`]).

use std::collections::BTreeMap;

/// A sandbox's lifecycle settings and, while it is paused (or pausing), its checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistenceRow {
    pub sandbox_id: String,
    /// `kill` | `pause`.
    pub on_timeout: String,
    pub auto_resume: bool,
    pub pause_memory: bool,
    pub timeout_ms: i64,
    pub checkpoint_dir: Option<String>,
    pub checkpoint_memory: bool,
    pub generation: i64,
    /// Unix milliseconds.
    pub paused_at: Option<i64>,
    /// The pause was a node drain's: the next request resumes it (whatever `auto_resume` says).
    pub resume_on_traffic: bool,
}

/// A snapshot: a checkpoint sandboxes can be created from.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub id: String,
    pub name: Option<String>,
    pub sandbox_id: String,
    pub template_id: String,
    pub checkpoint_dir: String,
    pub memory: bool,
    pub env_vars: BTreeMap<String, String>,
    /// The source sandbox's envd access token (its restored agent asks for it).
    pub envd_access_token: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The team of the sandbox it was taken from: only that team lists, uses or deletes it.
    pub team_id: String,
}

/// Which snapshots to list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotFilter {
    pub sandbox_id: Option<String>,
    pub name: Option<String>,
    pub team_id: Option<String>,
}
