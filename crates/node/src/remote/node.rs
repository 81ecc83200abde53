//! `impl Node for RemoteNode`: each method is its RPC. Methods whose trait signature has no
//! error (`adopt`, `reachable`, `checkpoint_info`, `detach_network`, `flush_audit`, the pool
//! calls) log a failed call and answer what a node that could not be asked implies (not
//! adopted, unreachable, no checkpoint, nothing taken).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use bulkhead_engine::driver::{
    Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, DriverError, DriverHandle,
    FileChange, ResourceUsage, RestoreOptions, SandboxSpec,
};
use bulkhead_engine::{AgentCallError, NetworkError, Node};
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;
use bulkhead_node_proto::convert::driver::handle as handle_of;
use bulkhead_node_proto::{ConvertError, v1};

use super::client::RemoteNode;
use super::error::{CallError, RemoteError};

impl RemoteNode {
    fn driver_err(&self, e: CallError) -> DriverError {
        e.into_driver(&self.base)
    }

    /// A failure to build a request or read an answer, as a `DriverError`.
    fn local_err(&self, e: impl Into<RemoteError>) -> DriverError {
        CallError::Remote(e.into()).into_driver(&self.base)
    }

    fn answer_err(&self, method: &'static str, e: ConvertError) -> DriverError {
        self.local_err(RemoteError::Decode {
            node: self.base.clone(),
            method,
            source: e.into(),
        })
    }

    fn wire_path(&self, local: &Path) -> Result<String, DriverError> {
        let wire = self.paths.to_wire(local).map_err(|e| self.local_err(e))?;
        // `to_wire` checked it: plain components, so UTF-8.
        Ok(wire.to_string_lossy().into_owned())
    }

    /// A spec with its host paths in their wire form.
    fn wire_spec(&self, spec: &SandboxSpec) -> Result<v1::SandboxSpec, DriverError> {
        let mut wire = spec.clone();
        wire.rootfs = self
            .paths
            .to_wire(&spec.rootfs)
            .map_err(|e| self.local_err(e))?;
        for volume in &mut wire.volumes {
            volume.host_dir = self
                .paths
                .to_wire(&volume.host_dir)
                .map_err(|e| self.local_err(e))?;
        }
        v1::SandboxSpec::try_from(&wire).map_err(|e| self.answer_err("(request)", e))
    }

    /// A checkpoint the node answered, its directory made local again.
    fn local_checkpoint(
        &self,
        method: &'static str,
        info: Option<v1::CheckpointInfo>,
    ) -> Result<CheckpointInfo, DriverError> {
        let info = info.ok_or(ConvertError::MissingField {
            field: "CheckpointInfo",
        });
        let mut info = info
            .and_then(CheckpointInfo::try_from)
            .map_err(|e| self.answer_err(method, e))?;
        info.dir = self
            .paths
            .to_local(&info.dir)
            .map_err(|e| self.local_err(e))?;
        Ok(info)
    }

    /// A handle the node answered (a new sandbox or a pool member); its driver is one the node
    /// owns from now on.
    fn answered_handle(
        &self,
        method: &'static str,
        h: Option<v1::DriverHandle>,
    ) -> Result<DriverHandle, DriverError> {
        handle_of(h, "handle").map_err(|e| self.answer_err(method, e))
    }

    fn handles(&self, method: &'static str, list: Vec<v1::DriverHandle>) -> Vec<DriverHandle> {
        list.into_iter()
            .filter_map(|h| match self.answered_handle(method, Some(h)) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.log(method, &e);
                    None
                }
            })
            .collect()
    }

    fn log(&self, method: &'static str, e: &(dyn std::error::Error + 'static)) {
        tracing::warn!(node = %self.base, method, error = e, "a node call failed");
    }

    fn quick(&self) -> Duration {
        self.cfg.call_timeout
    }

    fn slow(&self) -> Duration {
        self.cfg.slow_call_timeout
    }
}

fn wire(h: &DriverHandle) -> Option<v1::DriverHandle> {
    Some(h.into())
}

