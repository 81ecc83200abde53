//! A checkpoint directory's layout and its manifest. Leaf module.
//!
//! ```text
//! <dir>/checkpoint.json   the manifest, written last: a directory without it is incomplete
//! <dir>/disk.ext4         the sandbox's disk (its overlay upper dir: its filesystem changes)
//! <dir>/upper/            format 1 only: the upper dir itself, before sandboxes had disks
//! <dir>/images/           CRIU's images (memory and processes; absent when filesystem-only)
//! <dir>/agent.log         the agent's log, which the restored agent still has open
//! ```

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use bulkhead_driver::DriverError;
use serde::{Deserialize, Serialize};

/// Layout version of a jail checkpoint (see the module docs). 2: the disk image; format 1
/// checkpoints (an `upper/` dir) are still restored.
pub(super) const CHECKPOINT_FORMAT: u32 = 2;
pub(super) const MANIFEST: &str = "checkpoint.json";
/// Format 1's upper dir.
pub(super) const LEGACY_UPPER: &str = "upper";
pub(super) const IMAGES: &str = "images";
pub(super) const AGENT_LOG: &str = "agent.log";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Manifest {
    pub(super) format: u32,
    pub(super) driver: String,
    /// Memory and processes kept (false: filesystem only).
    pub(super) memory: bool,
    /// The template root (for listing changes against it).
    pub(super) rootfs: Option<PathBuf>,
    /// Host uid of the sandbox's root when it was checkpointed: files on its disk are owned
    /// by that slot's range and are shifted when restored into another.
    pub(super) uid_base: u32,
    /// The slot it ran in (a resume prefers it: no re-owning needed).
    pub(super) slot: u32,
    /// The agent binary the processes run (CRIU maps exactly that file back).
    pub(super) agent: Option<PathBuf>,
    /// Volume mounts inside the sandbox, by the key recorded in the image.
    #[serde(default)]
    pub(super) volumes: Vec<(String, String)>,
}

impl Manifest {
    pub(super) fn read(dir: &Path) -> Result<Manifest, DriverError> {
        let path = dir.join(MANIFEST);
        let text = fs::read_to_string(&path).map_err(|e| {
            DriverError::io(
                format!(
                    "{} is not a complete checkpoint (no {MANIFEST}); it cannot be restored",
                    dir.display()
                ),
                e,
            )
        })?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| {
            DriverError::io(
                format!("unreadable checkpoint manifest {}", path.display()),
                std::io::Error::other(e),
            )
        })?;
        if m.format > CHECKPOINT_FORMAT {
            return Err(DriverError::io(
                format!(
                    "checkpoint {} has format {}, newer than this server reads ({CHECKPOINT_FORMAT}); \
                     restore it with the newer server",
                    dir.display(),
                    m.format
                ),
                std::io::Error::other("format"),
            ));
        }
        Ok(m)
    }

    /// Write the manifest under a temporary name (the caller renames it into place last).
    pub(super) fn write_pending(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let tmp = dir.join(format!("{MANIFEST}.pending"));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).expect("manifest serialises"))?;
        f.sync_all()?;
        Ok(tmp)
    }

    pub(super) fn commit(pending: &Path, dir: &Path) -> std::io::Result<()> {
        fs::rename(pending, dir.join(MANIFEST))?;
        fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_is_complete_only_once_committed() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest {
            format: CHECKPOINT_FORMAT,
            driver: "jail".into(),
            memory: true,
            rootfs: Some("/images/abc/rootfs".into()),
            uid_base: 1_000_000,
            slot: 0,
            agent: Some("/j/agents/1-2".into()),
            volumes: vec![("vol0".into(), "/mnt/data".into())],
        };
        let pending = m.write_pending(dir.path()).unwrap();
        assert!(Manifest::read(dir.path()).is_err());
        Manifest::commit(&pending, dir.path()).unwrap();
        assert_eq!(Manifest::read(dir.path()).unwrap(), m);
        // What the change listing reads.
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(v["rootfs"], "/images/abc/rootfs");

        let mut newer = m.clone();
        newer.format = CHECKPOINT_FORMAT + 1;
        let p = newer.write_pending(dir.path()).unwrap();
        Manifest::commit(&p, dir.path()).unwrap();
        let e = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("newer"), "{e}");
    }
}
