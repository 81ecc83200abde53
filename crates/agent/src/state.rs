//! The hub: state shared by all request handlers.
//!
//! Each part of the state is owned by the module that works on it ([`ProcessTable`] in
//! `process::table`, [`WatcherRegistry`] in `filesystem::watch`, [`CpuSampler`] in `metrics`);
//! this module only holds them together. It imports nothing but those modules and leaves
//! (`users`, `report`), and none of them imports it back, so handlers depend on the hub
//! and the hub never on a handler.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::http::HeaderMap;
use bulkhead_envd::ConnectError;

use crate::filesystem::watch::WatcherRegistry;
use crate::metrics::CpuSampler;
use crate::process::table::ProcessTable;
use crate::users::{User, UserDb, UserError};

/// Startup configuration (from the command line).
#[derive(Debug, Clone)]
pub struct Config {
    /// User that requests without an explicit user run as, until `/init` changes it.
    pub default_user: String,
    /// Cap on concurrently running processes started through `Start`.
    pub max_background_processes: usize,
}

/// Settings `/init` may change.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Default user.
    pub default_user: String,
    /// Default working directory for processes (and for an empty path).
    pub default_workdir: Option<PathBuf>,
    /// Sandbox-wide environment variables.
    pub env_vars: BTreeMap<String, String>,
    /// Access token; when set, requests must carry it.
    pub access_token: Option<String>,
}

/// Shared state.
pub struct AppState {
    settings: RwLock<Settings>,
    /// Processes started through `Start`.
    pub processes: Arc<ProcessTable>,
    /// Polling watchers (`CreateWatcher`).
    pub watchers: WatcherRegistry,
    /// CPU usage sampler for `/metrics`.
    pub cpu: CpuSampler,
}

/// Shared state handle.
pub type SharedState = Arc<AppState>;

impl AppState {
    /// Creates the state.
    pub fn new(config: &Config) -> SharedState {
        Arc::new(Self {
            settings: RwLock::new(Settings {
                default_user: config.default_user.clone(),
                ..Settings::default()
            }),
            processes: Arc::new(ProcessTable::new(config.max_background_processes)),
            watchers: WatcherRegistry::default(),
            cpu: CpuSampler::default(),
        })
    }

    /// A copy of the current settings.
    pub fn settings(&self) -> Settings {
        self.settings
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Changes the settings.
    pub fn update_settings(&self, f: impl FnOnce(&mut Settings)) {
        f(&mut self
            .settings
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// The current access token.
    pub fn access_token(&self) -> Option<String> {
        self.settings
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .access_token
            .clone()
    }

    /// Resolves `name` (or the default user when `None`) against the sandbox's user database.
    pub fn resolve_user(&self, name: Option<&str>) -> Result<(User, UserDb), UserError> {
        let db = UserDb::load()?;
        let name = match name {
            Some(n) => n.to_owned(),
            None => self.settings().default_user,
        };
        let user = db.user(&name)?;
        Ok((user, db))
    }

    /// The user of an RPC: `Authorization: Basic base64("<user>:")`, else the default user.
    pub fn rpc_user(&self, headers: &HeaderMap) -> Result<(User, UserDb), ConnectError> {
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let resolved = crate::users::username_from_authorization(header)
            .and_then(|name| self.resolve_user(name.as_deref()));
        resolved.map_err(|e| match e {
            UserError::Unknown(_) | UserError::BadHeader => {
                ConnectError::unauthenticated(e.to_string())
            }
            UserError::Io { .. } => ConnectError::internal(crate::report::error_chain(&e)),
        })
    }
}
