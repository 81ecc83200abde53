//! `Driver::checkpoint`: pause (the sandbox ends, its RAM and slot are freed) and snapshot
//! (it runs on). One sequence for both, so memory and files always match:
//!
//! 1. freeze the sandbox's cgroup; remove its network link (the engine re-opens one for a
//!    sandbox that runs on, and for a restored one);
//! 2. CRIU dumps memory and processes, leaving the cgroup frozen (skipped when
//!    filesystem-only);
//! 3. the sandbox's disk is synced and its image moved (pause) or copied (snapshot: only its
//!    used extents, or a reflink) into the checkpoint, with the agent's log; the manifest is
//!    written under a temporary name, then synced;
//! 4. the manifest is renamed into place: only now is the checkpoint complete;
//! 5. pause: the sandbox is killed and its slot torn down; snapshot: thawed.
//!
//! Anything failing before step 4 thaws the sandbox, which runs on as before, and removes
//! what was written; a disk filling up is reported as such.

use std::fs;
use std::io;
use std::path::Path;

use bulkhead_driver::{CheckpointInfo, CheckpointOptions, DriverError, DriverHandle};

use super::fsutil::{copy_sandbox_file, disk_usage};
use bulkhead_common::copy::copy_file_sparse;

use super::disk;
use super::manifest::{AGENT_LOG, CHECKPOINT_FORMAT, IMAGES, MANIFEST, Manifest};
use super::seed::{MOVED_TO, record_move};
use super::state::{DRIVER_NAME, HandleData, JailDriver};
use crate::criu::{Criu, CriuError, ExternalMount, dump_args};
use crate::mountplan::SOCK_DIR;
use crate::slots;

/// How long one CRIU run may take (a dump writes the sandbox's whole memory).
pub(super) const CRIU_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The image key of the agent socket directory, whose host path is per slot.
pub(super) const SOCK_KEY: &str = "sock";
/// The image key of the agent binary, restored from the exact file the sandbox ran.
pub(super) const AGENT_KEY: &str = "agent";
/// Image keys of volume mounts: `vol0`, `vol1`, … (re-attached from the restore's spec).
pub(super) const VOLUME_KEY_PREFIX: &str = "vol";

impl JailDriver {
    pub(super) fn criu(&self) -> Result<Criu, DriverError> {
        let binary = self
            .inner
            .cfg
            .criu
            .clone()
            .ok_or_else(|| criu_error(CriuError::NotConfigured))?;
        Ok(Criu {
            binary,
            timeout: CRIU_TIMEOUT,
        })
    }

