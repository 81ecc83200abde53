//! Volumes (E2B's Volume API): create, list, get, delete, and the checks of a create request's
//! `volumeMounts`. A volume is a named, persistent host directory of one team with a size limit
//! ([`crate::volume_storage`]); sandboxes mount it read-write at create, and the content API
//! ([`crate::volume_content`]) reads and writes it directly.
//!
//! A volume mounted by a sandbox that is not dead (running, paused, …) cannot be deleted: the
//! delete answers 409 naming the sandboxes, so no sandbox loses its data under its feet.

use std::collections::BTreeSet;
use std::sync::Arc;

use bulkhead_store::{SandboxVolumeRow, StoreError, VolumeRow};

use crate::clock::now_ms;
use crate::driver::VolumeMount;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::types::Caller;
use crate::volume_storage::{StorageError, VolumeStorage};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Most volumes one sandbox may mount.
pub const MAX_MOUNTS: usize = 16;
/// Sandbox paths a volume may not be mounted at or under.
const RESERVED: [&str; 4] = ["/proc", "/sys", "/dev", "/run/bulkhead"];

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error(
        "Invalid volume name '{0}': use 1-63 letters, digits, '-' or '_', starting with a letter or digit"
    )]
    InvalidName(String),
    #[error("Volume '{0}' not found: list volumes with GET /volumes")]
    NotFound(String),
    #[error("A volume named '{0}' already exists: pick another name or connect to it")]
    NameTaken(String),
    #[error(
        "Volume '{name}' is mounted by sandbox(es) {sandboxes}: kill them first, then delete it"
    )]
    InUse { name: String, sandboxes: String },
    #[error("Invalid volume mount at '{path}': {reason}")]
    BadMount { path: String, reason: String },
    #[error("This server has no volume storage: ask the operator to enable volumes")]
    NoStorage,
    #[error("Invalid volume token: use the token from Volume.create or Volume.connect")]
    BadToken,
    #[error(
        "The volume's storage failed: try again, and if it keeps failing ask the operator to check the server log"
    )]
    Storage(#[source] StorageError),
}

/// A volume as the API shows it (E2B `VolumeAndToken`).
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeInfo {
    pub id: String,
    pub name: String,
    pub token: String,
}

impl From<&VolumeRow> for VolumeInfo {
    fn from(v: &VolumeRow) -> Self {
        Self {
            id: v.id.clone(),
            name: v.name.clone(),
            token: v.token.clone(),
        }
    }
}

/// One entry of a create request's `volumeMounts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRequest {
    pub name: String,
    pub path: String,
}

/// Check a volume name (E2B-style: a short identifier, it is how mounts name volumes).
pub fn validate_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidName(name.chars().take(80).collect()))
    }
}

/// Normalise and check the mount paths of a create request: absolute, not `/`, not at or
/// under a reserved path, no `.`/`..`, no duplicates, no mount inside another.
pub fn validate_mounts(mounts: &[MountRequest]) -> Result<Vec<MountRequest>, VolumeError> {
    if mounts.len() > MAX_MOUNTS {
        return Err(VolumeError::BadMount {
            path: String::new(),
            reason: format!("at most {MAX_MOUNTS} volumes per sandbox"),
        });
    }
    let mut out: Vec<MountRequest> = Vec::new();
    for m in mounts {
        let bad = |reason: &str| VolumeError::BadMount {
            path: m.path.chars().take(200).collect(),
            reason: reason.to_string(),
        };
        validate_name(&m.name)?;
        if !m.path.starts_with('/') {
            return Err(bad("the path must be absolute"));
        }
        if m.path.len() > 1024 || m.path.contains('\0') {
            return Err(bad("the path is too long (max 1024 bytes) or contains NUL"));
        }
        let mut parts = Vec::new();
        for c in m.path.split('/') {
            match c {
                "" => {}
                "." | ".." => return Err(bad("'.' and '..' are not allowed")),
                c if c.len() > 255 => return Err(bad("a name is too long (max 255 bytes)")),
                c => parts.push(c),
            }
        }
        if parts.is_empty() {
            return Err(bad("a volume cannot be mounted at '/'"));
        }
        let path = format!("/{}", parts.join("/"));
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        if let Some(r) = RESERVED.iter().find(|r| under(&path, r)) {
            return Err(bad(&format!("'{r}' is reserved for the system")));
        }
        for o in &out {
            if under(&path, &o.path) || under(&o.path, &path) {
                return Err(bad(&format!(
                    "it overlaps the mount at '{}' (one path per volume, none inside another)",
                    o.path
                )));
            }
        }
        out.push(MountRequest {
            name: m.name.clone(),
            path,
        });
    }
    Ok(out)
}

