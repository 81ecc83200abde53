//! Checkpoints of a running VM (pause: checkpoint and end; snapshot: checkpoint and go on, for
//! fork): QMP `stop`, `migrate` of the whole machine to `<dir>/state` (RAM included: a clone's
//! RAM is private, so `x-ignore-shared` does not apply), a sparse copy of its writable disk to
//! `<dir>/disk.img` (QEMU drained and flushed it on `stop`), `checkpoint.json` last. A restore
//! starts QEMU with `-incoming defer` on its own copy of the disk (the checkpoint stays
//! restorable, also when a resume fails), feeds it the state and re-seeds it like a clone:
//! a fork must not share its parent's RNG state, and a resumed VM must not keep the clock of
//! its pause. Filesystem-only checkpoints (E2B's `memory: false`) are not supported.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use bulkhead_driver::{
    CheckpointInfo, CheckpointOptions, Driver, DriverError, DriverHandle, Operation,
    RestoreOptions, SandboxSpec,
};
use serde::{Deserialize, Serialize};

use crate::driver::{Launch, MicrovmDriver};
use crate::snapshot;
use crate::vm::{self, VmRecord};

const FORMAT: u32 = 1;
const META: &str = "checkpoint.json";

/// What a restore must reproduce: the machine the state was saved from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    format: u32,
    memory_mb: u64,
    cpus: u32,
    ram_backend: bool,
    size_bytes: u64,
}

fn read_meta(dir: &Path) -> Option<Meta> {
    let meta: Meta = serde_json::from_slice(&fs::read(dir.join(META)).ok()?).ok()?;
    (meta.format == FORMAT
        && dir.join(snapshot::STATE).is_file()
        && dir.join(snapshot::DISK).is_file())
    .then_some(meta)
}

/// The checkpoint in `dir`, when it is a complete one of this driver.
fn info(dir: &Path) -> Option<CheckpointInfo> {
    let meta = read_meta(dir)?;
    Some(CheckpointInfo {
        driver: "microvm".into(),
        format: FORMAT,
        dir: dir.to_path_buf(),
        size_bytes: meta.size_bytes,
        memory: true,
    })
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.blocks() * 512).unwrap_or(0)
}

impl MicrovmDriver {
    /// [`info`] for the driver's `checkpoint_info`.
    pub(crate) fn checkpoint_dir_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        info(dir)
    }

    pub(crate) async fn checkpoint_vm(
        &self,
        h: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        if opts.filesystem_only {
            let op = if opts.leave_running {
                Operation::Snapshot
            } else {
                Operation::Checkpoint
            };
            return Err(DriverError::unsupported(self.name(), op));
        }
        let rec = self.live_record(h).ok_or(DriverError::NotRunning)?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| DriverError::io(what, e)
        };
        fs::create_dir_all(dir).map_err(io("create the checkpoint directory"))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(io("set the checkpoint directory's mode"))?;
        // The host's channel session is not part of the VM: drop it (the guest resynchronises
        // on the next session's HELLO, here or in the restored VM).
        self.vm_for(rec.clone()).session.lock().await.take();
        let (qmp_socket, state) = (rec.dir.join(vm::QMP_SOCKET), dir.join(snapshot::STATE));
        let saved = tokio::task::spawn_blocking(move || {
            crate::migrate::save_state(&qmp_socket, &state, false)
        })
        .await
        .map_err(|e| DriverError::io("checkpoint the VM", std::io::Error::other(e)))?;
        if let Err(e) = saved {
            // Leave the sandbox as it was.
            let _ = self.qmp_cont(&rec).await;
            return Err(DriverError::io(
                format!("checkpoint the VM ({})", self.output(&rec)),
                e,
            ));
        }
        let (disk, out) = (rec.dir.join(vm::RW_DISK), dir.join(snapshot::DISK));
        let copied = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let _ = fs::remove_file(&out);
            let src = fs::File::open(&disk)?;
            let dst = fs::File::create(&out)?;
            snapshot::sparse_copy(&src, &dst)
        })
        .await
        .map_err(|e| DriverError::io("copy the VM's disk", std::io::Error::other(e)))?;
        let meta = Meta {
            format: FORMAT,
            memory_mb: rec.memory_mb,
            cpus: rec.cpus,
            ram_backend: rec.ram_backend,
            size_bytes: allocated(&dir.join(snapshot::STATE))
                + allocated(&dir.join(snapshot::DISK)),
        };
        let written = copied.and_then(|()| {
            fs::write(
                dir.join(META),
                serde_json::to_vec(&meta).map_err(std::io::Error::other)?,
            )
        });
        if opts.leave_running {
            self.qmp_cont(&rec)
                .await
                .map_err(io("resume the VM after its snapshot"))?;
        } else {
            self.teardown(&rec).await;
        }
        written.map_err(io("write the checkpoint"))?;
        Ok(info(dir).unwrap_or(CheckpointInfo {
            driver: "microvm".into(),
            format: FORMAT,
            dir: dir.to_path_buf(),
            size_bytes: meta.size_bytes,
            memory: true,
        }))
    }

    async fn qmp_cont(&self, rec: &VmRecord) -> std::io::Result<()> {
        crate::qmp::execute(
            &rec.dir.join(vm::QMP_SOCKET),
            &[("cont", serde_json::Value::Null)],
        )
        .await
        .map(|_| ())
    }

    pub(crate) async fn restore_vm(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<VmRecord, DriverError> {
        if opts.filesystem_only {
            return Err(DriverError::unsupported(self.name(), Operation::Restore));
        }
        let meta = read_meta(dir).ok_or_else(|| {
            DriverError::io(
                format!("read the checkpoint in {}", dir.display()),
                std::io::Error::other("not a complete microvm checkpoint"),
            )
        })?;
        // The state fits only the machine it was saved from.
        let mut spec = spec.clone();
        spec.memory_mb = meta.memory_mb;
        spec.cpu_count = meta.cpus;
        let launch = Launch::Checkpoint {
            dir: dir.to_path_buf(),
            backend: meta.ram_backend,
        };
        let rec = self.launch_and_wait(&spec, &launch).await?;
        if let Err(e) = self
            .reseed(&rec, spec.pids_max, opts.access_token.as_deref())
            .await
        {
            self.teardown(&rec).await;
            return Err(e);
        }
        tracing::info!(template = %spec.template_id, checkpoint = %dir.display(), "microvm: restored a checkpoint");
        Ok(rec)
    }
}
