//! Snapshots: `POST /sandboxes/{id}/snapshots` checkpoints a sandbox into a template of its
//! own (the sandbox keeps running, or stays paused), `GET /snapshots` lists them, `DELETE
//! /templates/{id}` deletes one, and creating a sandbox with a snapshot as its template
//! restores it (see `create.rs` and `restore.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use bulkhead_store::{SnapshotFilter, SnapshotRow};

use crate::clock::{ms_to_dt, now_ms};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::checkpoints;
use crate::node::driver::{CheckpointInfo, CheckpointOptions};
use crate::sandbox::lifecycle::Operation;
use crate::sandbox::source::CheckpointSource;
use crate::types::{Caller, SnapshotInfo, SnapshotPage};
use crate::validate::{page_after, page_end};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// E2B's only tag until tags exist here.
const TAG: &str = "default";

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EngineError::BadRequest(format!(
            "Invalid snapshot name '{name}': use 1 to 128 lowercase letters, digits, '-', '_' or '.'"
        )))
    }
}

fn info(row: &SnapshotRow) -> SnapshotInfo {
    let shown = row.name.as_deref().unwrap_or(&row.id);
    SnapshotInfo {
        snapshot_id: format!("{shown}:{TAG}"),
        names: row.name.iter().map(|n| format!("{n}:{TAG}")).collect(),
        sandbox_id: row.sandbox_id.clone(),
        memory: row.memory,
        created_at: ms_to_dt(row.created_at),
    }
}