#[async_trait]
impl Node for RemoteNode {
    fn driver_name(&self) -> String {
        self.info().driver_name.clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.info().capabilities
    }

    fn has_egress(&self) -> bool {
        self.info().has_egress
    }

    fn checkpoint_key(&self) -> Option<String> {
        self.info().checkpoint_key.clone()
    }

    /// From the driver names the node owned when its Info was read (see the module docs).
    fn owns(&self, handle: &DriverHandle) -> bool {
        self.info().owned_drivers.contains(&handle.driver)
    }

    async fn start(&self, spec: &SandboxSpec, warm: bool) -> Result<DriverHandle, DriverError> {
        let req = v1::StartRequest {
            context: None,
            spec: Some(self.wire_spec(spec)?),
            warm,
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        self.answered_handle("Start", answer.handle)
    }

    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let req = v1::ClaimedRequest {
            context: None,
            handle: wire(handle),
        };
        self.call(req, self.quick())
            .await
            .map_err(|e| self.driver_err(e))?;
        Ok(())
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let req = v1::StopRequest {
            context: None,
            handle: wire(handle),
        };
        self.call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        Ok(())
    }

    /// Polls until the node answers that the sandbox exited. A refused poll (a malformed
    /// handle) ends the wait; a failed one (the node unreachable, restarting) is retried with
    /// a growing pause (at most 5 s): the sandbox may well be alive on the node.
    async fn wait(&self, handle: &DriverHandle) {
        let poll = self.cfg.wait_poll;
        let timeout_ms = u32::try_from(poll.as_millis()).unwrap_or(u32::MAX);
        let mut pause = Duration::from_millis(100);
        loop {
            let req = v1::WaitRequest {
                context: None,
                handle: wire(handle),
                timeout_ms,
            };
            match self.call(req, poll + self.quick()).await {
                Ok(answer) if answer.exited => return,
                Ok(_) => pause = Duration::from_millis(100),
                Err(CallError::Node { detail, .. })
                    if detail.code() == v1::node_error::Code::InvalidArgument =>
                {
                    tracing::warn!(
                        node = %self.base,
                        message = %detail.message,
                        "the node refused to wait for a sandbox; taking it as gone"
                    );
                    return;
                }
                Err(e) => {
                    // A stale epoch was refreshed by `call`: poll again at once.
                    if !e.is_stale() {
                        self.log("Wait", &self.driver_err(e));
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        let req = v1::AdoptRequest {
            context: None,
            handle: wire(handle),
        };
        match self.call(req, self.quick()).await {
            Ok(answer) => answer.adopted,
            Err(e) => {
                self.log("Adopt", &self.driver_err(e));
                false
            }
        }
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        let req = v1::UsageRequest {
            context: None,
            handle: wire(handle),
        };
        let answer = self
            .call(req, self.quick())
            .await
            .map_err(|e| self.driver_err(e))?;
        answer
            .usage
            .map(ResourceUsage::from)
            .ok_or_else(|| self.answer_err("Usage", ConvertError::MissingField { field: "usage" }))
    }

    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        let req = v1::ThawRequest {
            context: None,
            handle: wire(handle),
        };
        self.call(req, self.quick())
            .await
            .map_err(|e| self.driver_err(e))?;
        Ok(())
    }

    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let req = v1::ReclaimOrphansRequest {
            context: None,
            keep: keep.iter().map(Into::into).collect(),
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        Ok(usize::try_from(answer.stopped).unwrap_or(usize::MAX))
    }

    async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
        auth: Option<&str>,
    ) -> Result<AgentInfo, AgentCallError> {
        let req = v1::InitAgentRequest {
            context: None,
            handle: wire(handle),
            init: Some(init.into()),
            auth: auth.map(str::to_string),
        };
        let answer = self
            .call(req, self.quick())
            .await
            .map_err(|e| e.into_agent_call(&self.base))?;
        answer.info.map(AgentInfo::from).ok_or_else(|| {
            AgentCallError::Reach(
                self.answer_err("InitAgent", ConvertError::MissingField { field: "info" }),
            )
        })
    }

    async fn agent_info(&self, handle: &DriverHandle) -> Result<AgentInfo, AgentCallError> {
        let req = v1::AgentInfoRequest {
            context: None,
            handle: wire(handle),
        };
        let answer = self
            .call(req, self.quick())
            .await
            .map_err(|e| e.into_agent_call(&self.base))?;
        answer.info.map(AgentInfo::from).ok_or_else(|| {
            AgentCallError::Reach(
                self.answer_err("AgentInfo", ConvertError::MissingField { field: "info" }),
            )
        })
    }

    async fn reachable(&self, handle: &DriverHandle) -> bool {
        let req = v1::ReachableRequest {
            context: None,
            handle: wire(handle),
        };
        match self.call(req, self.quick()).await {
            Ok(answer) => answer.reachable,
            Err(e) => {
                self.log("Reachable", &self.driver_err(e));
                false
            }
        }
    }

    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        let req = v1::CheckpointRequest {
            context: None,
            handle: wire(handle),
            dir: self.wire_path(dir)?,
            options: Some((&opts).into()),
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        self.local_checkpoint("Checkpoint", answer.info)
    }

    async fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        let asked = async {
            let req = v1::CheckpointInfoRequest {
                context: None,
                dir: self.wire_path(dir)?,
            };
            let answer = self
                .call(req, self.quick())
                .await
                .map_err(|e| self.driver_err(e))?;
            match answer.info {
                Some(info) => self
                    .local_checkpoint("CheckpointInfo", Some(info))
                    .map(Some),
                None => Ok(None),
            }
        };
        asked.await.unwrap_or_else(|e| {
            self.log("CheckpointInfo", &e);
            None
        })
    }

    async fn remove_checkpoint(&self, dir: &Path) {
        let asked = async {
            let req = v1::RemoveCheckpointRequest {
                context: None,
                dir: self.wire_path(dir)?,
            };
            self.call(req, self.slow())
                .await
                .map_err(|e| self.driver_err(e))
        };
        if let Err(e) = asked.await {
            // A leftover directory wastes space on the node but breaks nothing.
            self.log("RemoveCheckpoint", &e);
        }
    }

    async fn copy_checkpoint(&self, from: &Path, to: &Path) -> Result<CheckpointInfo, DriverError> {
        let req = v1::CopyCheckpointRequest {
            context: None,
            from: self.wire_path(from)?,
            to: self.wire_path(to)?,
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        self.local_checkpoint("CopyCheckpoint", answer.info)
    }

    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        let req = v1::RestoreRequest {
            context: None,
            spec: Some(self.wire_spec(spec)?),
            dir: self.wire_path(dir)?,
            options: Some((&opts).into()),
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        self.answered_handle("Restore", answer.handle)
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        let of = match of {
            ChangeSource::Checkpoint(dir) => {
                ChangeSource::Checkpoint(self.paths.to_wire(dir).map_err(|e| self.local_err(e))?)
            }
            running => running.clone(),
        };
        let since = match since {
            Some(dir) => Some(self.wire_path(dir)?),
            None => None,
        };
        let req = v1::ChangesRequest {
            context: None,
            of: Some(v1::ChangeSource::try_from(&of).map_err(|e| self.answer_err("(request)", e))?),
            since,
        };
        let answer = self
            .call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        answer
            .changes
            .into_iter()
            .map(FileChange::try_from)
            .collect::<Result<_, _>>()
            .map_err(|e| self.answer_err("Changes", e))
    }

    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        let req = v1::ExportChangesRequest {
            context: None,
            handle: wire(handle),
            dest: self.wire_path(dest)?,
        };
        self.call(req, self.slow())
            .await
            .map_err(|e| self.driver_err(e))?;
        Ok(())
    }

    async fn attach_network(
        &self,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        let req = v1::AttachNetworkRequest {
            context: None,
            sandbox_id: sandbox_id.to_string(),
            handle: wire(handle),
            policy: Some((&policy).into()),
        };
        self.call(req, self.quick())
            .await
            .map_err(|e| e.into_network(&self.base))?;
        Ok(())
    }

    async fn set_network_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        let req = v1::SetNetworkPolicyRequest {
            context: None,
            sandbox_id: sandbox_id.to_string(),
            policy: Some((&policy).into()),
        };
        self.call(req, self.quick())
            .await
            .map_err(|e| e.into_network(&self.base))?;
        Ok(())
    }

