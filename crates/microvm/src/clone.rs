//! Create = clone from a snapshot. The first start of a template (per machine shape) boots a
//! *template VM* with its RAM on a file, waits for its agent (and its warm kernels), stops it
//! and saves the snapshot ([`crate::snapshot`]); that start and every later one then restores a
//! clone: private copy-on-write RAM, its own copy of the snapshot's disk, a new agent channel
//! session (the guest side resynchronises on its HELLO), and fresh entropy and clock through
//! the agent's `POST /bulkhead/cloned`. Identity (env, token, user) comes afterwards from the
//! engine's `/init`, as for every sandbox.
//!
//! A start falls back to a cold boot, and says so in the log, when the snapshot cannot be taken
//! (remembered for this driver's life: a host that cannot snapshot does not pay a failed
//! attempt per start) or a restore from it fails (the snapshot is deleted and taken again by
//! the next start).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bulkhead_driver::{DriverError, SandboxSpec, StartError};
use bulkhead_envd::protocol::{CLONED_PATH, ClonedRequest, WARM_PATH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::MicrovmError;
use crate::driver::{Launch, MicrovmDriver, Vm};
use crate::migrate;
use crate::snapshot::{self, KeyInputs};
use crate::vm::{self, VmRecord};

/// Why a start cannot be a clone of the template's snapshot (the caller boots cold and logs
/// this).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CloneError {
    /// The template's or the boot disk's image could not be made.
    #[error(transparent)]
    Image(MicrovmError),
    #[error("hash the guest kernel: {0}")]
    KernelHash(#[source] std::io::Error),
    #[error("{0}")]
    QemuVersion(#[source] std::io::Error),
    /// An earlier attempt at this snapshot failed (`why`, kept for the driver's life).
    #[error("taking snapshot {key} failed earlier ({why}); restart the server to try again")]
    FailedEarlier { key: String, why: String },
    #[error("taking snapshot {key} failed: {}", bulkhead_common::error_chain(.source))]
    Take {
        key: String,
        #[source]
        source: DriverError,
    },
    #[error(
        "restoring snapshot {key} failed ({}); it was deleted and the next start takes it again",
        bulkhead_common::error_chain(.source)
    )]
    Restore {
        key: String,
        #[source]
        source: DriverError,
    },
}

impl MicrovmDriver {
    /// A clone of the template's snapshot (taken first when missing), or a cold boot when no
    /// snapshot can be used.
    pub(crate) async fn start_vm(&self, spec: &SandboxSpec) -> Result<VmRecord, DriverError> {
        if !self.cfg.snapshots {
            return self.start_cold(spec).await;
        }
        if !spec.rootfs.is_dir() {
            return Err(StartError::RootfsMissing.into());
        }
        let t0 = Instant::now();
        match self.start_clone(spec).await {
            Ok(rec) => {
                tracing::info!(
                    template = %spec.template_id,
                    snapshot = rec.snapshot.as_deref().unwrap_or(""),
                    ms = t0.elapsed().as_millis() as u64,
                    "microvm start: clone of the template snapshot"
                );
                Ok(rec)
            }
            Err(reason) => {
                tracing::warn!(
                    template = %spec.template_id,
                    %reason,
                    "microvm start: cold boot (no usable template snapshot)"
                );
                let rec = self.start_cold(spec).await?;
                tracing::info!(
                    template = %spec.template_id,
                    ms = t0.elapsed().as_millis() as u64,
                    "microvm start: cold boot done"
                );
                Ok(rec)
            }
        }
    }

