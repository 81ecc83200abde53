//! Where warm-pool members come from. Light templates (`base`) are started cold. Heavy ones (a
//! code interpreter: a kernel start costs a CPU-second) are restored from a checkpoint of a
//! warmed "gold" sandbox whose kernels already run, taken once and kept under the data dir:
//!
//! ```text
//! <checkpoint_dir>/pools/<template id>/<key>   the gold checkpoint (CRIU image + upper dir)
//! ```
//!
//! `<key>` hashes what makes the image valid: the template's content hash and rootfs, and the
//! driver's [`checkpoint_key`](crate::node::driver::Driver::checkpoint_key) (agent build, CRIU version,
//! image format). A server restart reuses it; a rebuilt template or a new agent makes a new one
//! and the old ones are deleted. Each member is restored from it without consuming it, then told
//! it is a clone (`/bulkhead/cloned`: its kernels re-seed their generators and take a new session
//! id) before it enters the pool; a claim then gives it its identity through `/init` as usual.
//! Without checkpoint support, or when the gold sandbox cannot be made or restored, the
//! template falls back to cold starts with one warning and tries again later.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bulkhead_envd::protocol::{CLONED_PATH, WARM_PATH};
use sha2::{Digest, Sha256};

use crate::config::CheckpointPools;
use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::agent_client::{self, AgentClientError};
use crate::node::checkpoints::{self, CheckpointError};
use crate::node::driver::{CheckpointOptions, DriverError, DriverHandle, RestoreOptions};
use crate::pool::gold::Gold;
use crate::sandbox::lifecycle::Operation;
use crate::types::TemplateInfo;

/// The file in a template's rootfs that makes it heavy under [`CheckpointPools::Auto`]: its
/// sandboxes start Jupyter kernels.
pub const KERNELS_MANIFEST: &str = "opt/bulkhead/interpreter/kernels.json";
/// How long the gold sandbox's kernels may take to start and warm up.
const WARM_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a clone's kernels may take to re-seed.
const CLONED_TIMEOUT: Duration = Duration::from_secs(60);
/// After a failure, cold starts for this long before the gold checkpoint is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(600);
/// Written into a gold checkpoint's directory: what it was made from (for operators).
const SOURCE_FILE: &str = "pool-source.json";

