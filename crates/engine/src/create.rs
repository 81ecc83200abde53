//! Create: claim a warm sandbox (or start one cold), give it its identity through the agent's
//! `/init`, attach its network link, record it and arm its TTL.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use bulkhead_envd::rest::InitRequest;
use bulkhead_store::{SandboxRow, SandboxState};

use bulkhead_envd::protocol::AgentInfo;

use crate::agent_client;
use crate::clock::now_ms;
use crate::driver::DriverHandle;
use crate::ids;
use crate::lifecycle::{self, Operation};
use crate::network;
use crate::types::{Caller, CreateRequest, SandboxInfo, TemplateInfo};
use crate::validate::{validate_env, validate_metadata};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    pub async fn create(
        self: &Arc<Self>,
        caller: &Caller,
        req: CreateRequest,
    ) -> Result<SandboxInfo> {
        let template_name = if req.template.is_empty() {
            "base"
        } else {
            req.template.as_str()
        };
        let template = self
            .template(template_name)
            .ok_or_else(|| EngineError::TemplateNotFound(template_name.to_string()))?;
        let timeout =
            self.check_timeout(req.timeout.unwrap_or(self.cfg.default_timeout.as_secs()))?;
        validate_env(&req.env_vars)?;
        validate_metadata(&req.metadata)?;
        let allow_internet = req
            .allow_internet_access
            .unwrap_or(self.cfg.network_default_allow);
        let policy = self.check_network(allow_internet, req.network.as_ref())?;
        if self.live.lock().len() >= self.cfg.max_sandboxes {
            return Err(EngineError::Capacity);
        }
        // Held until the sandbox is recorded: its volumes cannot be deleted meanwhile.
        let (volumes, volume_ids, _mounting) =
            self.resolve_mounts(caller, &req.volume_mounts).await?;

        // Validated before anything starts; the new sandbox is `starting` until it is recorded.
        let created = lifecycle::transition(SandboxState::Starting, Operation::Create)
            .expect("a starting sandbox can be created");
        let id = ids::sandbox_id();
        let token = req.is_secure().then(|| ids::random_hex(20));
        let mut env = self.cfg.sandbox_env.clone();
        env.extend(req.env_vars.clone());
        let init = InitRequest {
            env_vars: Some(env),
            access_token: token.clone(),
            default_user: Some("user".into()),
            ..Default::default()
        };
        // Pool members have no volumes: a sandbox that mounts some starts cold.
        let (handle, agent) = if volumes.is_empty() {
            self.claim_and_init(&template, &init).await?
        } else {
            let mut spec = template.spec();
            spec.volumes = volumes.clone();
            self.start_cold_and_init(&spec, &init).await?
        };
        if !agent.is_supported() {
            // The template's image holds an agent this server cannot drive: refuse to hand it
            // out (nothing is lost, the sandbox was never given to anyone).
            let _ = self.driver.stop(&handle).await;
            return Err(EngineError::agent_too_old(&id, Operation::Create, &agent));
        }
        // Late binding: pool members have no link; one is made only for sandboxes whose
        // policy lets something out.
        let net_attached = network::egress_allowed(&policy);
        if net_attached
            && let Err(e) = self
                .attach_link(&id, &handle, policy, Operation::Create)
                .await
        {
            let _ = self.driver.stop(&handle).await;
            return Err(e);
        }

        let started = now_ms();
        let end_at = started + timeout.as_millis() as i64;
        let row = SandboxRow {
            id: id.clone(),
            template_id: template.id.clone(),
            alias: template.aliases.first().cloned(),
            state: created.after,
            owner_key_id: caller.key_id.clone(),
            metadata: req.metadata.clone(),
            env_vars: req.env_vars.clone(),
            envd_access_token: token.clone(),
            cpu_count: template.cpu_count as i64,
            memory_mb: template.memory_mb as i64,
            disk_size_mb: template.disk_size_mb as i64,
            started_at: started,
            end_at,
            driver_handle: Some(serde_json::to_string(&handle).expect("handle serializes")),
            end_reason: None,
            allow_internet,
            network: req
                .network
                .as_ref()
                .map(|n| serde_json::to_string(n).expect("network config serializes")),
        };
        let recorded = match self.store.insert_sandbox(&row).await {
            Ok(()) => self.record_mounts(&id, &volumes, &volume_ids).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = recorded {
            self.detach_link(&id);
            let _ = self.driver.stop(&handle).await;
            return Err(e);
        }
        self.track(&row, handle, net_attached, agent);
        self.pool_wakeup.notify_one();
        tracing::info!(sandbox = %id, template = %template.id, "sandbox created");
        Ok(self.info_from_row(&row))
    }

    /// Take a warm sandbox (or start one) and give it its identity through `/init`.
    /// Returns the sandbox and what its agent said about itself.
    pub(crate) async fn claim_and_init(
        &self,
        t: &TemplateInfo,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        // A pooled sandbox may have died while waiting; try the pool a few times, then cold.
        for _ in 0..3 {
            let Some(handle) = self
                .pools
                .lock()
                .expect("pool lock")
                .get_mut(&t.id)
                .and_then(|q| q.pop_front())
            else {
                break;
            };
            match self.init_agent(&handle, init).await {
                Ok(agent) => return Ok((handle, agent)),
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "pooled sandbox unusable, discarding it"
                    );
                    let _ = self.driver.stop(&handle).await;
                }
            }
        }
        self.start_cold_and_init(&t.spec(), init).await
    }

    /// Start a sandbox from `spec` (no pool) and give it its identity through `/init`.
    pub(crate) async fn start_cold_and_init(
        &self,
        spec: &crate::driver::SandboxSpec,
        init: &InitRequest,
    ) -> Result<(DriverHandle, AgentInfo)> {
        let handle = self
            .driver
            .start(spec)
            .await
            .map_err(EngineError::driver(Operation::Create))?;
        match self.init_agent(&handle, init).await {
            Ok(agent) => Ok((handle, agent)),
            Err(e) => {
                let _ = self.driver.stop(&handle).await;
                Err(e)
            }
        }
    }

    /// Give the agent its identity; its answer says which protocol it speaks (an agent that
    /// predates versioning answers 204 and counts as the legacy protocol).
    pub(crate) async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
    ) -> Result<AgentInfo> {
        let stream = self
            .driver
            .connect(handle)
            .await
            .map_err(EngineError::driver(Operation::Create))?;
        let body = agent_client::request(stream, http::Method::POST, "/init", Some(init), None)
            .await
            .map_err(EngineError::agent(Operation::Create))?;
        Ok(agent_client::info_from_init(&body))
    }
}
