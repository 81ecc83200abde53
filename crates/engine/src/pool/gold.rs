//! The state of each heavy template's warm checkpoint (see `pool_source`). A leaf, so the
//! `Engine` value can hold it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A template's warm checkpoint, as far as this server knows.
#[derive(Debug, Default)]
pub(crate) enum Gold {
    /// Not looked for yet.
    #[default]
    Unknown,
    /// Complete, valid for `key`.
    Ready { key: String, dir: PathBuf },
    /// Making or using it failed for `key`: cold starts until `retry_at` (or a new key).
    Failed { key: String, retry_at: Instant },
}

/// Per template, its [`Gold`] state; the async lock keeps concurrent refills from making the
/// same checkpoint twice.
#[derive(Default)]
pub(crate) struct PoolSources(Mutex<HashMap<String, Arc<tokio::sync::Mutex<Gold>>>>);

impl PoolSources {
    pub(crate) fn slot(&self, template: &str) -> Arc<tokio::sync::Mutex<Gold>> {
        self.0
            .lock()
            .expect("pool sources lock")
            .entry(template.to_string())
            .or_default()
            .clone()
    }
}
