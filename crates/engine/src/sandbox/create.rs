//! Create: claim a warm sandbox (or start one cold, or restore a snapshot's checkpoint), give
//! it its identity through the agent's `/init`, attach its network link, record it and arm its
//! TTL.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::SandboxState;
use bulkhead_envd::rest::InitRequest;
use bulkhead_store::SandboxRow;

use bulkhead_envd::protocol::AgentInfo;

use crate::clock::now_ms;
use crate::ids;
use crate::node::AgentCallError;
use crate::node::driver::DriverHandle;
use crate::node::network;
use crate::sandbox::lifecycle::{self, Operation};
use crate::sandbox::live::{LiveExtra, persistence_row};
use crate::sandbox::source::Source;
use crate::telemetry;
use crate::tenancy::quota::Ask;
use crate::types::{Caller, CreateRequest, SandboxInfo, TemplateInfo};
use crate::validate::{validate_env, validate_metadata};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Create a sandbox. Admitted first (see `admission`): beyond the running and queued
    /// limits the answer is [`EngineError::TooManyCreates`] at once. Once its turn comes the
    /// create runs to its end in its own task, so a client that goes away mid-create leaves a
    /// recorded sandbox (ended by its TTL) and never an unrecorded one.
    pub async fn create(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let started = std::time::Instant::now();
        // A metric label: a known template's id, never the caller's string (a snapshot id
        // or a typo would make a new time series each).
        let label = self
            .template_for(
                caller,
                if req.template.is_empty() {
                    "base"
                } else {
                    &req.template
                },
            )
            .map_or_else(|| "other".to_owned(), |t| t.id.clone());
        let r = self.create_queued(caller, req).await;
        telemetry::create_done(&label, r.as_ref().map(|_| ()), started.elapsed());
        r
    }

    async fn create_queued(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let ticket = self.admission.enter()?;
        let turn = self.admission.turn(ticket).await;
        let engine = Arc::clone(self);
        let caller = caller.clone();
        // The create's agent calls carry the request's id, and its log lines the request's span.
        let work = bulkhead_common::request_id::propagate(async move {
            let _turn = turn;
            engine.create_admitted(&caller, req).await
        });
        let task = tokio::spawn(tracing::Instrument::in_current_span(work));
        match task.await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    async fn create_admitted(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let template_name = if req.template.is_empty() {
            "base"
        } else {
            req.template.as_str()
        };
        let source = self.resolve_source(caller, template_name).await?;
        self.create_from(caller, req, source).await
    }

    /// What a create's `template` names, for the caller: the caller's team's template, else
    /// a built-in, else (E2B: a snapshot is a template; creating from it restores it) the
    /// team's snapshot. A name is never both a template and a snapshot of one team (builds
    /// and snapshots refuse it), and another team's names are not looked at.
    pub(crate) async fn resolve_source(&self, caller: &Caller, name: &str) -> Result<Source> {
        if let Some(t) = self.template_for(caller, name) {
            return Ok(Source::Template(t));
        }
        match self.snapshot_source(caller, name).await? {
            Some(s) => Ok(Source::Checkpoint(s)),
            None => Err(EngineError::TemplateNotFound(name.to_string())),
        }
    }

    /// Create a sandbox from `source` with the settings of `req` (its `template` is ignored):
    /// admitted and validated into a [`Plan`], started (claimed from the pool, started cold
    /// or restored) with its identity, made ready (agent version, network link, start
    /// command), then recorded and tracked. A failure after the start stops the sandbox, so
    /// nothing half-made is left.
    pub(crate) async fn create_from(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
        source: Source,
    ) -> Result<SandboxInfo> {
        let plan = self.plan(caller, &req, &source).await?;
        let (handle, agent) = self.start_planned(&plan, &req, &source).await?;
        let net_attached = self.make_ready(&plan, &source, &handle, &agent).await?;
        let started = Started {
            handle,
            agent,
            net_attached,
        };
        self.record(caller, &req, &source, plan, started).await
    }

    /// Admission and validation: nothing has started yet, so a refusal costs nothing.
    async fn plan(
        self: &Arc<Self>,
        caller: &Caller,
        req: &CreateRequest,
        source: &Source,
    ) -> Result<Plan> {
        let template = match source {
            Source::Template(t) => t.clone(),
            Source::Checkpoint(c) => c.template.clone(),
        };
        let timeout =
            self.check_timeout(req.timeout.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        // Held until the sandbox is tracked: it counts toward the team's running sandboxes.
        let team_slot = crate::tenancy::admit::admit_team(
            self,
            caller,
            Ask {
                vcpus: template.cpu_count as i64,
                memory_mb: template.memory_mb as i64,
                timeout_secs: timeout.as_secs(),
            },
            true,
        )
        .await?;
        validate_env(&req.env_vars)?;
        validate_metadata(&req.metadata)?;
        let allow_internet = req
            .allow_internet_access
            .unwrap_or(self.cfg.network_default_allow);
        let policy = self.check_network(&caller.team_id, allow_internet, req.network.as_ref())?;
        // Paused sandboxes hold no processes or memory: only running ones count.
        let running = self
            .live
            .lock()
            .values()
            .filter(|l| l.state != SandboxState::Paused)
            .count();
        if running >= self.cfg.max_sandboxes {
            return Err(EngineError::Capacity);
        }
        if matches!(source, Source::Checkpoint(_)) && !req.volume_mounts.is_empty() {
            return Err(EngineError::BadRequest(
                "volumeMounts cannot be given when creating from a snapshot yet: create from a template".into(),
            ));
        }
        // Held until the sandbox is recorded: its volumes cannot be deleted meanwhile.
        let (volumes, volume_ids, mounting) =
            crate::volume::verbs::resolve_mounts(self, caller, &req.volume_mounts).await?;
        for v in &volumes {
            crate::volume::types::check_against_template(&template.rootfs, &v.path)?;
        }
        let id = ids::sandbox_id();
        let token = req.is_secure().then(|| ids::random_hex(20));
        let mut env = self.cfg.sandbox_env.clone();
        // A built template's ENV steps, its last USER and WORKDIR (E2B: they persist).
        let runtime = template.runtime.clone();
        if let Some(rt) = &runtime {
            env.extend(rt.envs.clone());
        }
        if let Source::Checkpoint(c) = source {
            env.extend(c.env_vars.clone());
        }
        env.extend(req.env_vars.clone());
        let init = InitRequest {
            env_vars: Some(env),
            access_token: token.clone(),
            default_user: Some(runtime.as_ref().map_or("user", |r| r.user.as_str()).into()),
            default_workdir: runtime.as_ref().and_then(|r| r.workdir.clone()),
            ..Default::default()
        };
        Ok(Plan {
            id,
            template,
            timeout,
            allow_internet,
            policy,
            volumes,
            volume_ids,
            token,
            init,
            _team_slot: team_slot,
            _mounting: mounting,
        })
    }

    /// Start the sandbox and give it its identity: from the pool, cold, or from a checkpoint.
    async fn start_planned(
        &self,
        plan: &Plan,
        req: &CreateRequest,
        source: &Source,
    ) -> Result<(DriverHandle, AgentInfo)> {
        match source {
            // Pool members have no volumes: a sandbox that mounts some starts cold.
            Source::Template(t)
                if !plan.volumes.is_empty()
                    || !crate::template::registry::is_pooled_tree(self, t) =>
            {
                let mut spec = t.spec();
                spec.volumes = plan.volumes.clone();
                self.start_cold_and_init(&spec, &plan.init).await
            }
            // Only creates that claim from the pool make it grow (not an older tag's, not one
            // with volumes, not one refused by validation).
            Source::Template(t) => {
                crate::pool::filler::record_pool_demand(self, &t.id);
                self.claim_and_init(t, &plan.init).await
            }
            Source::Checkpoint(c) => {
                // A memory restore's agent already has the source's env and user: it gets the
                // request's env on top, and its own token (E2B: a fresh one per sandbox).
                let init = if c.memory {
                    InitRequest {
                        env_vars: Some(req.env_vars.clone()),
                        access_token: Some(plan.token.clone().unwrap_or_default()),
                        ..Default::default()
                    }
                } else {
                    plan.init.clone()
                };
                self.restore_new(c, &init).await
            }
        }
    }

    /// Before anyone sees it: an agent this server can drive, its network link (late binding:
    /// pool members have none; only sandboxes whose policy lets something out get one), and a
    /// built template's start command passing its ready check (a memory restore already runs
    /// it). Stops the sandbox on failure. Returns whether a link was attached.
    async fn make_ready(
        &self,
        plan: &Plan,
        source: &Source,
        handle: &DriverHandle,
        agent: &AgentInfo,
    ) -> Result<bool> {
        let id = &plan.id;
        if !agent.is_supported() {
            // The template's image holds an agent this server cannot drive: refuse to hand it
            // out (nothing is lost, the sandbox was never given to anyone).
            let _ = self.node.stop(handle).await;
            return Err(EngineError::agent_too_old(id, Operation::Create, agent));
        }
        let net_attached = network::egress_allowed(&plan.policy);
        if net_attached
            && let Err(e) = crate::sandbox::network::attach_link(
                self,
                id,
                handle,
                plan.policy.clone(),
                Operation::Create,
            )
            .await
        {
            let _ = self.node.stop(handle).await;
            return Err(e);
        }
        if let (Some(rt), false) = (
            &plan.template.runtime,
            matches!(source, Source::Checkpoint(c) if c.memory),
        ) && (rt.start_cmd.is_some() || rt.ready_cmd.is_some())
            && let Err(e) = crate::template::start::start_and_wait_ready(
                self,
                handle,
                rt,
                plan.token.as_deref(),
            )
            .await
        {
            crate::sandbox::network::detach_link(self, id).await;
            let _ = self.node.stop(handle).await;
            return Err(crate::template::builds::TemplateBuildError::StartFailed(e).into());
        }
        Ok(net_attached)
    }

    /// Record the sandbox (row, lifecycle settings, mounts) and track it; a failed write stops
    /// it and leaves a dead row.
    async fn record(
        self: &Arc<Self>,
        caller: &Caller,
        req: &CreateRequest,
        source: &Source,
        plan: Plan,
        started: Started,
    ) -> Result<SandboxInfo> {
        let Started {
            handle,
            agent,
            net_attached,
        } = started;
        let created = lifecycle::transition(SandboxState::Starting, Operation::Create)
            .expect("a starting sandbox can be created");
        let (id, template) = (plan.id.clone(), plan.template.clone());
        // What a fresh boot of this sandbox (a filesystem-only resume) is given again.
        let mut stored_env = match source {
            Source::Checkpoint(c) => c.env_vars.clone(),
            Source::Template(_) => BTreeMap::new(),
        };
        stored_env.extend(req.env_vars.clone());
        let started_at = now_ms();
        let end_at = started_at + plan.timeout.as_millis() as i64;
        let row = SandboxRow {
            id: id.clone(),
            template_id: template.id.clone(),
            alias: template.aliases.first().cloned(),
            state: created.after.into(),
            owner_key_id: caller.key_id.clone(),
            team_id: caller.team_id.clone(),
            metadata: req.metadata.clone(),
            env_vars: stored_env,
            envd_access_token: plan.token.clone(),
            cpu_count: template.cpu_count as i64,
            memory_mb: template.memory_mb as i64,
            disk_size_mb: template.disk_size_mb as i64,
            started_at,
            end_at,
            driver_handle: Some(serde_json::to_string(&handle).expect("handle serializes")),
            end_reason: None,
            allow_internet: plan.allow_internet,
            node_id: handle.node.clone(),
            owner_replica: self.cfg.replica.clone(),
            network: req
                .network
                .as_ref()
                .map(|n| serde_json::to_string(n).expect("network config serializes")),
        };
        let extra = LiveExtra {
            lifecycle: req.lifecycle,
            timeout_ms: plan.timeout.as_millis() as i64,
            paused: None,
            paused_once: false,
        };
        let stored = async {
            self.store.insert_sandbox(&row).await?;
            self.store
                .upsert_persistence(&persistence_row(&id, &extra))
                .await?;
            crate::volume::verbs::record_mounts(self, &id, &plan.volumes, &plan.volume_ids).await
        };
        if let Err(e) = stored.await {
            crate::sandbox::network::detach_link(self, &id).await;
            let _ = self.node.stop(&handle).await;
            let _ = self.store.delete_persistence(&id).await;
            let _ = self
                .store
                .set_sandbox_state(&id, SandboxState::Dead.into(), Some("create failed"))
                .await;
            return Err(e);
        }
        crate::sandbox::lookup::track(self, &row, Some(handle), net_attached, agent, extra);
        self.pools.wakeup.notify_one();
        tracing::info!(sandbox = %id, template = %template.id, "sandbox created");
        Ok(self.info_from_row(&row))
    }

    /// Take a warm sandbox (or make one as the pool would) and give it its identity through
    /// `/init`.
    /// Returns the sandbox and what its agent said about itself.
    pub(crate) async fn claim_and_init(
        &self,
        t: &TemplateInfo,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        // A pooled sandbox may have died while waiting; try the pool a few times, then cold.
        for _ in 0..3 {
            let Some(handle) = self.node.pool_take(&t.id).await else {
                break;
            };
            // It was started at background CPU priority (see `Driver::start_warm`).
            if let Err(e) = self.node.claimed(&handle).await {
                tracing::warn!(error = %e, "pooled sandbox keeps its background CPU priority");
            }
            match init_agent(self, &handle, init, None, Operation::Create).await {
                Ok(agent) => {
                    telemetry::pool_claim(&t.id, true);
                    return Ok((handle, agent));
                }
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "pooled sandbox unusable, discarding it"
                    );
                    let _ = self.node.stop(&handle).await;
                }
            }
        }
        // An empty pool: a member made now (for a heavy template, restored from its warm
        // checkpoint rather than paying a kernel start).
        telemetry::pool_claim(&t.id, false);
        let handle = self.new_pool_member(t).await?;
        self.init_or_stop(handle, init).await
    }

    /// Start a sandbox from `spec` (no pool) and give it its identity through `/init`.
    pub(crate) async fn start_cold_and_init(
        &self,
        spec: &crate::node::driver::SandboxSpec,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        let handle = self
            .node
            .start(spec, false)
            .await
            .map_err(EngineError::driver(Operation::Create))?;
        self.init_or_stop(handle, init).await
    }

    /// `/init` a sandbox nobody else has seen yet; stop it if that fails (nothing is recorded).
    async fn init_or_stop(
        &self,
        handle: DriverHandle,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        match init_agent(self, &handle, init, None, Operation::Create).await {
            Ok(agent) => Ok((handle, agent)),
            Err(e) => {
                let _ = self.node.stop(&handle).await;
                Err(e)
            }
        }
    }
}