    /// What a memory image written now depends on: the agent build (its content-addressed file
    /// name), the CRIU binary's version and this driver's image format. None without CRIU.
    pub(super) fn compute_checkpoint_key(&self) -> Option<String> {
        let criu = self.inner.cfg.criu.as_ref()?;
        let version = match Criu::check(criu) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "criu --version failed"
                );
                return None;
            }
        };
        let agent = self.inner.agent.file_name()?.to_string_lossy().into_owned();
        Some(format!(
            "jail format {}; agent {agent}; {}",
            CHECKPOINT_FORMAT,
            version.replace('\n', " ")
        ))
    }

    /// A complete checkpoint of this driver in `dir` (its manifest is in place), as
    /// `checkpoint` reported it.
    pub(super) fn read_checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        let m = Manifest::read(dir).ok()?;
        (m.driver == DRIVER_NAME).then(|| CheckpointInfo {
            driver: DRIVER_NAME.into(),
            format: m.format,
            dir: dir.to_path_buf(),
            size_bytes: disk_usage(dir),
            memory: m.memory,
        })
    }

    /// A checkpoint that failed before the sandbox was killed: give back the disk image a pause
    /// moved out, thaw the sandbox (it runs on with its state) and forget what was written.
    async fn abandon_checkpoint(&self, handle: &DriverHandle, dir: &Path, slot_dir: &Path) {
        let (moved, image) = (dir.join(disk::IMAGE), slot_dir.join(disk::IMAGE));
        if moved.exists() && !image.exists() {
            let _ = fs::rename(&moved, &image);
        }
        let _ = fs::remove_file(slot_dir.join(MOVED_TO));
        let _ = self.set_frozen(handle, false).await;
        let _ = fs::remove_dir_all(dir);
    }

    pub(super) async fn checkpoint_sandbox(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        let sb = self.lookup(handle).ok_or(DriverError::NotRunning)?;
        if sb.exited().is_some() {
            return Err(DriverError::NotRunning);
        }
        let criu = if opts.filesystem_only {
            None
        } else {
            Some(self.criu()?)
        };
        let data: HandleData = serde_json::from_value(handle.data.clone())
            .map_err(|e| DriverError::io("read the sandbox handle", io::Error::other(e)))?;
        let freezer =
            self.inner.cgroups.freezer(&sb.cgroup).ok_or_else(|| {
                criu_error(CriuError::io("freeze", io::Error::other("no freezer")))
            })?;
        if dir.exists()
            && fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(true)
        {
            return Err(DriverError::io(
                format!("checkpoint directory {} is not empty", dir.display()),
                io::Error::from(io::ErrorKind::AlreadyExists),
            ));
        }
        fs::create_dir_all(dir)
            .map_err(|e| DriverError::io(format!("create {}", dir.display()), e))?;
        // Owner-only: the sandbox's files (its set-uid ones included) and its memory.
        fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| DriverError::io(format!("chmod {}", dir.display()), e))?;

        let pids = self.inner.cgroups.pids(&sb.cgroup).unwrap_or_default();
        wait_for_host_connections_to_close(&pids).await?;
        let t0 = std::time::Instant::now();
        self.set_frozen(handle, true).await?;
        let slot_dir = self.slot_dir(handle.slot);
        let manifest = Manifest {
            format: CHECKPOINT_FORMAT,
            driver: DRIVER_NAME.into(),
            memory: criu.is_some(),
            rootfs: data.rootfs.clone(),
            uid_base: slots::slot_uid(self.inner.cfg.uid_base, handle.slot),
            slot: handle.slot,
            agent: data.agent.clone(),
            volumes: data
                .volumes
                .iter()
                .enumerate()
                .map(|(i, path)| (format!("{VOLUME_KEY_PREFIX}{i}"), path.clone()))
                .collect(),
        };
        let written = async {
            remove_network_link(handle.pid).await?;
            if let Some(criu) = &criu {
                let images = dir.join(IMAGES);
                fs::create_dir(&images)
                    .map_err(|e| DriverError::io("create the image directory", e))?;
                let mut external = vec![ExternalMount {
                    mountpoint: SOCK_DIR.into(),
                    key: SOCK_KEY.into(),
                }];
                for (key, path) in &manifest.volumes {
                    external.push(ExternalMount {
                        mountpoint: path.clone(),
                        key: key.clone(),
                    });
                }
                if data.agent.is_some() {
                    external.push(ExternalMount {
                        mountpoint: crate::mountplan::AGENT_PATH.into(),
                        key: AGENT_KEY.into(),
                    });
                }
                let args = dump_args(handle.pid, &images, &freezer.cgroup_dir(), &external);
                let mut attempt = 1;
                loop {
                    match criu.run("dump", &args, &images.join("dump.log"), &[]).await {
                        Ok(()) => break,
                        // See `is_transient`: thaw, let the tree settle, try again.
                        Err(e) if attempt < DUMP_ATTEMPTS && is_transient(&e) => {
                            attempt += 1;
                            self.set_frozen(handle, false).await?;
                            tokio::time::sleep(std::time::Duration::from_millis(20 * attempt))
                                .await;
                            wait_for_host_connections_to_close(&pids).await?;
                            self.set_frozen(handle, true).await?;
                            clear_dir(&images)
                                .map_err(|e| DriverError::io("clear the image directory", e))?;
                        }
                        Err(e) => return Err(criu_error(e)),
                    }
                }
            }
            tracing::debug!(dumped = ?t0.elapsed(), "checkpoint dump done");
            let (slot_dir, cdir, leave_running) =
                (slot_dir.clone(), dir.to_path_buf(), opts.leave_running);
            let manifest = manifest.clone();
            tokio::task::spawn_blocking(move || -> io::Result<std::path::PathBuf> {
                let dir = cdir;
                copy_sandbox_file(
                    &slot_dir.join("sock").join(AGENT_LOG),
                    &dir.join(AGENT_LOG),
                    None,
                )?;
                // The sandbox is frozen: once its disk is synced, the image is a consistent
                // filesystem (its journal replays on the next mount).
                disk::sync(&slot_dir.join(disk::MOUNT))?;
                let (from, to) = (slot_dir.join(disk::IMAGE), dir.join(disk::IMAGE));
                if leave_running {
                    copy_file_sparse(&from, &to)?;
                } else {
                    // Recorded first: whoever finds the sandbox alive later gives it back.
                    record_move(&slot_dir, &to)?;
                    if let Err(e) = fs::rename(&from, &to) {
                        if e.raw_os_error() != Some(libc::EXDEV) {
                            return Err(e);
                        }
                        copy_file_sparse(&from, &to)?;
                    }
                }
                let pending = manifest.write_pending(&dir)?;
                let t = std::time::Instant::now();
                disk::sync(&dir)?;
                tracing::debug!(sync = ?t.elapsed(), "checkpoint synced");
                Ok(pending)
            })
            .await
            .map_err(|e| DriverError::io("checkpoint task", io::Error::other(e)))?
            .map_err(|e| checkpoint_io(e, dir))
        }
        .await;

        let t_written = t0.elapsed();
        let pending = match written {
            Ok(p) => p,
            Err(e) => {
                self.abandon_checkpoint(handle, dir, &slot_dir).await;
                return Err(e);
            }
        };
        // Complete before the sandbox goes: a server dying in between leaves a live sandbox and
        // a complete checkpoint (either is a valid outcome), never neither.
        if let Err(e) = Manifest::commit(&pending, dir) {
            self.abandon_checkpoint(handle, dir, &slot_dir).await;
            return Err(checkpoint_io(e, dir));
        }
        if opts.leave_running {
            self.set_frozen(handle, false).await?;
        } else {
            let cgroup = sb.cgroup.clone();
            if let Err(e) = self
                .teardown(
                    handle.slot,
                    handle.pid,
                    handle.pid_start_time,
                    Some(&cgroup),
                    false,
                )
                .await
            {
                // The checkpoint is complete; `stop` finishes the cleanup.
                tracing::warn!(slot = handle.slot, error = %e, "teardown after a pause");
            }
        }
        let info = CheckpointInfo {
            driver: DRIVER_NAME.into(),
            format: CHECKPOINT_FORMAT,
            dir: dir.to_path_buf(),
            size_bytes: disk_usage(dir),
            memory: manifest.memory,
        };
        tracing::debug!(slot = handle.slot, ?t_written, total = ?t0.elapsed(), "checkpoint phases");
        tracing::debug!(slot = handle.slot, dir = %dir.display(), memory = info.memory,
            leave_running = opts.leave_running, size = info.size_bytes, "jail checkpoint written");
        debug_assert!(dir.join(MANIFEST).exists());
        Ok(info)
    }
}

