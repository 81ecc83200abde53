//! Change tracking (Bulkhead's own, beyond E2B): the files a sandbox created, modified and
//! deleted since it started, or since a snapshot. The driver computes them from the sandbox's
//! filesystem changes (the jail: its overlay upper layer), so nothing is recorded while the
//! sandbox runs.
//!
//! Which [`ChangeSource`] a sandbox id means depends on its state: a running sandbox is read
//! live; a paused one (and a `since` snapshot) needs the checkpoint directory the persistence
//! verbs record. [`Engine::changes_of`] takes the resolved source, so those verbs plug in by
//! resolving their ids to directories.

use std::path::PathBuf;

use crate::driver::{ChangeSource, FileChange};
use crate::engine::Engine;
use crate::error::{ChangesError, EngineError};
use crate::lifecycle::Operation;
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
        self.changes_of(&source, since).await
    }

    /// The changes of a resolved source, against its template or the checkpoint `since`.
    pub async fn changes_of(
        &self,
        source: &ChangeSource,
        since: Option<PathBuf>,
    ) -> Result<Vec<FileChange>> {
        self.driver
            .changes(source, since.as_deref())
            .await
            .map_err(|e| match e {
                crate::driver::DriverError::Unsupported { .. } => ChangesError::Unsupported.into(),
                e => EngineError::Driver {
                    op: Operation::Get,
                    source: e,
                },
            })
    }

    /// What a sandbox id's changes are read from. A running sandbox is read live.
    // A paused sandbox reads its pause checkpoint: wire it here when pauses record their
    // directory (`ChangeSource::Checkpoint(dir)`).
    async fn change_source(&self, _caller: &Caller, id: &str) -> Result<ChangeSource> {
        let row = self.running_row(id, Operation::Get).await?;
        match self.handle(&row.id) {
            Ok(h) => Ok(ChangeSource::Running(h)),
            Err(_) => Err(ChangesError::Paused(row.id).into()),
        }
    }

    /// The checkpoint directory of a snapshot, the baseline of `?since=`.
    // Wire it to the snapshot records when snapshots land.
    async fn snapshot_dir(&self, _caller: &Caller, snapshot: &str) -> Result<PathBuf> {
        Err(ChangesError::SnapshotNotFound(snapshot.chars().take(80).collect()).into())
    }
}
