//! `Driver::restore`: a new sandbox from a checkpoint. Filesystem-only checkpoints boot the
//! template afresh on the saved files (the start pipeline with a [`Seed`]). With memory, a
//! slot is prepared as for a start, then CRIU rebuilds the process tree:
//!
//! 1. a slot (the one it was saved from when free: no re-owning), its fresh directory;
//! 2. a copy of the checkpoint's disk, mounted and re-owned for the slot's uid range ([`Seed`]),
//!    the agent's log copied to where the restored agent has it open;
//! 3. the slot's idmapped template view and the sandbox's cgroups;
//! 4. the images, hard-linked into the slot (so one snapshot serves concurrent forks) with the
//!    user namespace maps rewritten for the slot;
//! 5. the overlay mounted on the host as CRIU's `--root`; CRIU, started inside the sandbox's
//!    cgroups, restores detached, and the init is re-parented to the server;
//! 6. the host's view of the overlay is detached (the sandbox's mount namespace keeps its
//!    own), and the sandbox is registered and waited for like a started one.
//!
//! The restored sandbox has no network link (the engine opens one) and no Landlock domain
//! (CRIU cannot restore one): see `docs/threat-model.md`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bulkhead_driver::{DriverError, DriverHandle, RestoreOptions, SandboxSpec, StartError};

use super::checkpoint::{AGENT_KEY, SOCK_KEY, criu_error};
use super::disk;
use super::fsutil::copy_sandbox_file;
use super::launch::LaunchError;
use super::manifest::{AGENT_LOG, IMAGES, Manifest};
use super::seed::Seed;
use super::state::{DRIVER_NAME, HandleData, JailDriver};
use crate::cgroup::CgroupLimits;
use crate::criu::{image, restore_args};
use crate::spec::{IdmapSpec, LaunchReply, LaunchRequest};
use crate::{IDS_PER_SLOT, sys};

impl JailDriver {
    pub(super) async fn restore_sandbox(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        let m = Manifest::read(dir)?;
        if m.driver != DRIVER_NAME {
            return Err(StartError::Config(format!(
                "checkpoint {} was written by the {} driver; only it can restore it",
                dir.display(),
                m.driver
            ))
            .into());
        }
        let seed = Seed {
            dir: dir.to_path_buf(),
            uid_base: m.uid_base,
            slot: m.slot,
        };
        // A filesystem-only checkpoint, or a resume that asks to ignore the memory (E2B's
        // `memory: false`), boots afresh on the saved files.
        if !m.memory || opts.filesystem_only {
            return self.start_sandbox(spec, Some(&seed), false).await;
        }
        if !spec.rootfs.is_dir() {
            return Err(StartError::RootfsMissing.into());
        }
        let started = Instant::now();
        let slot = self.reserve_slot_preferring(Some(m.slot))?;
        let cgroup_name = format!("{slot}-{:08x}", sys::random_u64() as u32);
        match self
            .restore_in_slot(slot, &cgroup_name, spec, dir, &m, &seed)
            .await
        {
            Ok(h) => {
                tracing::debug!(slot, pid = h.pid, elapsed = ?started.elapsed(), "jail sandbox restored");
                Ok(h)
            }
            Err(e) => {
                self.clean_failed_start(slot, &cgroup_name).await;
                Err(e)
            }
        }
    }