/// Dumps tried when something transient got in the way (see [`is_transient`]). A tree that
/// forks without pause can catch a child mid-exit at every freeze on a loaded host (CI saw four
/// in a row): eight tries, the pauses between them growing to 160 ms (under a second in all).
const DUMP_ATTEMPTS: u64 = 8;

/// A dump failure that another try avoids: a connection from the host still queued at the
/// agent's listening socket (e.g. a health probe not yet accepted: the agent takes it), a
/// process that exited while CRIU seized the tree (a command that had just finished), or one
/// the freezer caught mid-exec or mid-exit (state D: "unseizable"), which thawing lets finish.
fn is_transient(e: &CriuError) -> bool {
    matches!(e, CriuError::Failed { log_tail, .. }
        if (log_tail.contains("Unix socket") && log_tail.contains("not found"))
            || log_tail.contains("Unable to detach from")
            || log_tail.contains("Unseizable non-zombie")
            || (log_tail.contains("Unable to seize") && log_tail.contains("No such process")))
}

fn clear_dir(dir: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            fs::remove_dir_all(&p)?;
        } else {
            fs::remove_file(&p)?;
        }
    }
    Ok(())
}

/// How long a checkpoint waits for connections from the host to the agent to close.
const HOST_CONNECTIONS_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// A Unix connection the server opened to the agent belongs to the host's network namespace
/// (the kernel puts the accepted socket in the connecting side's), so CRIU cannot find it in
/// the sandbox's and refuses to dump. The engine closes its connections before a checkpoint;
/// this waits until the agent has closed its ends too.
async fn wait_for_host_connections_to_close(pids: &[i32]) -> Result<(), DriverError> {
    let deadline = std::time::Instant::now() + HOST_CONNECTIONS_BUDGET;
    loop {
        let pids = pids.to_vec();
        let open = tokio::task::spawn_blocking(move || host_socket_fds(&pids))
            .await
            .unwrap_or(0);
        if open == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(DriverError::io(
                format!(
                    "{open} connection(s) from the host to the sandbox are still open: close \
                     them (end the streams to this sandbox) and retry; the sandbox keeps running"
                ),
                io::Error::from(io::ErrorKind::ResourceBusy),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// How many descriptors of `pids` are Unix sockets of the host's network namespace.
fn host_socket_fds(pids: &[i32]) -> usize {
    let host: std::collections::HashSet<u64> = fs::read_to_string("/proc/self/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(6)?.parse().ok())
        .collect();
    let mut n = 0;
    for pid in pids {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = fs::read_link(fd.path()) else {
                continue;
            };
            let link = link.to_string_lossy();
            if let Some(ino) = link
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|i| i.parse::<u64>().ok())
                && host.contains(&ino)
            {
                n += 1;
            }
        }
    }
    n
}

/// The sandbox's TUN link (`eth0`) is attached to the server's egress stack, which CRIU cannot
/// dump; the link goes, and the engine re-opens one where the sandbox runs again.
async fn remove_network_link(pid: i32) -> Result<(), DriverError> {
    let has_link = || {
        let dev = fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
        dev.lines().any(|l| l.trim_start().starts_with("eth0:"))
    };
    if !has_link() {
        return Ok(());
    }
    let out = tokio::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["--", "ip", "link", "delete", "eth0"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .await
        .map_err(|e| DriverError::io("run nsenter/ip to remove the sandbox's network link", e))?;
    // The engine detaching the link (its TUN closed) removes eth0 too: a delete that lost
    // that race found nothing left to remove.
    if !out.status.success() && has_link() {
        return Err(DriverError::io(
            "remove the sandbox's network link before the checkpoint",
            io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(())
}

fn checkpoint_io(e: io::Error, dir: &Path) -> DriverError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        return DriverError::io(
            format!(
                "The disk holding {} is full: the checkpoint was not written and the sandbox \
                 keeps running; free space in the data directory and retry",
                dir.display()
            ),
            e,
        );
    }
    DriverError::io("write the checkpoint; the sandbox keeps running", e)
}

/// CRIU's errors as driver errors, with the operator's fix in the message.
pub(super) fn criu_error(e: CriuError) -> DriverError {
    let context = if e.is_disk_full() {
        "The disk holding the data directory is full: nothing was checkpointed and the sandbox \
         keeps running; free space and retry"
            .to_string()
    } else {
        match &e {
            CriuError::NotConfigured | CriuError::Spawn { .. } => {
                "Checkpoint/restore is not available on this server".to_string()
            }
            _ => "Checkpoint/restore failed".to_string(),
        }
    };
    DriverError::io(context, io::Error::other(e))
}
