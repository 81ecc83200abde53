//! Looking sandboxes up: the lifecycle gate every verb passes (`enter`), the watcher that
//! notices a death, and the read verbs `get` and `list`.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::SandboxState;
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_store::{SandboxFilter, SandboxRow};
use tokio_util::sync::CancellationToken;

use crate::clock::ms_to_dt;
use crate::ids;
use crate::node::driver::DriverHandle;
use crate::sandbox::lifecycle::{self, Operation, Step};
use crate::sandbox::live::{Live, LiveExtra};
use crate::tenancy::metering::Meter;
use crate::types::{Caller, ListPage, ListRequest, SandboxInfo};
use crate::validate::{page_after, page_end};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Ask the lifecycle whether `op` may run on sandbox `id` now and, if it moves the sandbox
    /// through a transient state, put it there. Returns the normalized id and the step.
    pub(crate) fn enter<'a>(&self, id: &'a str, op: Operation) -> Result<(&'a str, Step)> {
        let id = ids::normalize_sandbox_id(id);
        if !ids::is_valid_sandbox_id(id) {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        if !op.works_with_unsupported_agent()
            && let Some(agent) = self.live.agent(id)
            && !agent.is_supported()
        {
            return Err(EngineError::agent_too_old(id, op, &agent));
        }
        let step = self
            .live
            .enter(id, op)
            .map_err(|reason| EngineError::refused(id, op, reason))?;
        Ok((id, step))
    }

    /// The stored record of a sandbox `op` may run on (see [`Self::enter`]).
    pub(crate) async fn running_row(&self, id: &str, op: Operation) -> Result<SandboxRow> {
        let (id, _) = self.enter(id, op)?;
        match self.store.get_sandbox(id).await? {
            Some(row) if row.state != SandboxState::Dead.into() => Ok(row),
            _ => Err(EngineError::SandboxNotFound(id.to_string())),
        }
    }

    /// Is the sandbox in the live set and not on its way out?
    pub fn is_live(&self, id: &str) -> bool {
        self.live.is_live(id)
    }

    pub(crate) fn handle(&self, id: &str) -> Result<DriverHandle> {
        self.live
            .handle(id)
            .ok_or_else(|| EngineError::SandboxNotFound(id.to_string()))
    }

    /// Watch a (new) process of sandbox `id` for its death, replacing any earlier watcher.
    pub(crate) fn rewatch(self: &Arc<Self>, id: &str, handle: DriverHandle) {
        let cancel = CancellationToken::new();
        let old = self
            .live
            .lock()
            .get_mut(id)
            .map(|l| std::mem::replace(&mut l.cancel, cancel.clone()));
        if let Some(old) = old {
            old.cancel();
        }
        self.spawn_watcher(id, handle, cancel);
    }

    fn spawn_watcher(self: &Arc<Self>, id: &str, handle: DriverHandle, cancel: CancellationToken) {
        let engine = Arc::clone(self);
        let id = id.to_string();
        tokio::spawn(async move {
            tokio::select! {
                // A cancelled watcher never reports: a pause ends the process on purpose.
                biased;
                _ = cancel.cancelled() => {}
                _ = engine.node.wait(&handle) => {
                    if !cancel.is_cancelled() {
                        crate::sandbox::kill::finish(&engine, &id, "exited").await;
                    }
                }
            }
        });
    }

    pub(crate) fn info_from_row(&self, row: &SandboxRow) -> SandboxInfo {
        // The live set is ahead of the store (TTL changes, transient states).
        let (end_at, state, extra, node) = self.live.lock().get(&row.id).map_or_else(
            || (row.end_at, row.state, LiveExtra::default(), None),
            |l| {
                let node = l.handle.as_ref().and_then(|h| h.node.clone());
                (l.end_at_ms, l.state.into(), l.extra.clone(), node)
            },
        );
        // Paused, or driven by another replica: the node the store has for it.
        let node = node.or_else(|| row.node_id.clone());
        SandboxInfo {
            id: row.id.clone(),
            template_id: row.template_id.clone(),
            alias: row.alias.clone(),
            metadata: row.metadata.clone(),
            started_at: ms_to_dt(row.started_at),
            end_at: ms_to_dt(end_at),
            cpu_count: row.cpu_count,
            memory_mb: row.memory_mb,
            disk_size_mb: row.disk_size_mb,
            state: lifecycle::e2b_state(state.into()),
            envd_access_token: row.envd_access_token.clone(),
            envd_version: self.cfg.envd_version.clone(),
            allow_internet_access: row.allow_internet,
            network: row
                .network
                .as_deref()
                .and_then(|n| serde_json::from_str(n).ok()),
            lifecycle: extra.lifecycle,
            pause_memory: extra.paused.as_ref().map(|p| p.memory),
            domain: self.cfg.sandbox_domain.clone(),
            node,
        }
    }

    pub async fn get(&self, caller: &Caller, id: &str) -> Result<SandboxInfo> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let row = self.running_row(id, Operation::Get).await?;
        Ok(self.info_from_row(&row))
    }

    /// One page of the caller's team's sandboxes (E2B: every key of a team sees the team's
    /// sandboxes, and no others).
    pub async fn list(&self, caller: &Caller, req: &ListRequest) -> Result<ListPage> {
        let asked = if req.states.is_empty() {
            vec![SandboxState::Running, SandboxState::Paused]
        } else {
            req.states.clone()
        };
        // E2B knows two states: a sandbox being paused is still running, one being resumed
        // still paused (see `lifecycle::e2b_state`); the store may hold the transient ones.
        let mut states = Vec::new();
        for s in asked {
            states.push(s);
            match s {
                SandboxState::Running => states.push(SandboxState::Pausing),
                SandboxState::Paused => states.push(SandboxState::Resuming),
                _ => {}
            }
        }
        let filter = SandboxFilter {
            states: states.into_iter().map(Into::into).collect(),
            metadata: req.metadata.clone(),
            template_id: req.template.as_ref().map(|t| {
                self.template_for(caller, t)
                    .map_or_else(|| t.clone(), |t| t.id.clone())
            }),
            started_after: req.started_after.map(|d| d.timestamp_millis()),
            owner_key_id: None,
            team_id: Some(caller.team_id.clone()),
            owner_replica: None,
        };
        let limit = req.limit.unwrap_or(100).clamp(1, 100);
        let after = page_after(req.next_token.as_deref())?;
        let mut rows = self
            .store
            .list_sandboxes(&filter, Some(limit as i64 + 1), req.order_desc, after)
            .await?;
        let next_token = page_end(&mut rows, limit, |r| (r.started_at, &r.id));
        let total_running = self
            .store
            .count_sandboxes(&SandboxFilter {
                states: vec![SandboxState::Running.into()],
                team_id: Some(caller.team_id.clone()),
                ..Default::default()
            })
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        for row in &rows {
            items.push(self.listed_info(row).await?);
        }
        Ok(ListPage {
            items,
            next_token,
            total_running,
        })
    }

    /// A listed sandbox: from the live set when this engine drives it, else (another API
    /// replica drives it) with its lifecycle and checkpoint as the store has them.
    async fn listed_info(&self, row: &SandboxRow) -> Result<SandboxInfo> {
        let mut info = self.info_from_row(row);
        if self.cfg.replica.is_none() || self.live.lock().contains_key(&row.id) {
            return Ok(info);
        }
        let persist = self.store.get_persistence(&row.id).await?;
        info.lifecycle = LiveExtra::from_stored(persist.as_ref()).lifecycle;
        info.pause_memory = persist
            .filter(|p| p.checkpoint_dir.is_some())
            .map(|p| p.checkpoint_memory);
        Ok(info)
    }

    /// Every page of a listing (the deprecated v1 list returns them all at once).
    pub async fn list_all(&self, caller: &Caller, req: &ListRequest) -> Result<Vec<SandboxInfo>> {
        let mut req = req.clone();
        let mut all = Vec::new();
        loop {
            let page = self.list(caller, &req).await?;
            all.extend(page.items);
            match page.next_token {
                Some(t) => req.next_token = Some(t),
                None => return Ok(all),
            }
        }
    }
}

