//! Running a template build: every step that changes the tree runs in its own build sandbox on
//! the driver (the same isolation as user code; network only to the package registries through
//! the egress proxy), on the tree of the step before. Its exported changes are stacked into a
//! new layer keyed by `crate::template::spec::step_key`, so a rebuild takes every unchanged step from
//! the cache. The template is registered only once every step and the ready check passed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bulkhead_envd::rest::InitRequest;
use bulkhead_images::LayerStore;

use crate::engine::Engine;
use crate::node::disk_usage::{Measure, tree_bytes};
use crate::node::driver::{DriverHandle, SandboxSpec};
use crate::sandbox::lifecycle::Operation;
use crate::template::exec::Command;
use crate::template::spec::{BuildStep, RunState, StepKind};
use crate::template::types::StepError;
use crate::template::types::{BuildFailure, BuildRecord, BuildStart, BuiltTemplate};
use crate::types::TemplateRuntime;

/// A failed build: the message and the step it names (`base`, `1`…, `finalize`).
struct Failed(String, String);

impl Engine {
    pub(crate) async fn run_template_build(
        self: Arc<Self>,
        record: Arc<BuildRecord>,
        spec: BuildStart,
    ) {
        let t0 = Instant::now();
        let limit = self.cfg.build_limits.build_timeout;
        let result = match tokio::time::timeout(limit, self.build_steps(&record, &spec)).await {
            Ok(r) => r,
            Err(_) => Err(Failed(
                format!(
                    "the build did not finish within {limit:?} (the server's build time limit)"
                ),
                "finalize".into(),
            )),
        };
        match result {
            Ok(built) => match self.record_custom_build(&record, built).await {
                Ok(()) => {
                    record.log(
                        "info",
                        None,
                        format!("Build finished in {:.1}s", t0.elapsed().as_secs_f64()),
                    );
                    record.finish(None);
                }
                Err(e) => {
                    let msg = format!("registering the template failed: {e}");
                    record.log("error", Some("finalize"), msg.clone());
                    record.finish(Some(BuildFailure {
                        message: msg,
                        step: Some("finalize".into()),
                    }));
                }
            },
            Err(Failed(message, step)) => {
                record.log("error", Some(&step), message.clone());
                record.finish(Some(BuildFailure {
                    message,
                    step: Some(step),
                }));
            }
        }
    }

    async fn build_steps(
        &self,
        record: &BuildRecord,
        spec: &BuildStart,
    ) -> Result<BuiltTemplate, Failed> {
        let parent = self
            .build_parent(record, spec)
            .await
            .map_err(|e| Failed(e.to_string(), "base".into()))?;
        let layers = LayerStore::new(&self.cfg.image_cache);
        let mut state = parent.state.clone();
        let mut key = crate::template::spec::base_key(&parent.content_hash);
        let mut tree = parent.rootfs.clone();
        record.log(
            "info",
            Some("base"),
            format!("[base] FROM {}", parent.label),
        );
        if let Some(step) = &parent.provision {
            // Part of the base: keyed from the image, so every build of it shares the layer.
            key = crate::template::spec::step_key(&key, step, None);
            tree = match layers.get(&key) {
                Some(cached) => {
                    record.log("info", Some("base"), "CACHED [base] adding the user `user`");
                    cached
                }
                None => {
                    record.log("info", Some("base"), "[base] adding the user `user`");
                    let changes = self
                        .run_step(record, "base", step, &state, &tree)
                        .await
                        .map_err(|e| Failed(e.message_for_image(), "base".into()))?;
                    let committed = layers
                        .commit(&key, &tree, &changes, "provision: user `user`")
                        .await;
                    let _ = tokio::fs::remove_dir_all(&changes).await;
                    committed.map_err(|e| {
                        Failed(format!("saving the base layer failed: {e}"), "base".into())
                    })?
                }
            };
        }
        let total = spec.steps.len();
        let mut forced = spec.force;
        for (i, step) in spec.steps.iter().enumerate() {
            let n = (i + 1).to_string();
            forced |= step.force;
            key = crate::template::spec::step_key(
                &key,
                step,
                forced.then_some(record.build_id.as_str()),
            );
            let what = step.describe();
            if !step.changes_tree() {
                if step.kind == StepKind::User {
                    check_user(&tree, &step.args[0])
                        .map_err(|e| Failed(e.to_string(), n.clone()))?;
                }
                state.apply(step);
                record.log("info", Some(&n), format!("[{n}/{total}] {what}"));
                continue;
            }
            if !forced && let Some(cached) = layers.get(&key) {
                record.log("info", Some(&n), format!("CACHED [{n}/{total}] {what}"));
                tree = cached;
                state.apply(step);
                continue;
            }
            record.log("info", Some(&n), format!("[{n}/{total}] {what}"));
            let started = Instant::now();
            let changes = self
                .run_step(record, &n, step, &state, &tree)
                .await
                .map_err(|e| {
                    let m = if parent.pulled {
                        e.message_for_image()
                    } else {
                        e.to_string()
                    };
                    Failed(m, n.clone())
                })?;
            let committed = layers.commit(&key, &tree, &changes, &what).await;
            let _ = tokio::fs::remove_dir_all(&changes).await;
            tree = committed.map_err(|e| {
                Failed(
                    format!("saving the layer of step {n} failed: {e}"),
                    n.clone(),
                )
            })?;
            state.apply(step);
            record.log(
                "info",
                Some(&n),
                format!(
                    "[{n}/{total}] done in {:.1}s",
                    started.elapsed().as_secs_f64()
                ),
            );
        }
        let workdir = match &state.workdir {
            Some(w) => {
                Some(expand_home(&tree, w).map_err(|e| Failed(e.to_string(), "finalize".into()))?)
            }
            None => None,
        };
        let runtime = TemplateRuntime {
            user: state.user.clone(),
            workdir,
            envs: state.envs.clone(),
            start_cmd: spec.start_cmd.clone().filter(|c| !c.trim().is_empty()),
            ready_cmd: spec.ready_cmd.clone().filter(|c| !c.trim().is_empty()),
        };
        if runtime.start_cmd.is_some() || runtime.ready_cmd.is_some() {
            self.check_start(record, &tree, &runtime).await?;
        }
        Ok(BuiltTemplate {
            rootfs: tree,
            content_hash: key,
            runtime,
            created_at_ms: crate::clock::now_ms(),
        })
    }