    async fn restore_in_slot(
        &self,
        slot: u32,
        cgroup_name: &str,
        spec: &SandboxSpec,
        dir: &Path,
        m: &Manifest,
        seed: &Seed,
    ) -> Result<DriverHandle, DriverError> {
        let criu = self.criu()?;
        let deadline = Instant::now() + self.inner.cfg.start_timeout;
        let agent = match &m.agent {
            Some(a) if a.is_file() => a.clone(),
            Some(a) => {
                return Err(StartError::Config(format!(
                    "the agent binary this sandbox was saved with ({}) is gone; it cannot be \
                     restored with memory (a filesystem-only resume still works)",
                    a.display()
                ))
                .into());
            }
            None => self.inner.agent.clone(),
        };
        let t0 = Instant::now();
        let sdir = self.fresh_slot_dir(slot)?;
        self.make_disk(slot, spec.disk_mb, Some(seed)).await?;
        let t_seed = t0.elapsed();
        let uid = self.slot_uid(slot);
        copy_sandbox_file(
            &dir.join(AGENT_LOG),
            &sdir.join("sock").join(AGENT_LOG),
            Some(uid),
        )
        .map_err(|e| DriverError::io("copy the agent log into the slot", e))?;
        let lower = self.ensure_lower(slot, &spec.rootfs).await?;
        let procs = self
            .inner
            .cgroups
            .create(
                cgroup_name,
                &CgroupLimits::new(spec.memory_mb, spec.pids_max, spec.cpu_count),
            )
            .map_err(|e| DriverError::io(format!("create cgroup {cgroup_name}"), e))?;

        let t_prep = t0.elapsed();
        let images = sdir.join("img");
        let (src, dst) = (dir.join(IMAGES), images.clone());
        let from = m.uid_base;
        tokio::task::spawn_blocking(move || link_images(&src, &dst, from, uid))
            .await
            .map_err(|e| DriverError::io("image task", io::Error::other(e)))??;

        let mut external = vec![
            (SOCK_KEY.to_string(), sdir.join("sock")),
            (AGENT_KEY.to_string(), agent.clone()),
        ];
        let views = self.volume_views(slot, spec, m).await;
        let merged = sdir.join("merged");
        let restored = match &views {
            Ok(views) => {
                external.extend(views.iter().cloned());
                let disk = sdir.join(disk::MOUNT);
                match mount_overlay(
                    &lower,
                    &disk.join(disk::UPPER),
                    &disk.join(disk::WORK),
                    &merged,
                ) {
                    Ok(()) => {
                        let pidfile = sdir.join("restore.pid");
                        let args = restore_args(&images, &merged, &pidfile, &external);
                        criu.run("restore", &args, &images.join("restore.log"), &procs)
                            .await
                            .map_err(criu_error)
                    }
                    Err(e) => Err(DriverError::io(
                        "mount the sandbox's overlay for the restore",
                        e,
                    )),
                }
            }
            Err(_) => Ok(()),
        };
        // The restored mount namespace holds its own references to the overlay and volumes.
        let _ = sys::umount_detach(&merged);
        for (_, view) in views.as_ref().map(Vec::as_slice).unwrap_or_default() {
            let _ = sys::umount_detach(view);
        }
        views?;
        restored?;
        let t_criu = t0.elapsed();
        let pidfile = sdir.join("restore.pid");

        let pid: i32 = fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| {
                DriverError::io(
                    "read the restored sandbox's pid",
                    io::Error::from(io::ErrorKind::NotFound),
                )
            })?;
        let start_time = sys::proc_start_time(pid)
            .map_err(|e| DriverError::io("read the restored sandbox's start time", e))?;
        let sb = self
            .register_started(slot, &sdir, pid, start_time, cgroup_name)
            .await?;
        let _ = fs::remove_dir_all(&images);
        let handle = DriverHandle::new(
            DRIVER_NAME,
            pid,
            start_time,
            slot,
            serde_json::to_value(HandleData {
                cgroup: cgroup_name.to_string(),
                cgroup_version: self.inner.cgroups.version(),
                lower,
                agent: Some(agent),
                rootfs: Some(spec.rootfs.clone()),
                volumes: m.volumes.iter().map(|(_, path)| path.clone()).collect(),
            })
            .expect("handle data serialises"),
        );
        self.wait_for_socket(slot, &sb, deadline).await?;
        let t_socket = t0.elapsed();
        tracing::debug!(slot, ?t_seed, ?t_prep, ?t_criu, ?t_socket, total = ?t0.elapsed(),
            "restore phases (cumulative)");
        Ok(handle)
    }
}

