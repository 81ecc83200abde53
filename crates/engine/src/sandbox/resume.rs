//! Resume: paused → resuming → running. The driver restores the checkpoint as a new process
//! tree; the sandbox keeps its id and envd access token, gets its network link back with the
//! same policy, and its TTL restarts from the resume. Concurrent resumes of one sandbox
//! coalesce into one restore. Also the resume-or-extend of `connect`.

use std::sync::Arc;
use std::time::Duration;

use crate::sandbox::lifecycle::SandboxState;
use bulkhead_envd::rest::InitRequest;

use crate::clock::now_ms;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::ids;
use crate::node::checkpoints::CheckpointError;
use crate::node::driver::{DriverHandle, RestoreOptions};
use crate::sandbox::lifecycle::{Operation, Refusal};
use crate::sandbox::live::Paused;
use crate::types::{Caller, ResumeRequest, SandboxInfo};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How long a request waits for another request's resume of the same sandbox.
const COALESCE_WAIT: Duration = Duration::from_secs(300);
/// How long a connect or resume waits for a pause or snapshot in flight to finish.
const PAUSE_WAIT: Duration = Duration::from_secs(120);

impl Engine {
    /// The older `POST /sandboxes/{id}/resume`: a running sandbox is a 409 (as E2B).
    pub async fn resume(
        self: &Arc<Self>,
        caller: &Caller,
        id: &str,
        req: ResumeRequest,
    ) -> Result<SandboxInfo> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        crate::tenancy::admit::admit_resume(self, caller, id, &req).await?;
        Ok(self.resume_or_extend(id, Operation::Resume, req).await?.0)
    }

    /// Resume a paused sandbox (`op` = Resume or Connect), or with Connect extend a running
    /// one's TTL. Returns the info and whether it was resumed by this call.
    pub(crate) async fn resume_or_extend(
        self: &Arc<Self>,
        id: &str,
        op: Operation,
        req: ResumeRequest,
    ) -> Result<(SandboxInfo, bool)> {
        let mut op = op;
        for _ in 0..3 {
            match self.enter(id, op) {
                Ok((nid, step)) if step.during == SandboxState::Resuming => {
                    self.resume_entered(nid, req).await?;
                    let row = self.running_row(nid, Operation::Get).await?;
                    return Ok((self.info_from_row(&row), true));
                }
                Ok((nid, _)) => return Ok((self.extend(nid, req.timeout).await?, false)),
                Err(EngineError::Refused {
                    reason: Refusal::Busy(SandboxState::Resuming),
                    ..
                }) => {
                    // Another request is resuming it: wait for that restore instead of
                    // starting a second one; then this request only extends.
                    let nid = ids::normalize_sandbox_id(id);
                    self.live
                        .wait_while(nid, SandboxState::Resuming, COALESCE_WAIT)
                        .await;
                    op = Operation::Connect;
                }
                Err(EngineError::Refused {
                    reason:
                        Refusal::Busy(busy @ (SandboxState::Pausing | SandboxState::Snapshotting)),
                    ..
                }) => {
                    // E2B: a connect (or resume) right after a pause waits for the pause and
                    // then resumes, rather than answering that the sandbox is busy.
                    let nid = ids::normalize_sandbox_id(id);
                    self.live.wait_while(nid, busy, PAUSE_WAIT).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(EngineError::refused(
            ids::normalize_sandbox_id(id),
            op,
            Refusal::Busy(SandboxState::Resuming),
        ))
    }

    /// The resume of a sandbox already moved to `resuming`.
    pub(crate) async fn resume_entered(
        self: &Arc<Self>,
        id: &str,
        req: ResumeRequest,
    ) -> Result<()> {
        // Paused until now: its checkpoint is metered up to here, the running sandbox after.
        crate::sandbox::metered::meter_one(self, id).await;
        let result = self.restore_paused(id, req).await;
        if result.is_err()
            && self.live.lock().get(id).map(|l| l.state) == Some(SandboxState::Resuming)
        {
            let _ = self
                .store
                .set_sandbox_state(id, SandboxState::Paused.into(), None)
                .await;
            self.live.settle(id, SandboxState::Paused);
        }
        result
    }

    async fn restore_paused(self: &Arc<Self>, id: &str, req: ResumeRequest) -> Result<()> {
        let (paused, extra, token) = {
            let live = self.live.lock();
            let l = live
                .get(id)
                .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
            (
                l.extra.paused.clone(),
                l.extra.clone(),
                l.access_token.clone(),
            )
        };
        let paused: Paused = paused.ok_or_else(|| EngineError::Checkpoint {
            op: Operation::Resume,
            source: CheckpointError::Incomplete(Default::default()),
        })?;
        let row = self
            .store
            .get_sandbox(id)
            .await?
            .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))?;
        let template = crate::template::registry::template(self, &row.template_id)
            .ok_or_else(|| EngineError::TemplateNotFound(row.template_id.clone()))?;
        let secs = req.timeout.unwrap_or_else(|| {
            if extra.timeout_ms > 0 {
                (extra.timeout_ms / 1000) as u64
            } else {
                self.cfg.default_timeout.as_secs()
            }
        });
        let timeout = self.check_timeout(secs)?;
        let running = self
            .live
            .lock()
            .iter()
            .filter(|(other, l)| other.as_str() != id && l.state != SandboxState::Paused)
            .count();
        if running >= self.cfg.max_sandboxes {
            return Err(EngineError::Capacity);
        }
        if self.node.checkpoint_info(&paused.dir).await.is_none() {
            return Err(EngineError::Checkpoint {
                op: Operation::Resume,
                source: CheckpointError::Incomplete(paused.dir.clone()),
            });
        }
        let fresh_boot = !paused.memory || !req.memory;
        self.store
            .set_sandbox_state(id, SandboxState::Resuming.into(), None)
            .await?;
        let opts = RestoreOptions {
            consume: true,
            filesystem_only: fresh_boot,
            access_token: token.clone(),
        };
        // The same volumes at the same paths (a fresh boot mounts them like a start does).
        let mut spec = template.spec();
        spec.volumes = self.sandbox_volume_mounts(id).await?;
        let handle = self
            .node
            .restore(&spec, &paused.dir, opts)
            .await
            .map_err(|source| EngineError::RestoreFailed {
                id: id.to_string(),
                source,
            })?;
        let undo = |e: EngineError| {
            let node = self.node.clone();
            let handle = handle.clone();
            async move {
                let _ = node.stop(&handle).await;
                e
            }
        };

        // A memory restore's agent still has its env, user and token: it is only asked who it
        // is. A fresh boot is given its identity again, as at create.
        let (init, auth) = if fresh_boot {
            let mut env = self.cfg.sandbox_env.clone();
            env.extend(row.env_vars.clone());
            let init = InitRequest {
                env_vars: Some(env),
                access_token: token.clone(),
                default_user: Some("user".into()),
                ..Default::default()
            };
            (init, None)
        } else {
            (InitRequest::default(), token.as_deref())
        };
        let agent =
            match crate::sandbox::create::init_agent(self, &handle, &init, auth, Operation::Resume)
                .await
            {
                Ok(a) => a,
                Err(e) => return Err(undo(e).await),
            };

        let end_at = now_ms() + timeout.as_millis() as i64;
        if let Err(e) = self.record_resumed(id, &handle, end_at).await {
            return Err(undo(e).await);
        }
        let still_ours = {
            let mut live = self.live.lock();
            match live.get_mut(id) {
                Some(l) if l.state == SandboxState::Resuming => {
                    l.handle = Some(handle.clone());
                    l.extra.paused = None;
                    l.end_at_ms = end_at;
                    l.agent = agent;
                    l.last_cpu = (0, now_ms());
                    true
                }
                _ => false,
            }
        };
        if !still_ours {
            // Killed while resuming: the kill saw no process to stop.
            let _ = self.node.stop(&handle).await;
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        self.rewatch(id, handle.clone());
        let attached = crate::sandbox::network::reattach_after_restart(self, &row, &handle).await;
        if let Some(l) = self.live.lock().get_mut(id) {
            l.net_attached = attached;
        }
        // Unlinking tens of MB of images takes tens of milliseconds: not on the resume's path.
        // If the server stops first, the directory stays until the sandbox is killed.
        let (node, dir) = (self.node.clone(), paused.dir.clone());
        tokio::spawn(async move { node.remove_checkpoint(&dir).await });
        self.live.settle(id, SandboxState::Running);
        tracing::info!(sandbox = %id, fresh_boot, "sandbox resumed");
        Ok(())
    }

    /// The store's side of a completed restore: the new process, the new TTL, no checkpoint.
    async fn record_resumed(&self, id: &str, handle: &DriverHandle, end_at: i64) -> Result<()> {
        let json = serde_json::to_string(handle).expect("handle serializes");
        self.store
            .set_sandbox_driver_handle(id, Some(&json), handle.node.as_deref())
            .await?;
        self.store.set_sandbox_end_at(id, end_at).await?;
        self.store
            .set_sandbox_state(id, SandboxState::Running.into(), None)
            .await?;
        if let Some(mut p) = self.store.get_persistence(id).await? {
            p.checkpoint_dir = None;
            p.resume_on_traffic = false;
            p.paused_at = None;
            self.store.upsert_persistence(&p).await?;
        }
        Ok(())
    }
}
