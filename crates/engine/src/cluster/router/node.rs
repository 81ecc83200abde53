//! [`ClusterNode`] as a [`Node`]: each call goes to the member its handle (or checkpoint
//! directory, or sandbox id) names; the calls about no sandbox in particular go to every
//! member and their answers are combined.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use async_trait::async_trait;
use bulkhead_envd::protocol::AgentInfo;
use bulkhead_envd::rest::InitRequest;
use futures::future::join_all;

use super::{ClusterNode, Route, Scope};
use crate::cluster::placement::NodeStatus;
use crate::error::NetworkError;
use crate::node::driver::{
    Capabilities, ChangeSource, CheckpointInfo, CheckpointOptions, DriverError, DriverHandle,
    FileChange, ResourceUsage, RestoreOptions, SandboxSpec,
};
use crate::node::{AgentCallError, Node};

/// `h`, naming the member it came from.
fn tagged(id: &str, mut h: DriverHandle) -> DriverHandle {
    h.node = Some(id.to_string());
    h
}

/// A checkpoint no member holds, as a node answers for a directory it cannot read.
fn no_holder(dir: &Path) -> DriverError {
    DriverError::io(
        format!(
            "No node of the cluster holds the checkpoint {}",
            dir.display()
        ),
        std::io::ErrorKind::NotFound.into(),
    )
}