impl Engine {
    /// Take a snapshot of a running (or paused) sandbox. `name` is optional; a snapshot with
    /// that name already there is replaced (E2B: a new build of the same template).
    pub async fn create_snapshot(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        name: Option<&str>,
        memory: bool,
    ) -> Result<SnapshotInfo> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let name = name
            .map(crate::template::names::bare_name)
            .filter(|n| !n.is_empty());
        if let Some(n) = name {
            self.check_snapshot_name(caller, n)?;
        }
        let (id, step) = self.enter(id, Operation::Snapshot)?;
        let snapshot_id = ids::sandbox_id();
        let dir = checkpoints::snapshot_dir(&self.cfg.checkpoint_dir, &snapshot_id);
        let taken = self
            .checkpoint_copy(id, &dir, memory, Operation::Snapshot)
            .await;
        self.live.settle(id, step.after);
        let checkpoint = taken?;
        let row = match self.store.get_sandbox(id).await? {
            Some(r) => r,
            None => {
                self.node.remove_checkpoint(&dir).await;
                return Err(EngineError::SandboxNotFound(id.to_string()));
            }
        };
        let mut snap = SnapshotRow {
            id: snapshot_id,
            name: name.map(str::to_string),
            sandbox_id: id.to_string(),
            template_id: row.template_id.clone(),
            checkpoint_dir: dir.display().to_string(),
            memory: checkpoint.memory,
            env_vars: row.env_vars.clone(),
            envd_access_token: row.envd_access_token.clone(),
            created_at: now_ms(),
            team_id: row.team_id.clone(),
        };
        if let Some(n) = name
            && let Some(old) = self.store.get_snapshot(n).await?
        {
            // Names are server-wide: another team's snapshot is never replaced.
            if old.team_id != row.team_id {
                self.node.remove_checkpoint(&dir).await;
                return Err(EngineError::Conflict(format!(
                    "Snapshot name '{n}' (of another team: choose another name)"
                )));
            }
            // The name keeps its template id; the new checkpoint replaces the old one.
            self.store.delete_snapshot(&old.id).await?;
            self.node
                .remove_checkpoint(&PathBuf::from(&old.checkpoint_dir))
                .await;
            snap.id = old.id;
        }
        if let Err(e) = self.store.insert_snapshot(&snap).await {
            self.node.remove_checkpoint(&dir).await;
            return Err(e.into());
        }
        tracing::info!(sandbox = %id, snapshot = %snap.id, memory = snap.memory, "snapshot taken");
        Ok(info(&snap))
    }

    /// A valid snapshot name that is not a template's the caller can start (its team's, a
    /// built-in, or one its team is building): one name, one thing for the team's creates.
    pub(crate) fn check_snapshot_name(&self, caller: &Caller, name: &str) -> Result<()> {
        validate_name(name)?;
        if self.template_for(caller, name).is_some()
            || crate::template::names::team_build_id(self, caller, name).is_some()
        {
            return Err(EngineError::Conflict(format!(
                "A template named '{name}' (a snapshot cannot take a template's name: choose \
                 another snapshot name)"
            )));
        }
        Ok(())
    }

    /// A complete checkpoint of sandbox `id` (in `snapshotting`) in `dir`: from the running
    /// sandbox (it runs on), or copied from its pause.
    pub(crate) async fn checkpoint_copy(
        &self,
        id: &str,
        dir: &std::path::Path,
        memory: bool,
        op: Operation,
    ) -> Result<CheckpointInfo> {
        let (handle, paused) = {
            let live = self.live.lock();
            let l = live
                .get(id)
                .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
            (l.handle.clone(), l.extra.paused.clone())
        };
        if let Some(p) = paused {
            let mut info = self
                .node
                .copy_checkpoint(&p.dir, dir)
                .await
                .map_err(|source| EngineError::CheckpointFailed {
                    id: id.to_string(),
                    op,
                    source,
                })?;
            // Asked for the filesystem only: the copy is restored that way.
            info.memory = info.memory && memory;
            return Ok(info);
        }
        let handle = handle.ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
        if !self.node.capabilities().snapshot {
            return Err(EngineError::NotCapable {
                driver: self.node.driver_name(),
                op,
            });
        }
        let opts = CheckpointOptions {
            leave_running: true,
            filesystem_only: !memory,
        };
        // The driver needs the host's connections closed and takes the link away (it cannot
        // be dumped); the sandbox runs on and gets a new one with the same policy.
        self.live.cut_traffic(id);
        let had_link = self.live.lock().get(id).is_some_and(|l| l.net_attached);
        let written = self.node.checkpoint(&handle, dir, opts).await;
        if had_link {
            // The proxy lets go of the old link only after the driver removed it.
            crate::sandbox::network::detach_link(self, id).await;
            let attached = match self.store.get_sandbox(id).await {
                Ok(Some(row)) => {
                    crate::sandbox::network::reattach_after_restart(self, &row, &handle).await
                }
                _ => false,
            };
            if let Some(l) = self.live.lock().get_mut(id) {
                l.net_attached = attached;
            }
        }
        written.map_err(|source| EngineError::CheckpointFailed {
            id: id.to_string(),
            op,
            source,
        })
    }

    /// `GET /snapshots`: newest first, optionally of one sandbox or with one name.
    pub async fn list_snapshots(
        &self,
        caller: &Caller,
        sandbox_id: Option<&str>,
        name: Option<&str>,
        limit: Option<usize>,
        next_token: Option<&str>,
    ) -> Result<SnapshotPage> {
        let filter = SnapshotFilter {
            sandbox_id: sandbox_id
                .filter(|s| !s.is_empty())
                .map(|s| ids::normalize_sandbox_id(s).to_string()),
            name: name
                .filter(|n| !n.is_empty())
                .map(|n| crate::template::names::bare_name(n).to_string()),
            team_id: Some(caller.team_id.clone()),
        };
        let limit = limit.unwrap_or(100).clamp(1, 100);
        let after = page_after(next_token)?;
        let mut rows = self
            .store
            .list_snapshots(&filter, limit as i64 + 1, after)
            .await?;
        let next_token = page_end(&mut rows, limit, |r| (r.created_at, &r.id));
        Ok(SnapshotPage {
            items: rows.iter().map(info).collect(),
            next_token,
        })
    }

    /// `DELETE /templates/{id}` of a snapshot (by id or name, with or without its tag).
    pub async fn delete_snapshot(&self, caller: &Caller, reference: &str) -> Result<()> {
        let row = crate::template::names::team_snapshot(self, caller, reference)
            .await?
            .ok_or_else(|| EngineError::SnapshotNotFound(reference.to_string()))?;
        self.store.delete_snapshot(&row.id).await?;
        self.node
            .remove_checkpoint(&PathBuf::from(&row.checkpoint_dir))
            .await;
        tracing::info!(snapshot = %row.id, "snapshot deleted");
        Ok(())
    }

    /// The snapshot a create names as its template, ready to restore.
    /// The checkpoint of the caller's team's snapshot `reference`; another team's is as
    /// unknown as a missing one.
    pub(crate) async fn snapshot_source(
        &self,
        caller: &Caller,
        reference: &str,
    ) -> Result<Option<CheckpointSource>> {
        let Some(row) = crate::template::names::team_snapshot(self, caller, reference).await?
        else {
            return Ok(None);
        };
        let template = crate::template::registry::template(self, &row.template_id)
            .ok_or_else(|| EngineError::TemplateNotFound(row.template_id.clone()))?;
        let dir = PathBuf::from(&row.checkpoint_dir);
        let memory = self
            .node
            .checkpoint_info(&dir)
            .await
            .ok_or_else(|| EngineError::Checkpoint {
                op: Operation::Create,
                source: checkpoints::CheckpointError::Incomplete(dir.clone()),
            })?
            .memory
            && row.memory;
        Ok(Some(CheckpointSource {
            template,
            dir,
            memory,
            env_vars: row.env_vars,
            access_token: row.envd_access_token,
        }))
    }
}
