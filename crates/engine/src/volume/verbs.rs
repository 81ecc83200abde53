//! Volumes (E2B's Volume API): create, list, get, delete, and the checks of a create request's
//! `volumeMounts`. A volume is a named, persistent host directory of one team with a size limit
//! ([`crate::volume::storage`]); sandboxes mount it read-write at create, and the content API
//! ([`crate::volume::content`]) reads and writes it directly.
//!
//! A volume mounted by a sandbox that is not dead (running, paused, …) cannot be deleted: the
//! delete answers 409 naming the sandboxes, so no sandbox loses its data under its feet.

use std::collections::BTreeSet;
use std::sync::Arc;

use bulkhead_store::{SandboxVolumeRow, StoreError, VolumeRow};

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::driver::VolumeMount;
use crate::types::Caller;
use crate::volume::storage::VolumeStorage;
use crate::volume::types::{MountRequest, VolumeError, VolumeInfo, validate_mounts, validate_name};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The team a caller's volumes belong to.
fn team(caller: &Caller) -> &str {
    &caller.team_id
}

/// Sandbox ids whose creates are mounting a volume right now (a delete must wait for them to
/// be recorded or to fail). Dropping the guard releases them.
pub(crate) struct MountGuard {
    engine: Arc<Engine>,
    ids: Vec<String>,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let mut m = self.engine.volumes.mounting.lock().expect("volumes lock");
        for id in &self.ids {
            if let Some(n) = m.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    m.remove(id);
                }
            }
        }
    }
}

impl Engine {
    /// Install the host storage of volumes (once, at server start).
    pub fn set_volume_storage(&self, storage: Arc<dyn VolumeStorage>) {
        let _ = self.volumes.storage.set(storage);
    }

    pub(crate) fn storage(&self) -> Result<&Arc<dyn VolumeStorage>, VolumeError> {
        self.volumes.storage.get().ok_or(VolumeError::NoStorage)
    }

    pub async fn create_volume(&self, caller: &Caller, name: &str) -> Result<VolumeInfo> {
        validate_name(name)?;
        let storage = self.storage()?.clone();
        if self
            .store
            .get_volume_by_name(team(caller), name)
            .await?
            .is_some()
        {
            return Err(VolumeError::NameTaken(name.into()).into());
        }
        let row = VolumeRow {
            id: ids::sandbox_id(),
            team: team(caller).into(),
            name: name.into(),
            owner_key_id: caller.key_id.clone(),
            token: ids::random_hex(24),
            max_bytes: self.cfg.volume_max_bytes as i64,
            created_at: now_ms(),
        };
        let (id, max) = (row.id.clone(), self.cfg.volume_max_bytes);
        let s = storage.clone();
        tokio::task::spawn_blocking(move || s.create(&id, max))
            .await
            .expect("volume create task")
            .map_err(VolumeError::Storage)?;
        if let Err(e) = self.store.insert_volume(&row).await {
            let id = row.id.clone();
            let _ = tokio::task::spawn_blocking(move || storage.destroy(&id)).await;
            return Err(match e {
                StoreError::Conflict { .. } => VolumeError::NameTaken(name.into()).into(),
                e => e.into(),
            });
        }
        tracing::info!(volume = %row.id, name = %row.name, "volume created");
        Ok(VolumeInfo::from(&row))
    }

    pub async fn list_volumes(&self, caller: &Caller) -> Result<Vec<VolumeInfo>> {
        let rows = self.store.list_volumes(team(caller)).await?;
        Ok(rows.iter().map(VolumeInfo::from).collect())
    }

    pub async fn get_volume(&self, caller: &Caller, id: &str) -> Result<VolumeInfo> {
        let row = self.volume_row(caller, id).await?;
        Ok(VolumeInfo::from(&row))
    }

    pub(crate) async fn volume_row(&self, caller: &Caller, id: &str) -> Result<VolumeRow> {
        self.store
            .get_volume(team(caller), id)
            .await?
            .ok_or_else(|| VolumeError::NotFound(id.chars().take(80).collect()).into())
    }