    async fn detach_network(&self, sandbox_id: &str) {
        let req = v1::DetachNetworkRequest {
            context: None,
            sandbox_id: sandbox_id.to_string(),
        };
        if let Err(e) = self.call(req, self.quick()).await {
            self.log("DetachNetwork", &self.driver_err(e));
        }
    }

    async fn flush_audit(&self) {
        let req = v1::FlushAuditRequest { context: None };
        if let Err(e) = self.call(req, self.quick()).await {
            self.log("FlushAudit", &self.driver_err(e));
        }
    }

    /// Not retried on a lost answer (see node.proto: the member taken would be lost twice).
    async fn pool_take(&self, template: &str) -> Option<DriverHandle> {
        let req = v1::PoolTakeRequest {
            context: None,
            template: template.to_string(),
        };
        let answer = match self.call(req, self.quick()).await {
            Ok(answer) => answer,
            Err(e) => {
                self.log("PoolTake", &self.driver_err(e));
                return None;
            }
        };
        let mut stock = self.stock();
        match answer.handle {
            Some(h) => {
                if let Some(n) = stock.get_mut(template) {
                    *n = n.saturating_sub(1);
                }
                drop(stock);
                self.handles("PoolTake", vec![h]).pop()
            }
            None => {
                // The node's pool is empty, whatever this client counted.
                stock.remove(template);
                None
            }
        }
    }

