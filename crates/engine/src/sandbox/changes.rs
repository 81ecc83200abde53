//! Change tracking (Bulkhead's own, beyond E2B): the files a sandbox created, modified and
//! deleted since it started, or since a snapshot. The driver computes them from the sandbox's
//! filesystem changes (the jail: its overlay upper layer), so nothing is recorded while the
//! sandbox runs.
//!
//! Which [`ChangeSource`] a sandbox id means depends on its state: a running sandbox is read
//! live, a paused one from its pause checkpoint; `since` names a snapshot, whose checkpoint is
//! the baseline. [`Engine::changes_of`] takes a resolved source (forks and restores may use it).

use std::path::PathBuf;

use crate::engine::Engine;
use crate::error::{ChangesError, EngineError};
use crate::node::driver::{ChangeSource, FileChange};
use crate::sandbox::lifecycle::Operation;
use crate::types::Caller;

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// `GET /sandboxes/{id}/changes[?since=<snapshot id>]`.
    pub async fn changes(
        &self,
        caller: &Caller,
        id: &str,
        since: Option<&str>,
    ) -> Result<Vec<FileChange>> {
        let source = self.change_source(caller, id).await?;
        let since = match since {
            Some(s) => Some(self.snapshot_dir(caller, s).await?),
            None => None,
        };
        let mut list = self.changes_of(&source, since).await?;
        // A volume's mount point is made by the jail in the upper layer; it is not a change
        // of the sandbox (and the volume's content is not in the overlay at all).
        let mounts: Vec<String> = self
            .store
            .sandbox_volumes(crate::ids::normalize_sandbox_id(id))
            .await?
            .into_iter()
            .map(|m| m.path)
            .collect();
        list.retain(|c| !mounts.contains(&c.path));
        Ok(list)
    }

    /// The changes of a resolved source, against its template or the checkpoint `since`.
    pub async fn changes_of(
        &self,
        source: &ChangeSource,
        since: Option<PathBuf>,
    ) -> Result<Vec<FileChange>> {
        self.node
            .changes(source, since.as_deref())
            .await
            .map_err(|e| match e {
                crate::node::driver::DriverError::Unsupported { .. } => {
                    ChangesError::Unsupported.into()
                }
                e => EngineError::Driver {
                    op: Operation::Get,
                    source: e,
                },
            })
    }

    /// What a sandbox id's changes are read from: a running sandbox live, a paused one from
    /// its pause checkpoint.
    async fn change_source(&self, caller: &Caller, id: &str) -> Result<ChangeSource> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let row = self.running_row(id, Operation::Get).await?;
        if let Ok(h) = self.handle(&row.id) {
            return Ok(ChangeSource::Running(h));
        }
        match self.live.extra(&row.id).and_then(|e| e.paused) {
            Some(p) => Ok(ChangeSource::Checkpoint(p.dir)),
            None => Err(ChangesError::Paused(row.id).into()),
        }
    }

    /// The checkpoint directory of one of the caller's team's snapshots, the baseline of
    /// `?since=`; another team's is as unknown as a missing one.
    pub(crate) async fn snapshot_dir(&self, caller: &Caller, snapshot: &str) -> Result<PathBuf> {
        let missing = || ChangesError::SnapshotNotFound(snapshot.chars().take(80).collect());
        let row = crate::template::names::team_snapshot(self, caller, snapshot)
            .await?
            .ok_or_else(missing)?;
        let dir = PathBuf::from(row.checkpoint_dir);
        match self.node.checkpoint_info(&dir).await {
            Some(_) => Ok(dir),
            None => Err(missing().into()),
        }
    }
}
