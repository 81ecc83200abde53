//! What a new sandbox starts from: a template's pool, or a checkpoint (a snapshot, a fork's
//! snapshot). A leaf shared by create, fork, snapshots and restore.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::types::TemplateInfo;

/// What a new sandbox starts from: a template's pool, or a checkpoint (a snapshot, a fork).
pub(crate) enum Source {
    Template(Arc<TemplateInfo>),
    Checkpoint(CheckpointSource),
}

/// A complete checkpoint a new sandbox is restored from.
pub(crate) struct CheckpointSource {
    /// The template the checkpoint was taken on (the restore's base).
    pub(crate) template: Arc<TemplateInfo>,
    pub(crate) dir: PathBuf,
    /// Restore its memory (else boot afresh on its files).
    pub(crate) memory: bool,
    /// The env the source had (given again to a fresh boot; a memory restore still has it).
    pub(crate) env_vars: BTreeMap<String, String>,
    /// The source's access token, which its restored agent asks for until it gets its own.
    pub(crate) access_token: Option<String>,
}