/// Put a sandbox in the live set and, when it runs (`handle`), watch for its death.
pub(crate) fn track(
    engine: &Arc<Engine>,
    row: &SandboxRow,
    handle: Option<DriverHandle>,
    net_attached: bool,
    agent: AgentInfo,
    extra: LiveExtra,
) {
    let cancel = CancellationToken::new();
    let live = Live {
        state: row.state.into(),
        handle: handle.clone(),
        end_at_ms: row.end_at,
        access_token: row.envd_access_token.clone(),
        cancel: cancel.clone(),
        cpu_count: row.cpu_count,
        last_cpu: (0, row.started_at),
        samples: Default::default(),
        net_attached,
        agent,
        extra,
        traffic: CancellationToken::new(),
        // Metered from its start; a re-adopted sandbox from where its metering stopped
        // (`recover` moves `since_ms` up to the last recorded interval).
        meter: Meter {
            team_id: row.team_id.clone(),
            key_id: row.owner_key_id.clone(),
            vcpus: row.cpu_count,
            memory_mb: row.memory_mb,
            since_ms: row.started_at,
            carry: 0.0,
            paused_bytes: None,
        },
    };
    engine.live.lock().insert(row.id.clone(), live);
    if let Some(handle) = handle {
        engine.spawn_watcher(&row.id, handle, cancel);
    }
}
