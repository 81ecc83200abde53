//! Durable state: API keys, sandboxes, templates, secrets, volumes, a cluster's nodes and
//! leases, and the creates' idempotency keys. sqlx over SQLite (default, a file in the data
//! dir) or PostgreSQL (by URL), one set of portable migrations for both.

use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "Unsupported database URL {url:?}: use sqlite:///abs/path.db, sqlite:relative.db or postgres://user:pass@host/db"
    )]
    InvalidUrl { url: String },
    #[error("Cannot create the directory {path} for the SQLite database: check permissions")]
    CreateDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Cannot open the database at {url}: check the path or URL and that the server is up")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("Database migration failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("Database query failed")]
    Query(#[from] sqlx::Error),
    /// A unique constraint rejected the write (duplicate id, key hash or template alias).
    #[error("{what} already exists")]
    Conflict { what: String },
    #[error("{query:?} matches {count} API keys: use the key id instead")]
    Ambiguous { query: String, count: usize },
    #[error("Stored data is corrupt: {0}")]
    Corrupt(String),
    /// A secret's value was read or written before the server loaded its secrets key.
    #[error("Secrets are not available: the server has not loaded its secrets key")]
    SecretsLocked,
    /// The key does not open what this database's secrets were sealed with.
    #[error(
        "The secrets key {key} is not the key this database's secrets were encrypted with: start with the original key file (`--secrets-key-file` or BULKHEAD_SECRETS_KEY_FILE; by default <data-dir>/secrets.key) or the secrets cannot be read"
    )]
    SecretsKeyMismatch { key: String },
    /// A stored value does not decrypt under its team and id (altered, or copied from another
    /// row).
    #[error(
        "Secret {id} cannot be decrypted with this server's secrets key (its row was altered or copied): set its value again"
    )]
    SecretUnreadable { id: String },
    /// Loading, creating or using the secrets key failed.
    #[error(transparent)]
    SecretCrypto(#[from] secret_crypto::SecretCryptoError),
    /// A node's heartbeat carried an epoch that is not its current registration's, or the
    /// node is dead: nothing was written, and the node must register again (new epoch).
    #[error("Node {node} (epoch {epoch}) must register again: {reason}")]
    StaleEpoch {
        node: String,
        epoch: u64,
        reason: StaleReason,
    },
    /// A fenced write carried a lease epoch that is no longer the lease's (another holder took
    /// it since): nothing was written.
    #[error(
        "The {lease} lease is at epoch {}, not {epoch}: its holder lost it and must stop acting on it",
        current.map_or_else(|| "none (never taken)".to_owned(), |c| c.to_string())
    )]
    Fenced {
        lease: String,
        epoch: LeaseEpoch,
        current: Option<LeaseEpoch>,
    },
    /// An API replica's heartbeat came too late (it was silent longer than `dead_after`, so
    /// its sandboxes may have been taken over) or from an older incarnation: nothing was
    /// written.
    #[error(
        "API replica {replica} (epoch {epoch}) must register again and give up the sandboxes other replicas took over"
    )]
    ReplicaStale { replica: String, epoch: u64 },
    /// A renewal of a lease that expired or changed hands: the caller no longer holds it.
    #[error("{holder} no longer holds the {lease} lease (epoch {epoch}): acquire it again")]
    LeaseLost {
        lease: String,
        holder: String,
        epoch: LeaseEpoch,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// An API key as stored: only the SHA-256 of the secret is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyRow {
    pub id: String,
    pub name: String,
    /// Lowercase hex SHA-256 of the full key.
    pub hash: String,
    /// First characters of the key (e.g. `e2b_1a2b`), to recognise it in listings.
    pub prefix: String,
    /// Unix milliseconds.
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// The team the key belongs to (`default` for keys made before teams).
    pub team_id: String,
    /// Unix ms of the last request with it (written at most once a minute).
    pub last_used_at: Option<i64>,
}

/// Where a sandbox is in its life. One type for the engine's live set and the store; the
/// transitions between states are the engine's `lifecycle` module. Stored as the strings of
/// [`SandboxState::as_str`]: the three that existed first (`running`, `paused`, `dead`) keep
/// their spelling so no migration is needed, the transient ones are written only while an
/// operation is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Being created: claimed from the pool or started cold, not yet given its identity.
    Starting,
    Running,
    /// Being frozen (checkpoint in progress).
    Pausing,
    Paused,
    /// Being restored from a pause.
    Resuming,
    /// A snapshot (or a fork's checkpoint) of it is being taken; it runs again afterwards.
    Snapshotting,
    /// Being torn down.
    Killing,
    /// Killed, timed out or died; kept for a while for `GET /sandboxes/{id}` → 404 decisions
    /// and cleanup bookkeeping.
    Dead,
}

