//! The volume content API (E2B's `/volumecontent/{id}/…`): who may use it and the file
//! operations, each run on a blocking thread through [`crate::volume::fs::VolumeRoot`], which
//! keeps every path beneath the volume's root.

use std::sync::Arc;

use crate::volume::types::VolumeAccess;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::tenancy::keys;
use crate::volume::fs::{Attrs, EntryStat, VolPath, VolumeFsError, VolumeRoot, clean};
use crate::volume::types::VolumeError;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How a content request proved it may use the volume.
#[derive(Debug, Clone, Copy)]
pub enum ContentAuth<'a> {
    /// `Authorization: Bearer <token>` with the volume's token (what the SDKs send).
    Token(&'a str),
    /// `X-API-Key` of the volume's team.
    ApiKey(&'a str),
}

impl Engine {
    /// The volume a content request may use. An unknown id and a wrong token answer alike
    /// (404 vs 401 would tell a prober which ids exist).
    pub async fn volume_for_content(
        &self,
        id: &str,
        auth: ContentAuth<'_>,
    ) -> Result<VolumeAccess> {
        let row = self.store.find_volume(id).await?;
        let allowed = match (&row, auth) {
            (Some(row), ContentAuth::Token(t)) => bulkhead_common::constant_time_eq(&row.token, t),
            (Some(row), ContentAuth::ApiKey(k)) => {
                match keys::authenticate(&self.store, k).await? {
                    Some(caller) => caller.team_id == row.team,
                    None => false,
                }
            }
            (None, _) => false,
        };
        match row {
            Some(row) if allowed => Ok(VolumeAccess { id: row.id }),
            _ => Err(VolumeError::BadToken.into()),
        }
    }

    /// Run `f` on the volume's root on a blocking thread.
    async fn with_root<T: Send + 'static>(
        &self,
        row: &VolumeAccess,
        f: impl FnOnce(&VolumeRoot) -> Result<T, VolumeFsError> + Send + 'static,
    ) -> Result<T> {
        let storage: Arc<dyn crate::volume::storage::VolumeStorage> = self.storage()?.clone();
        let id = row.id.clone();
        tokio::task::spawn_blocking(move || -> Result<T> {
            let dir = storage.root(&id).map_err(VolumeError::Storage)?;
            let root = VolumeRoot::open(&dir, storage.default_owner())?;
            Ok(f(&root)?)
        })
        .await
        .expect("volume content task")
    }

    pub async fn volume_stat(&self, row: &VolumeAccess, path: &str) -> Result<EntryStat> {
        let p = clean(path)?;
        self.with_root(row, move |r| r.stat(&p)).await
    }

    pub async fn volume_list(
        &self,
        row: &VolumeAccess,
        path: &str,
        depth: u32,
    ) -> Result<Vec<EntryStat>> {
        let p = clean(path)?;
        self.with_root(row, move |r| r.list(&p, depth)).await
    }

    pub async fn volume_make_dir(
        &self,
        row: &VolumeAccess,
        path: &str,
        attrs: Attrs,
        force: bool,
    ) -> Result<EntryStat> {
        let p = clean(path)?;
        self.with_root(row, move |r| r.make_dir(&p, &attrs, force))
            .await
    }

    pub async fn volume_set_attrs(
        &self,
        row: &VolumeAccess,
        path: &str,
        attrs: Attrs,
    ) -> Result<EntryStat> {
        let p = clean(path)?;
        self.with_root(row, move |r| r.set_attrs(&p, &attrs)).await
    }

    pub async fn volume_remove(&self, row: &VolumeAccess, path: &str) -> Result<()> {
        let p = clean(path)?;
        self.with_root(row, move |r| r.remove(&p)).await
    }

    /// Open a file to stream it out; also returns its size.
    pub async fn volume_open_read(
        &self,
        row: &VolumeAccess,
        path: &str,
    ) -> Result<(tokio::fs::File, u64)> {
        let p = clean(path)?;
        let f = self.with_root(row, move |r| r.open_read(&p)).await?;
        let len = f
            .metadata()
            .map_err(|e| EngineError::from(VolumeFsError::Io(e)))?
            .len();
        Ok((tokio::fs::File::from_std(f), len))
    }

    /// Create or truncate a file to stream a body into; stat it with
    /// [`Engine::volume_stat`] afterwards (the returned path is the normalised one).
    pub async fn volume_open_write(
        &self,
        row: &VolumeAccess,
        path: &str,
        attrs: Attrs,
        force: bool,
    ) -> Result<(tokio::fs::File, VolPath)> {
        let p = clean(path)?;
        let q = p.clone();
        let f = self
            .with_root(row, move |r| r.open_write(&q, &attrs, force))
            .await?;
        Ok((tokio::fs::File::from_std(f), p))
    }
}
