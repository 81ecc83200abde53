//! The live set: every sandbox this server drives right now (running or paused), with its
//! lifecycle state and what the verbs need at hand (driver handle, TTL, access token, CPU
//! sample, network link, lifecycle settings, checkpoint). A leaf: the verb modules share it
//! through [`crate::engine::Engine`], and state changes go through [`lifecycle::transition`]
//! only.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bulkhead_envd::protocol::AgentInfo;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::node::driver::DriverHandle;
use crate::sandbox::lifecycle::{self, Operation, Refusal, SandboxState, Step};
use crate::tenancy::metering::Meter;
use crate::types::{LifecyclePolicy, OnTimeout, Usage};

pub(crate) struct Live {
    /// Where it is in its life; only [`lifecycle::transition`] decides the next one.
    pub(crate) state: SandboxState,
    /// The running sandbox; `None` while it is paused (its processes are gone).
    pub(crate) handle: Option<DriverHandle>,
    pub(crate) end_at_ms: i64,
    pub(crate) access_token: Option<String>,
    /// Cancels the watcher task that notices the sandbox's death.
    pub(crate) cancel: CancellationToken,
    pub(crate) cpu_count: i64,
    /// Last CPU sample (ns of CPU time, wall ms) for the usage percentage.
    pub(crate) last_cpu: (u64, i64),
    /// Its metrics series, oldest first, at most [`crate::sandbox::metrics::MAX_SAMPLES`].
    pub(crate) samples: VecDeque<Usage>,
    /// The egress proxy serves a link for this sandbox.
    pub(crate) net_attached: bool,
    /// What its agent said about itself (at claim, or when adopted after a restart).
    pub(crate) agent: AgentInfo,
    pub(crate) extra: LiveExtra,
    /// Cancelled to cut every proxied stream to the agent (before a checkpoint).
    pub(crate) traffic: CancellationToken,
    /// Its team and metering state (see `meter`).
    pub(crate) meter: Meter,
}

/// The persistence side of a live sandbox.
#[derive(Debug, Clone, Default)]
pub(crate) struct LiveExtra {
    pub(crate) lifecycle: LifecyclePolicy,
    /// The TTL it was created with (auto-resume gives it again).
    pub(crate) timeout_ms: i64,
    /// Its checkpoint while it is paused.
    pub(crate) paused: Option<Paused>,
    /// It has been paused (by this process or, as the store's generation says, an earlier
    /// one): its end removes its checkpoints, which a resume's cleanup may have left.
    pub(crate) paused_once: bool,
}

impl LiveExtra {
    /// The fields as stored (defaults for sandboxes created before persistence existed); not
    /// paused: the caller checks the checkpoint.
    pub(crate) fn from_stored(p: Option<&bulkhead_store::PersistenceRow>) -> Self {
        let Some(p) = p else {
            return LiveExtra::default();
        };
        LiveExtra {
            lifecycle: LifecyclePolicy {
                on_timeout: OnTimeout::parse(&p.on_timeout).unwrap_or_default(),
                auto_resume: p.auto_resume,
                pause_memory: p.pause_memory,
            },
            timeout_ms: p.timeout_ms,
            paused: None,
            paused_once: p.generation > 0,
        }
    }
}

/// A completed pause: where the checkpoint is and what it kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Paused {
    pub(crate) dir: PathBuf,
    pub(crate) memory: bool,
    /// Unix ms; retention counts from here.
    pub(crate) at_ms: i64,
    /// A node drain paused it: its next request resumes it (see `connect`).
    pub(crate) resume_on_traffic: bool,
}

/// Sandbox id → [`Live`]. A sandbox absent from the set is, to the lifecycle, dead.
#[derive(Default)]
pub(crate) struct LiveSet {
    map: Mutex<HashMap<String, Live>>,
    /// Woken whenever an operation settles a sandbox (coalesced resumes wait on it).
    changed: Notify,
}

impl LiveSet {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        self.map.lock().expect("live lock")
    }

    /// May `op` run on `id` now? If it may, the sandbox moves to the step's `during` state.
    pub(crate) fn enter(&self, id: &str, op: Operation) -> Result<Step, Refusal> {
        let mut live = self.lock();
        let entry = live.get_mut(id);
        let state = entry.as_ref().map_or(SandboxState::Dead, |l| l.state);
        let step = lifecycle::transition(state, op)?;
        if let Some(l) = entry {
            l.state = step.during;
        }
        Ok(step)
    }

    /// Put a sandbox in `state` at the end of an operation (unless it left the set or is being
    /// killed meanwhile: kill wins).
    pub(crate) fn settle(&self, id: &str, state: SandboxState) {
        if let Some(l) = self.lock().get_mut(id)
            && l.state != SandboxState::Killing
        {
            l.state = state;
        }
        self.changed.notify_waiters();
    }

    /// Tell waiters that a sandbox changed (left the set, say).
    pub(crate) fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// Wait (at most `limit`) until sandbox `id` is no longer in `state`.
    pub(crate) async fn wait_while(&self, id: &str, state: SandboxState, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().get(id).map(|l| l.state) != Some(state) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return;
            }
        }
    }

    /// Is the sandbox in the set and not on its way out?
    pub(crate) fn is_live(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|l| l.state != SandboxState::Killing)
    }

    pub(crate) fn agent(&self, id: &str) -> Option<AgentInfo> {
        self.lock().get(id).map(|l| l.agent.clone())
    }

    pub(crate) fn handle(&self, id: &str) -> Option<DriverHandle> {
        self.lock().get(id).and_then(|l| l.handle.clone())
    }

    /// The token proxied streams to `id` end with.
    pub(crate) fn traffic(&self, id: &str) -> Option<CancellationToken> {
        self.lock().get(id).map(|l| l.traffic.clone())
    }

    /// End every proxied stream to `id` (a checkpoint needs the host's connections closed);
    /// streams opened afterwards get a new token.
    pub(crate) fn cut_traffic(&self, id: &str) {
        if let Some(l) = self.lock().get_mut(id) {
            std::mem::replace(&mut l.traffic, CancellationToken::new()).cancel();
        }
    }

    pub(crate) fn extra(&self, id: &str) -> Option<LiveExtra> {
        self.lock().get(id).map(|l| l.extra.clone())
    }
}

/// The stored lifecycle settings (and checkpoint, when paused) of a sandbox.
pub(crate) fn persistence_row(id: &str, extra: &LiveExtra) -> bulkhead_store::PersistenceRow {
    bulkhead_store::PersistenceRow {
        sandbox_id: id.to_string(),
        on_timeout: extra.lifecycle.on_timeout.as_str().into(),
        auto_resume: extra.lifecycle.auto_resume,
        pause_memory: extra.lifecycle.pause_memory,
        timeout_ms: extra.timeout_ms,
        checkpoint_dir: extra.paused.as_ref().map(|p| p.dir.display().to_string()),
        checkpoint_memory: extra.paused.as_ref().is_some_and(|p| p.memory),
        generation: 0,
        paused_at: extra.paused.as_ref().map(|p| p.at_ms),
        resume_on_traffic: extra.paused.as_ref().is_some_and(|p| p.resume_on_traffic),
    }
}