impl SandboxState {
    /// Every state, for exhaustive tests and listings.
    pub const ALL: [SandboxState; 8] = [
        SandboxState::Starting,
        SandboxState::Running,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Resuming,
        SandboxState::Snapshotting,
        SandboxState::Killing,
        SandboxState::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Pausing => "pausing",
            SandboxState::Paused => "paused",
            SandboxState::Resuming => "resuming",
            SandboxState::Snapshotting => "snapshotting",
            SandboxState::Killing => "killing",
            SandboxState::Dead => "dead",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub template_id: String,
    pub alias: Option<String>,
    pub state: SandboxState,
    /// Id of the API key that created it.
    pub owner_key_id: String,
    /// The team that owns it: every key of the team sees it, no other key does.
    pub team_id: String,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub envd_access_token: Option<String>,
    pub cpu_count: i64,
    pub memory_mb: i64,
    pub disk_size_mb: i64,
    /// Unix milliseconds.
    pub started_at: i64,
    pub end_at: i64,
    /// Serialised `DriverHandle` (JSON), None when not running.
    pub driver_handle: Option<String>,
    /// Why it died (killed, timeout, exited, lost on restart).
    pub end_reason: Option<String>,
    /// E2B `allow_internet_access` as applied (the server default when the client gave none).
    pub allow_internet: bool,
    /// The network config (allowOut, denyOut, rules) as JSON; None when none was given.
    pub network: Option<String>,
    /// The cluster node it runs on (or, paused, whose disk holds its checkpoint); None on one
    /// machine.
    pub node_id: Option<String>,
    /// The API replica that drives it (see the `replicas` table); None under `bulkhead serve`.
    pub owner_replica: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxFilter {
    pub states: Vec<SandboxState>,
    /// All of these key/value pairs must match.
    pub metadata: BTreeMap<String, String>,
    pub template_id: Option<String>,
    /// Unix ms; only sandboxes started at or after this.
    pub started_after: Option<i64>,
    pub owner_key_id: Option<String>,
    pub team_id: Option<String>,
    /// Only sandboxes this API replica drives.
    pub owner_replica: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateRow {
    pub id: String,
    pub alias: Option<String>,
    /// Content hash of the build recipe; the rootfs is cached under it.
    pub content_hash: String,
    /// `building` | `ready` | `error`.
    pub status: String,
    pub rootfs_path: String,
    pub cpu_count: i64,
    pub memory_mb: i64,
    pub disk_size_mb: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// The team that built it through the API; None: a built-in template, public to every
    /// team. `alias` is unique within a team.
    pub team_id: Option<String>,
}

/// A secret's metadata. The value is not part of it: it is written sealed with
/// [`Store::insert_secret`]/[`Store::update_secret`] and read back only by
/// [`Store::secret_value`] (header injection); API layers never return it.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretRow {
    pub id: String,
    /// The owning team; `name` is unique within it.
    pub team_id: String,
    pub name: String,
    /// 1 for a new secret, +1 on every value update.
    pub version: i64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One egress decision of a sandbox (see the `egress_events` table).
#[derive(Debug, Clone, PartialEq)]
pub struct EgressEventRow {
    pub sandbox_id: String,
    /// Unix milliseconds.
    pub at: i64,
    /// `tcp` | `tls` | `http` | `dns`.
    pub protocol: String,
    pub host: Option<String>,
    pub ip: Option<String>,
    pub port: i64,
    pub allowed: bool,
    pub rule: String,
    pub bytes_out: i64,
    pub bytes_in: i64,
}

/// An E2B volume (see the `volumes` table).
#[derive(Clone, PartialEq)]
pub struct VolumeRow {
    pub id: String,
    /// The owning team.
    pub team: String,
    pub name: String,
    pub owner_key_id: String,
    /// Bearer token of the volume content API.
    pub token: String,
    /// Size limit in bytes.
    pub max_bytes: i64,
    /// Unix milliseconds.
    pub created_at: i64,
}

impl std::fmt::Debug for VolumeRow {
    // Never print the token (logs, panics, test failures).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeRow")
            .field("id", &self.id)
            .field("team", &self.team)
            .field("name", &self.name)
            .field("owner_key_id", &self.owner_key_id)
            .field("token", &"<redacted>")
            .field("max_bytes", &self.max_bytes)
            .field("created_at", &self.created_at)
            .finish()
    }
}

/// One volume mounted by one sandbox at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxVolumeRow {
    pub sandbox_id: String,
    pub volume_id: String,
    pub path: String,
}

mod cluster;
mod idempotency;
mod persistence;
pub mod secret_crypto;
mod sql;
mod tenancy;
pub use cluster::{
    LeaseEpoch, LeaseRow, LostSandbox, NODE_HEALTH_LEASE, NODE_LOST, NodeRow, NodeSandbox,
    NodeStatus, NodeTransition, ReplicaRow, ReportedStatus, SandboxOwner, StaleReason,
    SweepOutcome,
};
pub use idempotency::{ClaimOutcome, IdempotencyClaim, IdempotencyRow};
pub use persistence::{PersistenceRow, SnapshotFilter, SnapshotRow};
pub use secret_crypto::{SecretCipher, SecretsKey};
pub use sql::{SecretsKeySource, SecretsUnlocked, Store};
pub use tenancy::{DEFAULT_TEAM, TeamQuotas, TeamRow, UsageFilter, UsageRow, UsageSum};