impl JailDriver {
    /// For each volume the checkpoint had mounted: an idmapped, writable view of the volume
    /// (from the restore's spec, matched by mount path) for this slot's uid range, which CRIU
    /// binds at the volume's mount point. The caller detaches the views after the restore.
    async fn volume_views(
        &self,
        slot: u32,
        spec: &SandboxSpec,
        m: &Manifest,
    ) -> Result<Vec<(String, PathBuf)>, DriverError> {
        let mut views = Vec::new();
        for (i, (key, path)) in m.volumes.iter().enumerate() {
            let Some(v) = spec.volumes.iter().find(|v| &v.path == path) else {
                return Err(StartError::Config(format!(
                    "the sandbox had a volume mounted at {path}, which this restore does not \
                     mount; restore it with its volumes"
                ))
                .into());
            };
            let target = self.slot_dir(slot).join(format!("vol-{i}"));
            let req = LaunchRequest::Idmap(IdmapSpec {
                source: v.host_dir.clone(),
                target: target.clone(),
                uid_base: self.slot_uid(slot),
                id_count: IDS_PER_SLOT,
                volume: true,
            });
            let timeout = self.inner.cfg.start_timeout;
            match self.inner.launcher.run(&req, timeout).await {
                Ok(LaunchReply::Done { ok: true }) => views.push((key.clone(), target)),
                other => {
                    for (_, view) in &views {
                        let _ = sys::umount_detach(view);
                    }
                    let failure = match other {
                        Ok(LaunchReply::Failed { error }) => LaunchError::Idmap(error),
                        Ok(other) => LaunchError::Unexpected(other),
                        Err(e) => e,
                    };
                    return Err(StartError::setup(failure).into());
                }
            }
        }
        Ok(views)
    }
}

/// Hard-link (copy across filesystems) the checkpoint's images into `dst` and move their user
/// namespace to the slot's range.
fn link_images(src: &Path, dst: &Path, from: u32, to: u32) -> Result<(), DriverError> {
    let io_err = |what: String| move |e: io::Error| DriverError::io(what, e);
    fs::create_dir(dst).map_err(io_err(format!("create {}", dst.display())))?;
    let entries = fs::read_dir(src).map_err(io_err(format!(
        "read the checkpoint images in {}",
        src.display()
    )))?;
    for e in entries {
        let e = e.map_err(io_err("read the checkpoint images".into()))?;
        let name = e.file_name();
        if name.to_string_lossy().ends_with(".log") {
            continue;
        }
        let (a, b): (PathBuf, PathBuf) = (e.path(), dst.join(&name));
        if let Err(err) = fs::hard_link(&a, &b) {
            if err.raw_os_error() != Some(libc::EXDEV) {
                return Err(DriverError::io(format!("link {}", a.display()), err));
            }
            fs::copy(&a, &b).map_err(io_err(format!("copy {}", a.display())))?;
        }
    }
    if from != to {
        image::shift_userns(dst, from, to, IDS_PER_SLOT).map_err(|e| {
            DriverError::io(
                "move the checkpoint to this slot's uid range",
                io::Error::other(e),
            )
        })?;
    }
    Ok(())
}

/// The sandbox's overlay on the host, as the jail's init mounts it inside (`userxattr`: the
/// upper dir's whiteouts and opaque markers are `user.overlay.*`, written from the sandbox's
/// user namespace).
fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.display(),
        upper.display(),
        work.display()
    );
    let (src, tgt, fst, data) = (
        sys::cpath(Path::new("overlay"))?,
        sys::cpath(target)?,
        sys::cpath(Path::new("overlay"))?,
        std::ffi::CString::new(opts)?,
    );
    // SAFETY: valid C strings for the duration of the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            fst.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