/// Give the agent its identity; its answer says which protocol it speaks (an agent that
/// predates versioning answers 204 and counts as the legacy protocol). `auth` is the token
/// an agent restored from a checkpoint still requires (it was given one before).
pub(crate) async fn init_agent(
    engine: &Engine,
    handle: &DriverHandle,
    init: &InitRequest,
    auth: Option<&str>,
    op: Operation,
) -> Result<AgentInfo> {
    engine
        .node
        .init_agent(handle, init, auth)
        .await
        .map_err(|e| match e {
            AgentCallError::Reach(e) => EngineError::driver(op)(e),
            AgentCallError::Call(e) => EngineError::agent(op)(e),
        })
}

/// A create that passed admission and validation: what the later steps need, and the guards
/// that hold its team slot and its volumes until it is recorded.
struct Plan {
    id: String,
    template: Arc<TemplateInfo>,
    timeout: std::time::Duration,
    allow_internet: bool,
    policy: bulkhead_egress::NetworkPolicy,
    volumes: Vec<crate::node::driver::VolumeMount>,
    volume_ids: Vec<String>,
    token: Option<String>,
    init: InitRequest,
    _team_slot: crate::tenancy::state::CreateSlot,
    _mounting: crate::volume::verbs::MountGuard,
}

/// A started, ready sandbox not yet recorded.
struct Started {
    handle: DriverHandle,
    agent: AgentInfo,
    net_attached: bool,
}