/// Why a template's warm checkpoint could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum PoolSourceError {
    #[error("the sandbox driver cannot checkpoint sandboxes (is CRIU configured? see --criu)")]
    NotCapable,
    #[error(
        "the sandbox driver cannot say which checkpoints stay valid (CRIU did not answer `criu --version`)"
    )]
    NoKey,
    #[error("starting the warm sandbox failed")]
    Start(#[source] DriverError),
    #[error("the warm sandbox's agent has no {0} route (the template's agent predates warm pools)")]
    AgentTooOld(&'static str),
    #[error("the agent did not answer {route} within {secs} s")]
    Timeout { route: &'static str, secs: u64 },
    #[error("cannot reach the agent")]
    Connect(#[source] DriverError),
    #[error("the agent failed {route}")]
    Agent {
        route: &'static str,
        #[source]
        source: AgentClientError,
    },
    #[error("the warm sandbox's checkpoint directory")]
    Dir(#[source] CheckpointError),
    #[error("checkpointing the warm sandbox failed")]
    Checkpoint(#[source] DriverError),
    #[error("restoring a pool member from the warm checkpoint failed")]
    Restore(#[source] DriverError),
}

/// Where a pool member came from (logged, and counted for the bench and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSource {
    Cold,
    Checkpoint,
}

impl Engine {
    /// A new, anonymous warm-pool member of `t`: restored from the template's warm checkpoint
    /// when the template is heavy and the checkpoint can be had, else started cold.
    pub async fn new_pool_member(&self, t: &TemplateInfo) -> Result<DriverHandle, EngineError> {
        Ok(self.new_pool_member_from(t).await?.0)
    }

    /// [`Self::new_pool_member`], saying where the member came from.
    pub async fn new_pool_member_from(
        &self,
        t: &TemplateInfo,
    ) -> Result<(DriverHandle, PoolSource), EngineError> {
        self.pool_member(t, false).await
    }

    /// A member for a pool that still holds others: nobody waits for it, so a cold start runs
    /// at background CPU priority until claimed (`Driver::start_warm`), never competing with the
    /// sandboxes in use (a just-claimed sandbox's first command above all).
    pub(crate) async fn new_background_pool_member(
        &self,
        t: &TemplateInfo,
    ) -> Result<DriverHandle, EngineError> {
        Ok(self.pool_member(t, true).await?.0)
    }

    async fn pool_member(
        &self,
        t: &TemplateInfo,
        background: bool,
    ) -> Result<(DriverHandle, PoolSource), EngineError> {
        if self.is_heavy(t) {
            match self.restore_member(t).await {
                Ok(Some(h)) => return Ok((h, PoolSource::Checkpoint)),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    template = %t.id,
                    error = &e as &dyn std::error::Error,
                    "warm pool: cannot restore from the template's warm checkpoint; starting \
                     sandboxes cold for {} min",
                    RETRY_AFTER.as_secs() / 60
                ),
            }
        }
        let spec = t.spec();
        let started = if background {
            self.node.start(&spec, true).await
        } else {
            self.node.start(&spec, false).await
        };
        let h = started.map_err(EngineError::driver(Operation::Create))?;
        Ok((h, PoolSource::Cold))
    }

    /// Is `t` pooled from a warm checkpoint (by the operator's `--pool-checkpoint`)?
    pub fn is_heavy(&self, t: &TemplateInfo) -> bool {
        match &self.cfg.checkpoint_pools {
            CheckpointPools::Off => false,
            CheckpointPools::Auto => t.rootfs.join(KERNELS_MANIFEST).is_file(),
            CheckpointPools::Only(ids) => {
                ids.iter().any(|id| *id == t.id || t.aliases.contains(id))
            }
        }
    }

    /// A member restored from `t`'s warm checkpoint (made first if needed); `None` while the
    /// template is on cold starts after a failure.
    async fn restore_member(
        &self,
        t: &TemplateInfo,
    ) -> Result<Option<DriverHandle>, PoolSourceError> {
        let slot = self.pools.sources.slot(&t.id);
        let mut gold = slot.lock().await;
        let dir = match self.gold_dir(t, &mut gold).await {
            Some(dir) => dir,
            None => return Ok(None),
        };
        let key = match &*gold {
            Gold::Ready { key, .. } => key.clone(),
            _ => return Ok(None),
        };
        // Restores run concurrently: only making the checkpoint is serialised.
        drop(gold);
        match self.restore_clone(t, &dir).await {
            Ok(h) => Ok(Some(h)),
            Err(e) => {
                // A checkpoint that cannot be restored is made anew after the pause.
                let mut gold = slot.lock().await;
                if matches!(&*gold, Gold::Ready { dir: d, .. } if *d == dir) {
                    checkpoints::remove(&dir);
                    *gold = Gold::Failed {
                        key,
                        retry_at: Instant::now() + RETRY_AFTER,
                    };
                }
                Err(e)
            }
        }
    }

    /// The directory of `t`'s valid warm checkpoint, finding or making it; `None` when there is
    /// none to be had now (the failure was logged once).
    async fn gold_dir(&self, t: &TemplateInfo, gold: &mut Gold) -> Option<PathBuf> {
        let key = match self.gold_key(t) {
            Ok(key) => key,
            Err(e) => {
                if !matches!(gold, Gold::Failed { key, .. } if key.is_empty()) {
                    tracing::warn!(
                        template = %t.id,
                        error = &e as &dyn std::error::Error,
                        "warm pool: no warm checkpoint for this heavy template; its sandboxes \
                         start cold (each pays its kernels' start)"
                    );
                    *gold = Gold::Failed {
                        key: String::new(),
                        retry_at: Instant::now() + RETRY_AFTER,
                    };
                }
                return None;
            }
        };
        match gold {
            Gold::Ready { key: k, dir } if *k == key && dir.exists() => return Some(dir.clone()),
            Gold::Failed { key: k, retry_at } if *k == key && Instant::now() < *retry_at => {
                return None;
            }
            _ => {}
        }
        let root = self.cfg.checkpoint_dir.join("pools").join(&t.id);
        let dir = root.join(&key);
        if checkpoints::completed(&dir).is_none() {
            let started = Instant::now();
            if let Err(e) = self.make_gold(t, &dir).await {
                tracing::warn!(
                    template = %t.id,
                    error = &e as &dyn std::error::Error,
                    "warm pool: could not make the warm checkpoint of this heavy template; its \
                     sandboxes start cold (each pays its kernels' start) and it is tried again \
                     in {} min",
                    RETRY_AFTER.as_secs() / 60
                );
                *gold = Gold::Failed {
                    key,
                    retry_at: Instant::now() + RETRY_AFTER,
                };
                return None;
            }
            tracing::info!(template = %t.id, dir = %dir.display(), elapsed_ms = started.elapsed().as_millis() as u64,
                "warm pool: warm checkpoint made; pool members are restored from it");
        }
        remove_others(&root, &key);
        *gold = Gold::Ready {
            key,
            dir: dir.clone(),
        };
        Some(dir)
    }

    /// The name of `t`'s warm checkpoint directory: a hash of everything the image depends on.
    fn gold_key(&self, t: &TemplateInfo) -> Result<String, PoolSourceError> {
        if !self.node.capabilities().checkpoint {
            return Err(PoolSourceError::NotCapable);
        }
        let driver_key = self.node.checkpoint_key().ok_or(PoolSourceError::NoKey)?;
        let mut h = Sha256::new();
        for part in [
            t.id.as_str(),
            t.content_hash.as_str(),
            &t.rootfs.display().to_string(),
            &driver_key,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        Ok(hex::encode(&h.finalize()[..12]))
    }

    /// Start `t` cold, wait for its kernels, checkpoint it into `dir` (it ends) and mark it
    /// complete. Nothing is left behind on failure.
    async fn make_gold(&self, t: &TemplateInfo, dir: &Path) -> Result<(), PoolSourceError> {
        checkpoints::prepare(dir).map_err(PoolSourceError::Dir)?;
        let h = self
            .node
            .start(&t.spec(), false)
            .await
            .map_err(PoolSourceError::Start)?;
        let made = async {
            self.agent_post(&h, WARM_PATH, WARM_TIMEOUT).await?;
            let opts = CheckpointOptions {
                leave_running: false,
                filesystem_only: false,
            };
            let info = self
                .node
                .checkpoint(&h, dir, opts)
                .await
                .map_err(PoolSourceError::Checkpoint)?;
            let source = serde_json::json!({
                "template": t.id,
                "content_hash": t.content_hash,
                "rootfs": t.rootfs,
                "driver_key": self.node.checkpoint_key(),
            });
            std::fs::write(
                dir.join(SOURCE_FILE),
                serde_json::to_vec_pretty(&source).expect("json serializes"),
            )
            .map_err(|source| {
                PoolSourceError::Dir(CheckpointError::Mark {
                    path: dir.to_path_buf(),
                    source,
                })
            })?;
            checkpoints::mark_complete(&info).map_err(PoolSourceError::Dir)
        }
        .await;
        let _ = self.node.stop(&h).await;
        if made.is_err() {
            checkpoints::remove(dir);
        }
        made
    }

    /// Restore a clone of the warm checkpoint in `dir` and have its kernels re-seeded.
    async fn restore_clone(
        &self,
        t: &TemplateInfo,
        dir: &Path,
    ) -> Result<DriverHandle, PoolSourceError> {
        let opts = RestoreOptions {
            consume: false,
            filesystem_only: false,
            access_token: None,
        };
        let h = self
            .node
            .restore(&t.spec(), dir, opts)
            .await
            .map_err(PoolSourceError::Restore)?;
        if let Err(e) = self.agent_post(&h, CLONED_PATH, CLONED_TIMEOUT).await {
            let _ = self.node.stop(&h).await;
            return Err(e);
        }
        tracing::info!(template = %t.id, pid = h.pid, "warm pool: member restored from the warm checkpoint");
        Ok(h)
    }

    /// One host-only `POST` to the agent of `h`, bounded by `timeout`.
    async fn agent_post(
        &self,
        h: &DriverHandle,
        route: &'static str,
        timeout: Duration,
    ) -> Result<(), PoolSourceError> {
        let call = async {
            let stream = self
                .agents
                .open(h)
                .await
                .map_err(PoolSourceError::Connect)?;
            match agent_client::request::<()>(stream, http::Method::POST, route, None, None).await {
                Ok(_) => Ok(()),
                Err(AgentClientError::Status { status: 404, .. }) => {
                    Err(PoolSourceError::AgentTooOld(route))
                }
                Err(source) => Err(PoolSourceError::Agent { route, source }),
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(PoolSourceError::Timeout {
                route,
                secs: timeout.as_secs(),
            }))
    }
}

/// Delete every warm checkpoint of a template but the current one (a rebuilt template or a
/// new agent left them behind).
fn remove_others(root: &Path, key: &str) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name() != key {
            tracing::info!(dir = %e.path().display(), "warm pool: deleting an outdated warm checkpoint");
            checkpoints::remove(&e.path());
        }
    }
}
