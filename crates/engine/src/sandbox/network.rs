//! The network verbs: validating a config into a proxy policy, attaching and detaching a
//! sandbox's link, `PUT /sandboxes/{id}/network`, the audit trail, and links after a restart.

use crate::engine::Engine;
use crate::error::EngineError;
use crate::sandbox::lifecycle::SandboxState;
use bulkhead_store::SandboxRow;

use crate::ids;
use crate::node::driver::DriverHandle;
use crate::node::network::{self, SandboxNetwork};
use crate::sandbox::lifecycle::Operation;
use crate::types::{Caller, EgressEvent};

type Result<T, E = EngineError> = std::result::Result<T, E>;

impl Engine {
    /// Validate a network config and build its proxy policy for a sandbox of `team_id` (400 on
    /// bad input).
    pub(crate) fn check_network(
        &self,
        team_id: &str,
        allow_internet: bool,
        net: Option<&SandboxNetwork>,
    ) -> Result<bulkhead_egress::NetworkPolicy> {
        let policy = net
            .cloned()
            .unwrap_or_default()
            .policy(allow_internet, team_id);
        policy
            .validate()
            .map_err(|e| EngineError::BadRequest(format!("Invalid network config: {e}")))?;
        if network::egress_allowed(&policy) && !self.node.has_egress() {
            return Err(EngineError::BadRequest(
                "This server has no egress proxy, so sandboxes cannot have network access: \
                 leave allow_internet_access and network.allowOut unset"
                    .into(),
            ));
        }
        Ok(policy)
    }

    /// `PUT /sandboxes/{id}/network`: replace the whole network config (omitted fields are
    /// cleared; `allow_internet_access` omitted = the server default). Applies to new
    /// connections at once: a sandbox that becomes allowed gets a link, one that no longer is
    /// loses it.
    pub async fn update_network(
        &self,
        caller: &Caller,
        id: &str,
        allow_internet_access: Option<bool>,
        net: SandboxNetwork,
    ) -> Result<()> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let row = self.running_row(id, Operation::UpdateNetwork).await?;
        let allow_internet = allow_internet_access.unwrap_or(self.cfg.network_default_allow);
        // The sandbox's team (the owner), which `authorize` has matched to the caller's.
        let policy = self.check_network(&row.team_id, allow_internet, Some(&net))?;
        let wanted = network::egress_allowed(&policy);
        let _guard = self.net_lock.lock().await;
        let (handle, attached) = {
            let live = self.live.lock();
            let l = live
                .get(&row.id)
                .ok_or_else(|| EngineError::SandboxNotFound(row.id.clone()))?;
            let handle = l
                .handle
                .clone()
                .ok_or_else(|| EngineError::SandboxNotFound(row.id.clone()))?;
            (handle, l.net_attached)
        };
        match (attached, wanted) {
            (true, true) => self
                .node
                .set_network_policy(&row.id, policy)
                .await
                .map_err(EngineError::network(Operation::UpdateNetwork))?,
            (false, true) => {
                attach_link(self, &row.id, &handle, policy, Operation::UpdateNetwork).await?
            }
            (true, false) => detach_link(self, &row.id).await,
            (false, false) => {}
        }
        let still_live = match self.live.lock().get_mut(&row.id) {
            Some(l) if l.state != SandboxState::Killing => {
                l.net_attached = wanted;
                true
            }
            _ => false,
        };
        if !still_live {
            // Killed while the link was being made: do not leave it behind.
            detach_link(self, &row.id).await;
            return Err(EngineError::SandboxNotFound(row.id.clone()));
        }
        let stored = (net != SandboxNetwork::default())
            .then(|| serde_json::to_string(&net).expect("network config serializes"));
        self.store
            .set_sandbox_network(&row.id, allow_internet, stored.as_deref())
            .await?;
        tracing::info!(sandbox = %row.id, allow_internet, link = wanted, "network config replaced");
        Ok(())
    }

    /// The newest `limit` egress decisions of a sandbox (running or ended), oldest first.
    pub async fn network_events(
        &self,
        caller: &Caller,
        id: &str,
        limit: usize,
    ) -> Result<Vec<EgressEvent>> {
        crate::tenancy::admit::authorize(self, caller, id).await?;
        let id = ids::normalize_sandbox_id(id);
        if !ids::is_valid_sandbox_id(id) {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        self.node.flush_audit().await;
        let events = self
            .store
            .list_egress_events(id, limit.clamp(1, 10_000) as i64)
            .await?;
        if events.is_empty() && self.store.get_sandbox(id).await?.is_none() {
            return Err(EngineError::SandboxNotFound(id.to_string()));
        }
        Ok(events.iter().map(EgressEvent::from).collect())
    }
}

pub(crate) async fn detach_link(engine: &Engine, id: &str) {
    engine.node.detach_network(id).await;
}

/// Give a sandbox its link and hand it to the egress proxy (as part of `op`).
pub(crate) async fn attach_link(
    engine: &Engine,
    id: &str,
    handle: &DriverHandle,
    policy: bulkhead_egress::NetworkPolicy,
    op: Operation,
) -> Result<()> {
    engine
        .node
        .attach_network(id, handle, policy)
        .await
        .map_err(EngineError::network(op))
}

/// Whether a sandbox as stored has an egress link (its network lets anything out).
pub(crate) fn has_link(row: &SandboxRow) -> bool {
    let net: SandboxNetwork = row
        .network
        .as_deref()
        .and_then(|n| serde_json::from_str(n).ok())
        .unwrap_or_default();
    network::egress_allowed(&net.policy(row.allow_internet, &row.team_id))
}

pub(crate) async fn reattach_after_restart(
    engine: &Engine,
    row: &SandboxRow,
    h: &DriverHandle,
) -> bool {
    let net: SandboxNetwork = row
        .network
        .as_deref()
        .and_then(|n| serde_json::from_str(n).ok())
        .unwrap_or_default();
    let policy = net.policy(row.allow_internet, &row.team_id);
    if !network::egress_allowed(&policy) {
        return false;
    }
    match attach_link(engine, &row.id, h, policy, Operation::UpdateNetwork).await {
        Ok(()) => true,
        Err(e) => {
            // The sandbox keeps running without network (fail closed) rather than being
            // killed; a PUT /network retries.
            tracing::error!(sandbox = %row.id, error = &e as &dyn std::error::Error, "could not restore the network link after a restart");
            false
        }
    }
}