#[async_trait]
impl Node for ClusterNode {
    fn driver_name(&self) -> String {
        let names: BTreeSet<String> = self
            .members()
            .iter()
            .map(|m| m.node.driver_name())
            .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.into_iter().collect::<Vec<_>>().join("+")
        }
    }

    fn capabilities(&self) -> Capabilities {
        let caps: Vec<Capabilities> = self
            .members()
            .iter()
            .map(|m| m.node.capabilities())
            .collect();
        Capabilities::common(&caps)
    }

    fn has_egress(&self) -> bool {
        let members = self.members();
        !members.is_empty() && members.iter().all(|m| m.node.has_egress())
    }

    fn checkpoint_key(&self) -> Option<String> {
        let members = self.members();
        let mut keys = members.iter().map(|m| m.node.checkpoint_key());
        let first = keys.next()??;
        keys.all(|k| k.as_deref() == Some(first.as_str()))
            .then_some(first)
    }

    fn owns(&self, handle: &DriverHandle) -> bool {
        self.route(handle).is_ok_and(|r| r.node.owns(handle))
    }

    async fn start(&self, spec: &SandboxSpec, warm: bool) -> Result<DriverHandle, DriverError> {
        let req = Self::request(spec);
        let scope = if warm { Scope::Pool } else { Scope::Any };
        self.place(
            &req,
            scope,
            |node| async move { node.start(spec, warm).await },
        )
        .await
    }

    async fn claimed(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.route(handle)?.node.claimed(handle).await
    }

    async fn stop(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        // Idempotent, as a node's: a sandbox of no member is already gone.
        let Ok(route) = self.route(handle) else {
            self.ledger.ended(handle);
            return Ok(());
        };
        route.node.stop(handle).await?;
        self.ledger.ended(handle);
        Ok(())
    }

    async fn wait(&self, handle: &DriverHandle) {
        if let Ok(route) = self.route(handle) {
            route.node.wait(handle).await;
        }
        self.ledger.ended(handle);
    }

    async fn adopt(&self, handle: &DriverHandle) -> bool {
        // What an adopted sandbox was promised is not in its handle: a directory of capacity
        // only does not count it (a node's own report does).
        match self.route(handle) {
            Ok(route) => route.node.adopt(handle).await,
            Err(_) => false,
        }
    }

    async fn usage(&self, handle: &DriverHandle) -> Result<ResourceUsage, DriverError> {
        self.route(handle)?.node.usage(handle).await
    }

    async fn thaw(&self, handle: &DriverHandle) -> Result<(), DriverError> {
        self.route(handle)?.node.thaw(handle).await
    }

    /// Each member reclaims what is not in `keep` among its own sandboxes (dead members are
    /// skipped). A member that fails is logged and the others' count returned; the error only
    /// when every member asked failed.
    async fn reclaim_orphans(&self, keep: &[DriverHandle]) -> Result<usize, DriverError> {
        let members = self.current().await;
        let asked: Vec<_> = members
            .iter()
            .filter(|m| m.load.status != NodeStatus::Dead)
            .collect();
        let results = join_all(asked.iter().map(|m| {
            let own: Vec<DriverHandle> = keep
                .iter()
                .filter(|h| h.node.as_deref() == Some(m.id.as_str()))
                .cloned()
                .collect();
            async move { m.node.reclaim_orphans(&own).await }
        }))
        .await;
        let (mut reclaimed, mut first_error, mut answered) = (0, None, false);
        for (m, result) in asked.iter().zip(results) {
            match result {
                Ok(n) => {
                    reclaimed += n;
                    answered = true;
                }
                Err(e) => {
                    tracing::warn!(node = %m.id, error = &e as &dyn std::error::Error, "node could not reclaim its leftover sandboxes");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if !answered => Err(e),
            _ => Ok(reclaimed),
        }
    }

    async fn init_agent(
        &self,
        handle: &DriverHandle,
        init: &InitRequest,
        auth: Option<&str>,
    ) -> Result<AgentInfo, AgentCallError> {
        let route = self.route(handle).map_err(AgentCallError::Reach)?;
        route.node.init_agent(handle, init, auth).await
    }

    async fn agent_info(&self, handle: &DriverHandle) -> Result<AgentInfo, AgentCallError> {
        let route = self.route(handle).map_err(AgentCallError::Reach)?;
        route.node.agent_info(handle).await
    }

    async fn reachable(&self, handle: &DriverHandle) -> bool {
        match self.route(handle) {
            Ok(route) => route.node.reachable(handle).await,
            Err(_) => false,
        }
    }

    async fn checkpoint(
        &self,
        handle: &DriverHandle,
        dir: &Path,
        opts: CheckpointOptions,
    ) -> Result<CheckpointInfo, DriverError> {
        let route = self.route(handle)?;
        let info = route.node.checkpoint(handle, dir, opts).await?;
        self.remember_checkpoint(dir, &route.id);
        if !opts.leave_running {
            self.ledger.ended(handle);
        }
        Ok(info)
    }

    async fn checkpoint_info(&self, dir: &Path) -> Option<CheckpointInfo> {
        let route = self.holder(dir).await?;
        let info = route.node.checkpoint_info(dir).await;
        if info.is_none() {
            // It no longer has it (removed): ask again next time.
            self.forget_checkpoint(dir);
        }
        info
    }

    /// On the members holding it or checkpoints under it; when none is remembered (after a
    /// restart), on every member that may hold one.
    async fn remove_checkpoint(&self, dir: &Path) {
        let holders = self.forget_under(dir);
        let targets: Vec<Route> = if holders.is_empty() {
            self.members()
                .iter()
                .filter(|m| m.load.status != NodeStatus::Dead)
                .filter_map(|m| self.route_to(&m.id))
                .collect()
        } else {
            holders.iter().filter_map(|id| self.route_to(id)).collect()
        };
        join_all(targets.iter().map(|r| r.node.remove_checkpoint(dir))).await;
    }

    /// On the member holding `from`, which then holds `to` too.
    async fn copy_checkpoint(&self, from: &Path, to: &Path) -> Result<CheckpointInfo, DriverError> {
        let holder = self.holder(from).await.ok_or_else(|| no_holder(from))?;
        let info = holder.node.copy_checkpoint(from, to).await?;
        self.remember_checkpoint(to, &holder.id);
        Ok(info)
    }

    /// On the member holding the checkpoint, or nowhere (see the module docs).
    async fn restore(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        opts: RestoreOptions,
    ) -> Result<DriverHandle, DriverError> {
        let holder = self.holder(dir).await.ok_or_else(|| no_holder(dir))?;
        let mut req = Self::request(spec);
        // Cross-node resume (the checkpoint moved through object storage to a node with the
        // same kernel, CRIU, CPU features and tree, which is what the key names) is a later
        // issue: only the holder is a candidate, under its own key, and its driver judges
        // whether the checkpoint still restores, as a single node's does.
        req.checkpoint_key = self
            .members()
            .iter()
            .find(|m| m.id == holder.id)
            .and_then(|m| m.load.checkpoint_key.clone());
        req.preferred = Some(holder.id.clone());
        // A consumed checkpoint stays remembered until its removal (the resume's cleanup).
        self.place(&req, Scope::Holder(&holder.id), |node| {
            let opts = opts.clone();
            async move { node.restore(spec, dir, opts).await }
        })
        .await
    }

    async fn changes(
        &self,
        of: &ChangeSource,
        since: Option<&Path>,
    ) -> Result<Vec<FileChange>, DriverError> {
        let route = match of {
            ChangeSource::Running(h) => self.route(h)?,
            ChangeSource::Checkpoint(dir) => {
                self.holder(dir).await.ok_or_else(|| no_holder(dir))?
            }
        };
        route.node.changes(of, since).await
    }

    async fn export_changes(&self, handle: &DriverHandle, dest: &Path) -> Result<(), DriverError> {
        self.route(handle)?
            .node
            .export_changes(handle, dest)
            .await?;
        self.ledger.ended(handle);
        Ok(())
    }

    async fn attach_network(
        &self,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        let route = self.route(handle).map_err(NetworkError::Link)?;
        route
            .node
            .attach_network(sandbox_id, handle, policy)
            .await?;
        self.links
            .lock()
            .expect("links lock")
            .insert(sandbox_id.to_string(), route.id);
        Ok(())
    }

    async fn set_network_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        let known = self
            .links
            .lock()
            .expect("links lock")
            .get(sandbox_id)
            .cloned();
        if let Some(route) = known.and_then(|id| self.route_to(&id)) {
            return route.node.set_network_policy(sandbox_id, policy).await;
        }
        // Not attached through this router (or by a member it no longer lists): the member
        // that has the link accepts, the others refuse.
        let mut first_error = None;
        for m in self.members().iter() {
            match m.node.set_network_policy(sandbox_id, policy.clone()).await {
                Ok(()) => {
                    self.links
                        .lock()
                        .expect("links lock")
                        .insert(sandbox_id.to_string(), m.id.clone());
                    return Ok(());
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or(NetworkError::NoProxy))
    }

    async fn detach_network(&self, sandbox_id: &str) {
        let known = self.links.lock().expect("links lock").remove(sandbox_id);
        match known.and_then(|id| self.route_to(&id)) {
            Some(route) => route.node.detach_network(sandbox_id).await,
            None => {
                join_all(
                    self.members()
                        .iter()
                        .map(|m| m.node.detach_network(sandbox_id)),
                )
                .await;
            }
        }
    }

    async fn flush_audit(&self) {
        join_all(self.members().iter().map(|m| m.node.flush_audit())).await;
    }

    async fn pool_take(&self, template: &str) -> Option<DriverHandle> {
        self.take_warm(template).await
    }

    async fn pool_put(&self, template: &str, handle: DriverHandle) {
        match self.route(&handle) {
            Ok(route) => route.node.pool_put(template, handle).await,
            Err(_) => {
                tracing::warn!(node = ?handle.node, template, "a pool member of no node of the cluster: dropped");
            }
        }
    }

    /// Up to `n`, from the members with the most stock first.
    async fn pool_take_surplus(&self, template: &str, n: usize) -> Vec<DriverHandle> {
        let members = self.members();
        let mut by_stock: Vec<(usize, usize)> = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.node.pool_stock().get(template).copied().unwrap_or(0), i))
            .filter(|(stock, _)| *stock > 0)
            .collect();
        by_stock.sort_by_key(|(stock, _)| std::cmp::Reverse(*stock));
        let mut taken = Vec::new();
        for (_, i) in by_stock {
            if taken.len() >= n {
                break;
            }
            let m = &members[i];
            let got = m.node.pool_take_surplus(template, n - taken.len()).await;
            taken.extend(got.into_iter().map(|h| tagged(&m.id, h)));
        }
        taken
    }

    async fn pool_drain(&self, template: Option<&str>) -> Vec<DriverHandle> {
        let members = self.members();
        let drained = join_all(members.iter().map(|m| m.node.pool_drain(template))).await;
        members
            .iter()
            .zip(drained)
            .flat_map(|(m, hs)| hs.into_iter().map(|h| tagged(&m.id, h)))
            .collect()
    }

    /// The members' own counts, summed.
    fn pool_stock(&self) -> BTreeMap<String, usize> {
        let mut stock = BTreeMap::new();
        for m in self.members().iter() {
            for (t, n) in m.node.pool_stock() {
                *stock.entry(t).or_insert(0) += n;
            }
        }
        stock
    }

    async fn pool_members(&self) -> Vec<DriverHandle> {
        let members = self.members();
        let all = join_all(members.iter().map(|m| m.node.pool_members())).await;
        members
            .iter()
            .zip(all)
            .flat_map(|(m, hs)| hs.into_iter().map(|h| tagged(&m.id, h)))
            .collect()
    }
}