    /// What the snapshot of `spec`'s template depends on.
    async fn key_inputs(&self, spec: &SandboxSpec) -> Result<KeyInputs, CloneError> {
        let root = self
            .images
            .template_image(&spec.rootfs)
            .await
            .map_err(CloneError::Image)?;
        let boot = self
            .images
            .boot_image(&self.cfg.agent_binary, self.cfg.sandbox_ca_pem.as_deref())
            .await
            .map_err(CloneError::Image)?;
        let state = &self.snap_state;
        let kernel = snapshot::kernel_hash(&state.kernel, &self.cfg.kernel)
            .map_err(CloneError::KernelHash)?;
        let cached = state.qemu.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let qemu = match cached {
            Some(v) => v,
            None => {
                let v = snapshot::qemu_version(&self.cfg.qemu).map_err(CloneError::QemuVersion)?;
                *state.qemu.lock().unwrap_or_else(|p| p.into_inner()) = Some(v.clone());
                v
            }
        };
        let name = |p: &Path| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        };
        Ok(KeyInputs {
            format: snapshot::FORMAT,
            root_disk: name(&root),
            boot_disk: name(&boot),
            kernel,
            qemu,
            memory_mb: spec.memory_mb,
            cpus: spec.cpu_count.max(1),
            disk_mb: self.cfg.disk_mb,
            accel: format!("{:?}", self.accel().accel).to_lowercase(),
            agent_log: self.cfg.agent_log.clone(),
        })
    }

    /// Err: why this start cannot be a clone (the caller boots cold).
    async fn start_clone(&self, spec: &SandboxSpec) -> Result<VmRecord, CloneError> {
        let inputs = self.key_inputs(spec).await?;
        let key = inputs.key();
        let failed = self.failed(&key);
        if let Some(why) = failed {
            return Err(CloneError::FailedEarlier { key, why });
        }
        if self.snapshots.valid(&key).is_none() {
            let _one = self.snap_state.building.lock().await;
            if self.snapshots.valid(&key).is_none() {
                let t0 = Instant::now();
                tracing::info!(template = %spec.template_id, snapshot = %key, "microvm: taking the template snapshot");
                if let Err(e) = self.take_snapshot(spec, &inputs).await {
                    let why = bulkhead_common::error_chain(&e);
                    self.snap_state
                        .failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key.clone(), why);
                    return Err(CloneError::Take { key, source: e });
                }
                tracing::info!(template = %spec.template_id, snapshot = %key, ms = t0.elapsed().as_millis() as u64, "microvm: template snapshot saved");
            }
        }
        let restored = async {
            let (snaps, k) = (self.snapshots.clone(), key.clone());
            let ram = tokio::task::spawn_blocking(move || snaps.ram(&k))
                .await
                .map_err(|e| DriverError::io("load the snapshot's RAM", std::io::Error::other(e)))?
                .map_err(|e| DriverError::io("load the snapshot's RAM", e))?;
            let launch = Launch::Clone {
                key: key.clone(),
                ram,
            };
            let rec = self.launch_and_wait(spec, &launch).await?;
            if let Err(e) = self.reseed(&rec, spec.pids_max, None).await {
                self.teardown(&rec).await;
                return Err(e);
            }
            Ok(rec)
        };
        restored.await.map_err(|source: DriverError| {
            self.snapshots.invalidate(&key);
            CloneError::Restore { key, source }
        })
    }

    fn failed(&self, key: &str) -> Option<String> {
        self.snap_state
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Boots the template VM, waits until it is ready, saves it as snapshot `inputs.key()`.
    async fn take_snapshot(
        &self,
        spec: &SandboxSpec,
        inputs: &KeyInputs,
    ) -> Result<(), DriverError> {
        let key = inputs.key();
        let (slot, dir) = self.claim_slot()?;
        let uid = self.cfg.uid_base + slot;
        let staging = match self.snapshots.staging(&key, uid) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(DriverError::io("make the snapshot's staging directory", e));
            }
        };
        let launch = Launch::Template {
            ram: staging.join(snapshot::RAM),
        };
        let rec = match self.boot(spec, slot, dir.clone(), &launch).await {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                let _ = std::fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        let saved = async {
            let vm = self.vm_for(rec.clone());
            self.wait_ready(&vm).await?;
            // Clones start without network, as cold boots do (the carrier is part of the state).
            Self::set_link(&rec, false).await?;
            // Code-interpreter templates: the kernels start with the agent; wait until they
            // run and are warmed, so clones have them at once (204, or 404 from an agent
            // without the route).
            self.agent_post(&vm, WARM_PATH, None, None, self.cfg.start_timeout)
                .await
                .and_then(|status| match status {
                    200..=299 | 404 => Ok(()),
                    s => Err(std::io::Error::other(format!(
                        "the agent answered {s} to {WARM_PATH}"
                    ))),
                })
                .map_err(|e| DriverError::io("wait for the template's kernels", e))?;
            // Clones open their own channel session; this one must not be in the snapshot.
            vm.session.lock().await.take();
            let (qmp_socket, state) = (rec.dir.join(vm::QMP_SOCKET), staging.join(snapshot::STATE));
            tokio::task::spawn_blocking(move || migrate::save_state(&qmp_socket, &state, true))
                .await
                .map_err(|e| DriverError::io("save the VM", std::io::Error::other(e)))?
                .map_err(|e| DriverError::io(format!("save the VM ({})", self.output(&rec)), e))?;
            // QEMU flushed the disk on `stop`; it is complete once QEMU is gone.
            vm::kill(rec.pid, rec.pid_start_time).await;
            let (from, to) = (rec.dir.join(vm::RW_DISK), staging.join(snapshot::DISK));
            let (stage, inputs, template) =
                (staging.clone(), inputs.clone(), spec.template_id.clone());
            let snaps = self.snapshots.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                move_file(&from, &to)?;
                snaps.commit(&stage, inputs, &template).map(|_| ())
            })
            .await
            .map_err(|e| DriverError::io("store the snapshot", std::io::Error::other(e)))?
            .map_err(|e| DriverError::io("store the snapshot", e))
        };
        let r = saved.await;
        self.teardown(&rec).await;
        if r.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        r
    }

    /// Restores the saved device state (and, without `ignore_shared`, RAM) at `state` into the
    /// just spawned VM and lets it run.
    pub(crate) async fn load_state(
        &self,
        rec: &VmRecord,
        state: PathBuf,
        ignore_shared: bool,
    ) -> std::io::Result<()> {
        let state = std::fs::File::open(state)?;
        let qmp_socket = rec.dir.join(vm::QMP_SOCKET);
        tokio::task::spawn_blocking(move || migrate::load_state(&qmp_socket, &state, ignore_shared))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Fresh entropy, the host's clock and the sandbox's process limit `pids_max` for a clone
    /// (`POST /bulkhead/cloned`), which also re-seeds the kernels' generators of a
    /// code-interpreter template.
    /// `token`: the agent's access token when its memory holds one (a secured sandbox).
    pub(crate) async fn reseed(
        &self,
        rec: &VmRecord,
        pids_max: u64,
        token: Option<&str>,
    ) -> Result<(), DriverError> {
        let mut entropy = [0u8; 64];
        getrandom(&mut entropy).map_err(|e| DriverError::io("read host randomness", e))?;
        let body = ClonedRequest {
            entropy: Some(entropy.iter().map(|b| format!("{b:02x}")).collect()),
            clock_unix_ns: Some(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0),
            ),
            pids_max: Some(pids_max),
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| DriverError::io("encode the re-seed", std::io::Error::other(e)))?;
        let vm = self.vm_for(rec.clone());
        match self
            .agent_post(&vm, CLONED_PATH, Some(body), token, self.cfg.start_timeout)
            .await
        {
            Ok(204) => Ok(()),
            Ok(s) => Err(DriverError::io(
                "re-seed the clone",
                std::io::Error::other(format!(
                    "the agent answered {s} to {CLONED_PATH}: {}",
                    self.output(rec)
                )),
            )),
            Err(e) => Err(DriverError::io("re-seed the clone", e)),
        }
    }

    /// `POST path` to the agent over a new channel stream; the answer's status code.
    async fn agent_post(
        &self,
        vm: &Vm,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
        limit: Duration,
    ) -> std::io::Result<u16> {
        let body = body.unwrap_or_default();
        let auth = token
            .map(|t| format!("X-Access-Token: {t}\r\n"))
            .unwrap_or_default();
        let exchange = async {
            let mut s = self.open_stream(vm).await.map_err(std::io::Error::other)?;
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n{auth}\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await?;
            s.write_all(&body).await?;
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).await?;
            status_code(&answer).ok_or_else(|| {
                std::io::Error::other(format!(
                    "no HTTP answer to {path}: {:?}",
                    String::from_utf8_lossy(&answer[..answer.len().min(200)])
                ))
            })
        };
        tokio::time::timeout(limit, exchange).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the agent did not answer {path} in time"),
            )
        })?
    }
}

fn status_code(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\r').next()?;
    std::str::from_utf8(line)
        .ok()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    std::io::Read::read_exact(&mut f, buf)
}

/// `rename`, or a sparse copy and removal across file systems (slots and the cache may be on
/// different ones).
pub(crate) fn move_file(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let src = std::fs::File::open(from)?;
            let out = std::fs::File::create(to)?;
            snapshot::sparse_copy(&src, &out)?;
            std::fs::remove_file(from)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_read_from_the_answer() {
        assert_eq!(status_code(b"HTTP/1.1 204 No Content\r\n\r\n"), Some(204));
        assert_eq!(status_code(b"HTTP/1.1 404 Not Found\r\n"), Some(404));
        assert_eq!(status_code(b"garbage"), None);
        assert_eq!(status_code(b""), None);
    }
}
