//! Fork: `POST /sandboxes/{id}/fork` takes one snapshot of the sandbox (which runs on, or stays
//! paused, untouched) and restores it `count` times as new sandboxes, each with its own id and
//! envd access token; the snapshot is deleted afterwards. Each fork succeeds or fails on its
//! own.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::checkpoints;
use crate::sandbox::lifecycle::Operation;
use crate::sandbox::source::{CheckpointSource, Source};
use crate::types::{Caller, CreateGeneration, CreateRequest, SandboxInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// E2B's limits on `count`.
pub const MAX_FORKS: u32 = 20;
/// E2B's default TTL of a fork (`SandboxForkRequest.timeout`).
pub const DEFAULT_FORK_TIMEOUT_SECS: u64 = 15;

impl Engine {
    /// Fork sandbox `id` `count` times (1–20); the outer error is for the whole request (the
    /// source is not there, the snapshot failed), the inner ones per fork.
    pub async fn fork(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        count: u32,
        timeout: Option<u64>,
    ) -> Result<Vec<Result<SandboxInfo>>> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(EngineError::BadRequest(format!(
                "count must be from 1 to {MAX_FORKS} (got {count})"
            )));
        }
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let secs = timeout.unwrap_or(DEFAULT_FORK_TIMEOUT_SECS);
        self.check_timeout(secs)?;
        let (id, step) = self.enter(id, Operation::Fork)?;
        let dir = checkpoints::fork_dir(&self.cfg.checkpoint_dir, &ids::random_hex(8));
        let taken = self.checkpoint_copy(id, &dir, true, Operation::Fork).await;
        // The source is done with: it runs on (or stays paused) while the forks start.
        self.live.settle(id, step.after);
        let info = taken?;
        let results = self
            .start_forks(caller, id, &dir, info.memory, count, secs)
            .await;
        self.node.remove_checkpoint(&dir).await;
        results
    }

    async fn start_forks(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        dir: &std::path::Path,
        memory: bool,
        count: u32,
        secs: u64,
    ) -> Result<Vec<Result<SandboxInfo>>> {
        let row = self
            .store
            .get_sandbox(id)
            .await?
            .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
        let template = crate::template::registry::template(self, &row.template_id)
            .ok_or_else(|| EngineError::TemplateNotFound(row.template_id.clone()))?;
        let lifecycle = self.live.extra(id).unwrap_or_default().lifecycle;
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let req = CreateRequest {
                template: row.template_id.clone(),
                timeout: Some(secs),
                metadata: row.metadata.clone(),
                // The fork's memory has its parent's env; a fresh boot is given it again.
                env_vars: Default::default(),
                secure: Some(row.envd_access_token.is_some()),
                generation: CreateGeneration::V1,
                allow_internet_access: Some(row.allow_internet),
                network: row
                    .network
                    .as_deref()
                    .and_then(|n| serde_json::from_str(n).ok()),
                lifecycle,
                // A restore does not mount volumes yet (`create_from` refuses them): a fork of
                // a sandbox with volumes starts without them.
                volume_mounts: Vec::new(),
            };
            let source = Source::Checkpoint(CheckpointSource {
                template: template.clone(),
                dir: dir.to_path_buf(),
                memory,
                env_vars: row.env_vars.clone(),
                access_token: row.envd_access_token.clone(),
            });
            let result = self.create_from(caller, req, source).await;
            if let Err(e) = &result {
                tracing::warn!(sandbox = %id, error = e as &dyn std::error::Error, "a fork failed to start");
            }
            out.push(result);
        }
        Ok(out)
    }
}