    /// A build sandbox on `tree`; stopped (and its link removed) by the caller's guard.
    async fn build_sandbox(
        &self,
        record: &BuildRecord,
        tree: &Path,
        network: bool,
        label: &str,
    ) -> Result<(DriverHandle, String), StepError> {
        let spec = SandboxSpec {
            template_id: format!("build-{}", record.template_id),
            rootfs: tree.to_owned(),
            cpu_count: record.cpu_count,
            memory_mb: record.memory_mb,
            pids_max: 4096,
            // A step's changes are bounded by the disk too (ENOSPC inside the step).
            disk_mb: self.cfg.build_limits.max_step_bytes.div_ceil(1 << 20),
            volumes: Vec::new(),
        };
        let handle = self
            .node
            .start(&spec, false)
            .await
            .map_err(StepError::SandboxStart)?;
        let id = format!("build-{}-{label}", &record.build_id[..8]);
        let init = InitRequest {
            default_user: Some("root".into()),
            ..Default::default()
        };
        let ready = async {
            crate::sandbox::create::init_agent(self, &handle, &init, None, Operation::Create)
                .await
                .map_err(|e| StepError::AgentStart(Box::new(e)))?;
            if network && self.node.has_egress() {
                let policy = bulkhead_egress::NetworkPolicy {
                    allow_out: self.cfg.build_limits.allow_out.clone(),
                    deny_out: vec!["0.0.0.0/0".into()],
                    ..Default::default()
                };
                crate::sandbox::network::attach_link(self, &id, &handle, policy, Operation::Create)
                    .await
                    .map_err(|e| StepError::Network(Box::new(e)))?;
            }
            Ok::<(), StepError>(())
        }
        .await;
        if let Err(e) = ready {
            crate::sandbox::network::detach_link(self, &id).await;
            let _ = self.node.stop(&handle).await;
            return Err(e);
        }
        Ok((handle, id))
    }

    /// Runs one tree-changing step; returns the directory holding its exported changes.
    async fn run_step(
        &self,
        record: &BuildRecord,
        n: &str,
        step: &BuildStep,
        state: &RunState,
        tree: &Path,
    ) -> Result<PathBuf, StepError> {
        let (handle, id) = self
            .build_sandbox(record, tree, step.kind == StepKind::Run, n)
            .await?;
        let outcome = self.step_in(record, n, &handle, step, state, tree).await;
        crate::sandbox::network::detach_link(self, &id).await;
        if let Err(e) = outcome {
            let _ = self.node.stop(&handle).await;
            return Err(e);
        }
        let work = self
            .cfg
            .template_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
            .join("work");
        tokio::fs::create_dir_all(&work)
            .await
            .map_err(|e| {
                tracing::error!(path = %work.display(), error = %e, "template build: cannot create the work directory");
                StepError::WorkDir(e)
            })?;
        let dest = work.join(format!("{}-{n}", record.build_id));
        let _ = tokio::fs::remove_dir_all(&dest).await;
        let exported = self.node.export_changes(&handle, &dest).await;
        let _ = self.node.stop(&handle).await;
        exported.map_err(StepError::Export)?;
        let size = dir_size(&dest).await;
        if size > self.cfg.build_limits.max_step_bytes {
            let _ = tokio::fs::remove_dir_all(&dest).await;
            return Err(StepError::TooBig {
                step: n.to_owned(),
                size,
                limit: self.cfg.build_limits.max_step_bytes,
            });
        }
        Ok(dest)
    }

