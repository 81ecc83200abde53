//! The live set: every sandbox this server drives right now, with its lifecycle state and what
//! the verbs need at hand (driver handle, TTL, access token, CPU sample, network link). A leaf:
//! the verb modules share it through [`crate::engine::Engine`], and state changes go through
//! [`lifecycle::transition`] only.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use bulkhead_envd::protocol::AgentInfo;
use tokio_util::sync::CancellationToken;

use crate::driver::DriverHandle;
use crate::lifecycle::{self, Operation, Refusal, SandboxState, Step};

pub(crate) struct Live {
    /// Where it is in its life; only [`lifecycle::transition`] decides the next one.
    pub(crate) state: SandboxState,
    pub(crate) handle: DriverHandle,
    pub(crate) end_at_ms: i64,
    pub(crate) access_token: Option<String>,
    /// Cancels the watcher task that notices the sandbox's death.
    pub(crate) cancel: CancellationToken,
    pub(crate) cpu_count: i64,
    /// Last CPU sample (ns of CPU time, wall ms) for the usage percentage.
    pub(crate) last_cpu: (u64, i64),
    /// The egress proxy serves a link for this sandbox.
    pub(crate) net_attached: bool,
    /// What its agent said about itself (at claim, or when adopted after a restart).
    pub(crate) agent: AgentInfo,
}

/// Sandbox id → [`Live`]. A sandbox absent from the set is, to the lifecycle, dead.
#[derive(Default)]
pub(crate) struct LiveSet(Mutex<HashMap<String, Live>>);

impl LiveSet {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Live>> {
        self.0.lock().expect("live lock")
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
        self.lock().get(id).map(|l| l.handle.clone())
    }
}