    /// Delete a volume and its data; refused while a sandbox that is not dead mounts it.
    pub async fn delete_volume(&self, caller: &Caller, id: &str) -> Result<()> {
        let row = self.volume_row(caller, id).await?;
        let storage = self.storage()?.clone();
        let mut users = self.store.volume_users(&row.id).await?;
        if self
            .volumes
            .mounting
            .lock()
            .expect("volumes lock")
            .contains_key(&row.id)
        {
            users.push("(one being created)".into());
        }
        if !users.is_empty() {
            return Err(VolumeError::InUse {
                name: row.name.clone(),
                sandboxes: users.join(", "),
            }
            .into());
        }
        self.store.delete_volume(&row.id).await?;
        let vid = row.id.clone();
        tokio::task::spawn_blocking(move || storage.destroy(&vid))
            .await
            .expect("volume destroy task")
            .map_err(VolumeError::Storage)?;
        tracing::info!(volume = %row.id, name = %row.name, "volume deleted");
        Ok(())
    }

    /// The volumes a sandbox mounts, by name and path (E2B `SandboxDetail.volumeMounts`).
    pub async fn volume_mounts_of(&self, sandbox_id: &str) -> Result<Vec<MountRequest>> {
        let mut out = Vec::new();
        for m in self.store.sandbox_volumes(sandbox_id).await? {
            if let Some(row) = self.store.find_volume(&m.volume_id).await? {
                out.push(MountRequest {
                    name: row.name,
                    path: m.path,
                });
            }
        }
        Ok(out)
    }

    /// The volume mounts of a recorded sandbox, as a driver needs them again (resume, fork).
    pub async fn sandbox_volume_mounts(&self, sandbox_id: &str) -> Result<Vec<VolumeMount>> {
        let rows = self.store.sandbox_volumes(sandbox_id).await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let storage = self.storage()?.clone();
        let mut out = Vec::new();
        for m in rows {
            let Some(row) = self.store.find_volume(&m.volume_id).await? else {
                continue;
            };
            let (s, vid) = (storage.clone(), row.id.clone());
            let host_dir = tokio::task::spawn_blocking(move || s.root(&vid))
                .await
                .expect("volume mount task")
                .map_err(VolumeError::Storage)?;
            out.push(VolumeMount {
                name: row.name,
                host_dir,
                path: m.path,
            });
        }
        Ok(out)
    }
}

/// Resolve a create request's `volumeMounts` into what the driver mounts, and hold the
/// volumes against deletion until the guard is dropped (after the sandbox is recorded).
pub(crate) async fn resolve_mounts(
    engine: &Arc<Engine>,
    caller: &Caller,
    mounts: &[MountRequest],
) -> Result<(Vec<VolumeMount>, Vec<String>, MountGuard)> {
    let mut guard = MountGuard {
        engine: engine.clone(),
        ids: Vec::new(),
    };
    if mounts.is_empty() {
        return Ok((Vec::new(), Vec::new(), guard));
    }
    let mounts = validate_mounts(mounts)?;
    let storage = engine.storage()?.clone();
    let mut out = Vec::new();
    let mut volume_ids = Vec::new();
    let mut seen = BTreeSet::new();
    for m in &mounts {
        let row = engine
            .store
            .get_volume_by_name(team(caller), &m.name)
            .await?
            .ok_or_else(|| VolumeError::NotFound(m.name.clone()))?;
        if seen.insert(row.id.clone()) {
            *engine
                .volumes
                .mounting
                .lock()
                .expect("volumes lock")
                .entry(row.id.clone())
                .or_insert(0) += 1;
            guard.ids.push(row.id.clone());
        }
        let (s, vid) = (storage.clone(), row.id.clone());
        let host_dir = tokio::task::spawn_blocking(move || s.root(&vid))
            .await
            .expect("volume mount task")
            .map_err(VolumeError::Storage)?;
        out.push(VolumeMount {
            name: row.name.clone(),
            host_dir,
            path: m.path.clone(),
        });
        volume_ids.push(row.id);
    }
    Ok((out, volume_ids, guard))
}

/// Record which volumes a new sandbox mounts.
pub(crate) async fn record_mounts(
    engine: &Engine,
    sandbox_id: &str,
    mounts: &[VolumeMount],
    volume_ids: &[String],
) -> Result<()> {
    let rows: Vec<SandboxVolumeRow> = mounts
        .iter()
        .zip(volume_ids)
        .map(|(m, v)| SandboxVolumeRow {
            sandbox_id: sandbox_id.into(),
            volume_id: v.clone(),
            path: m.path.clone(),
        })
        .collect();
    Ok(engine.store.insert_sandbox_volumes(&rows).await?)
}