    async fn pool_put(&self, template: &str, handle: DriverHandle) {
        let req = v1::PoolPutRequest {
            context: None,
            template: template.to_string(),
            handle: wire(&handle),
        };
        match self.call(req, self.quick()).await {
            Ok(_) => *self.stock().entry(template.to_string()).or_default() += 1,
            // The member keeps running unpooled until the node's next orphan reclaim.
            Err(e) => self.log("PoolPut", &self.driver_err(e)),
        }
    }

    async fn pool_take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle> {
        let req = v1::PoolTakeSurplusRequest {
            context: None,
            template: template.to_string(),
            n: n as u64,
        };
        match self.call(req, self.quick()).await {
            Ok(answer) => {
                if let Some(left) = self.stock().get_mut(template) {
                    *left = left.saturating_sub(answer.handles.len());
                }
                self.handles("PoolTakeSurplus", answer.handles)
            }
            Err(e) => {
                self.log("PoolTakeSurplus", &self.driver_err(e));
                Vec::new()
            }
        }
    }

    async fn pool_drain(&self, template: Option<&str>) -> Vec<DriverHandle> {
        let req = v1::PoolDrainRequest {
            context: None,
            template: template.map(str::to_string),
        };
        match self.call(req, self.quick()).await {
            Ok(answer) => {
                let mut stock = self.stock();
                match template {
                    Some(t) => {
                        stock.remove(t);
                    }
                    None => stock.clear(),
                }
                drop(stock);
                self.handles("PoolDrain", answer.handles)
            }
            Err(e) => {
                self.log("PoolDrain", &self.driver_err(e));
                Vec::new()
            }
        }
    }

    /// This client's count (see the module docs); asks nothing.
    fn pool_stock(&self) -> BTreeMap<String, usize> {
        self.stock()
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| (t.clone(), *n))
            .collect()
    }

    async fn pool_members(&self) -> Vec<DriverHandle> {
        match self
            .call(v1::PoolMembersRequest::default(), self.quick())
            .await
        {
            Ok(answer) => self.handles("PoolMembers", answer.handles),
            Err(e) => {
                self.log("PoolMembers", &self.driver_err(e));
                Vec::new()
            }
        }
    }
}