/// The team a caller's volumes belong to (`''` on a server without teams).
fn team(caller: &Caller) -> &str {
    caller.team_id.as_deref().unwrap_or("")
}

/// Sandbox ids whose creates are mounting a volume right now (a delete must wait for them to
/// be recorded or to fail). Dropping the guard releases them.
pub(crate) struct MountGuard {
    engine: Arc<Engine>,
    ids: Vec<String>,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let mut m = self.engine.volumes_mounting.lock().expect("volumes lock");
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
        let _ = self.volume_storage.set(storage);
    }

    pub(crate) fn storage(&self) -> Result<&Arc<dyn VolumeStorage>, VolumeError> {
        self.volume_storage.get().ok_or(VolumeError::NoStorage)
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
            .volumes_mounting
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

    /// Resolve a create request's `volumeMounts` into what the driver mounts, and hold the
    /// volumes against deletion until the guard is dropped (after the sandbox is recorded).
    pub(crate) async fn resolve_mounts(
        self: &Arc<Self>,
        caller: &Caller,
        mounts: &[MountRequest],
    ) -> Result<(Vec<VolumeMount>, Vec<String>, MountGuard)> {
        let mut guard = MountGuard {
            engine: self.clone(),
            ids: Vec::new(),
        };
        if mounts.is_empty() {
            return Ok((Vec::new(), Vec::new(), guard));
        }
        let mounts = validate_mounts(mounts)?;
        let storage = self.storage()?.clone();
        let mut out = Vec::new();
        let mut volume_ids = Vec::new();
        let mut seen = BTreeSet::new();
        for m in &mounts {
            let row = self
                .store
                .get_volume_by_name(team(caller), &m.name)
                .await?
                .ok_or_else(|| VolumeError::NotFound(m.name.clone()))?;
            if seen.insert(row.id.clone()) {
                *self
                    .volumes_mounting
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
        &self,
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
        Ok(self.store.insert_sandbox_volumes(&rows).await?)
    }

    /// The volume mounts of a recorded sandbox, as a driver needs them again (resume, fork).
    pub async fn sandbox_volume_mounts(&self, sandbox_id: &str) -> Result<Vec<VolumeMount>> {
        let storage = self.storage()?.clone();
        let mut out = Vec::new();
        for m in self.store.sandbox_volumes(sandbox_id).await? {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, path: &str) -> MountRequest {
        MountRequest {
            name: name.into(),
            path: path.into(),
        }
    }

    #[test]
    fn names() {
        for ok in ["data", "my-volume", "a", "A_1", &"x".repeat(63)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "a b",
            "a/b",
            "a.b",
            "..",
            &"x".repeat(64),
            "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_paths() {
        let ok = validate_mounts(&[m("a", "/mnt/data/"), m("b", "//home/user/x")]).unwrap();
        assert_eq!(ok[0].path, "/mnt/data");
        assert_eq!(ok[1].path, "/home/user/x");
        for (path, why) in [
            ("mnt", "absolute"),
            ("/", "'/'"),
            ("//", "'/'"),
            ("/proc", "reserved"),
            ("/proc/x", "reserved"),
            ("/sys/fs", "reserved"),
            ("/dev/shm", "reserved"),
            ("/run/bulkhead", "reserved"),
            ("/run/bulkhead/sock", "reserved"),
            ("/mnt/../etc", "'..'"),
            ("/mnt/./x", "'..'"),
        ] {
            let err = validate_mounts(&[m("a", path)]).unwrap_err().to_string();
            assert!(err.contains(why), "{path}: {err}");
        }
        // /run itself and /procfoo are fine.
        assert!(validate_mounts(&[m("a", "/run/data"), m("b", "/procfoo")]).is_ok());
        for (a, b) in [
            ("/mnt/a", "/mnt/a"),
            ("/mnt/a", "/mnt/a/b"),
            ("/mnt/a/b", "/mnt/a"),
        ] {
            let err = validate_mounts(&[m("x", a), m("y", b)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("overlaps"), "{a} {b}: {err}");
        }
        assert!(validate_mounts(&[m("bad name", "/mnt")]).is_err());
        let many: Vec<_> = (0..17).map(|i| m("v", &format!("/m{i}"))).collect();
        assert!(validate_mounts(&many).is_err());
    }
}