    async fn step_in(
        &self,
        record: &BuildRecord,
        n: &str,
        handle: &DriverHandle,
        step: &BuildStep,
        state: &RunState,
        tree: &Path,
    ) -> Result<(), StepError> {
        if step.kind == StepKind::Copy {
            let hash = step.files_hash.as_deref().unwrap_or_default();
            let path = self
                .upload_path(&record.team_id, hash)
                .map_err(|e| StepError::Upload(Box::new(e)))?;
            let data = tokio::fs::read(&path)
                .await
                .map_err(|_| StepError::NotUploaded {
                    step: n.to_owned(),
                    file: step.args[0].clone(),
                })?;
            let stream = self.agents.open(handle).await.map_err(StepError::Reach)?;
            crate::template::exec::put_file(
                stream,
                &crate::template::spec::archive_path(hash),
                "root",
                data.into(),
            )
            .await
            .map_err(StepError::CopyFiles)?;
        }
        let (script, user) = crate::template::spec::step_script(step, state);
        let cwd = match (&state.workdir, step.kind) {
            (Some(w), StepKind::Run) => Some(expand_home(tree, w)?),
            _ => None,
        };
        let stream = self.agents.open(handle).await.map_err(StepError::Reach)?;
        let mut output: Vec<String> = Vec::new();
        let mut on_line = |line: String| {
            record.log("info", Some(n), line.clone());
            output.push(line);
            if output.len() > 20 {
                output.remove(0);
            }
        };
        let cmd = Command {
            script: &script,
            user: &user,
            cwd: cwd.as_deref(),
            envs: &state.envs,
            timeout: self.cfg.build_limits.step_timeout,
            access_token: None,
        };
        let code = crate::template::exec::run(stream, &cmd, &mut on_line)
            .await
            .map_err(|source| StepError::Exec {
                step: n.to_owned(),
                what: step.describe(),
                source,
            })?;
        if code != 0 {
            let tail = output.join("\n");
            return Err(StepError::Exit {
                step: n.to_owned(),
                what: step.describe(),
                code,
                output: if tail.is_empty() {
                    String::new()
                } else {
                    format!(":\n{tail}")
                },
            });
        }
        Ok(())
    }

    /// Starts a sandbox of the finished tree, runs the start command and waits for the ready
    /// check, as every sandbox of the template will.
    async fn check_start(
        &self,
        record: &BuildRecord,
        tree: &Path,
        rt: &TemplateRuntime,
    ) -> Result<(), Failed> {
        let fin = |e: StepError| Failed(e.to_string(), "finalize".into());
        record.log(
            "info",
            Some("finalize"),
            format!(
                "[finalize] start command {:?}, ready check {:?}",
                rt.start_cmd.as_deref().unwrap_or(""),
                rt.ready_cmd.as_deref().unwrap_or("")
            ),
        );
        let (handle, id) = self
            .build_sandbox(record, tree, false, "finalize")
            .await
            .map_err(fin)?;
        let r = crate::template::start::start_and_wait_ready(self, &handle, rt, None).await;
        crate::sandbox::network::detach_link(self, &id).await;
        let _ = self.node.stop(&handle).await;
        r.map_err(fin)?;
        record.log("info", Some("finalize"), "[finalize] ready check passed");
        Ok(())
    }
}

/// The tree's `/etc/passwd` (a regular file: never a symlink out of the tree).
fn passwd(tree: &Path) -> Result<String, StepError> {
    let p = tree.join("etc/passwd");
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.is_file() => std::fs::read_to_string(&p).map_err(StepError::ReadPasswd),
        _ => Err(StepError::NoPasswd),
    }
}

fn home_of(tree: &Path, user: &str) -> Result<Option<String>, StepError> {
    Ok(passwd(tree)?.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && f[0] == user).then(|| f[5].to_owned())
    }))
}

/// E2B's error for a USER step naming a user the template does not have.
fn check_user(tree: &Path, user: &str) -> Result<(), StepError> {
    let user = user.split(':').next().unwrap_or(user);
    if user.parse::<u32>().is_ok() || home_of(tree, user)?.is_some() {
        return Ok(());
    }
    Err(StepError::NoSuchUser(user.to_owned()))
}

/// `~user/rest` → the user's home + rest.
fn expand_home(tree: &Path, path: &str) -> Result<String, StepError> {
    let Some(rest) = path.strip_prefix('~') else {
        return Ok(path.to_owned());
    };
    let (user, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let home = home_of(tree, user)?.ok_or_else(|| StepError::NoHome(user.to_owned()))?;
    Ok(format!("{}/{tail}", home.trim_end_matches('/')))
}

async fn dir_size(p: &Path) -> u64 {
    let p = p.to_owned();
    tokio::task::spawn_blocking(move || tree_bytes(&p, Measure::Apparent))
        .await
        .unwrap_or(0)
}
