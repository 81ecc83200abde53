//! The handler of each RPC: the request's messages become the engine's types (paths resolved
//! under the node's data directory), the node runs the method, its answer (paths made relative
//! again) or its error (as the `NodeError` detail) goes back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bulkhead_engine::driver::{
    ChangeSource, CheckpointInfo, CheckpointOptions, DriverError, DriverHandle, RestoreOptions,
    SandboxSpec,
};
use bulkhead_node_proto::convert::driver::handle as handle_of;
use bulkhead_node_proto::{ConvertError, PROTOCOL_VERSION, v1};

use super::request::RequestError;
use super::shared::Shared;
use crate::errors::{agent_call_detail, network_detail};

/// A handler's result: its answer, or the detail of its failure (boxed: it is large).
type Answer<T> = Result<T, Box<v1::NodeError>>;

fn driver(e: DriverError) -> Box<v1::NodeError> {
    Box::new(v1::NodeError::from(&e))
}

fn required<T>(value: Option<T>, field: &'static str) -> Answer<T> {
    value.ok_or_else(|| RequestError::from(ConvertError::MissingField { field }).into())
}

fn handle(value: Option<v1::DriverHandle>, field: &'static str) -> Answer<DriverHandle> {
    handle_of(value, field).map_err(|e| RequestError::from(e).into())
}

fn resolve(s: &Shared, wire: &Path, field: &'static str) -> Answer<PathBuf> {
    s.data
        .resolve(wire)
        .map_err(|source| RequestError::Path { field, source }.into())
}

/// A path under the checkpoints tree of the data directory: the only one a caller may delete or
/// copy into.
fn checkpoint_path(s: &Shared, wire: &Path, field: &'static str) -> Answer<PathBuf> {
    let under = wire
        .components()
        .next()
        .is_some_and(|c| c.as_os_str() == "checkpoints")
        && wire.components().count() > 1;
    if !under {
        return Err(RequestError::NotCheckpoint { field }.into());
    }
    resolve(s, wire, field)
}

/// A spec with its rootfs and volumes resolved under the data directory.
fn spec(s: &Shared, value: Option<v1::SandboxSpec>) -> Answer<SandboxSpec> {
    let mut spec = SandboxSpec::try_from(required(value, "spec")?).map_err(RequestError::from)?;
    spec.rootfs = resolve(s, &spec.rootfs, "SandboxSpec.rootfs")?;
    for volume in &mut spec.volumes {
        volume.host_dir = resolve(s, &volume.host_dir, "VolumeMount.host_dir")?;
    }
    Ok(spec)
}

/// The wire form of a checkpoint the node wrote: its directory relative to the data directory.
fn checkpoint_out(s: &Shared, mut info: CheckpointInfo) -> Result<v1::CheckpointInfo, DriverError> {
    let outside = |e: Box<dyn std::error::Error + Send + Sync>| {
        DriverError::io(
            "The driver wrote the checkpoint outside the node's data directory",
            std::io::Error::other(e),
        )
    };
    info.dir = s.data.relative(&info.dir).map_err(|e| outside(e.into()))?;
    v1::CheckpointInfo::try_from(&info).map_err(|e| outside(e.into()))
}

fn handles(list: Vec<DriverHandle>) -> Vec<v1::DriverHandle> {
    list.iter().map(v1::DriverHandle::from).collect()
}

pub(crate) async fn info(s: Arc<Shared>, _: v1::InfoRequest) -> Answer<v1::InfoResponse> {
    Ok(v1::InfoResponse {
        node_id: s.node_id.clone(),
        epoch: s.epoch.load(Ordering::SeqCst),
        protocol_version: PROTOCOL_VERSION,
        driver_name: s.node.driver_name(),
        capabilities: Some((&s.node.capabilities()).into()),
        has_egress: s.node.has_egress(),
        checkpoint_key: s.node.checkpoint_key(),
    })
}

pub(crate) async fn owns(s: Arc<Shared>, r: v1::OwnsRequest) -> Answer<v1::OwnsResponse> {
    let h = handle(r.handle, "handle")?;
    Ok(v1::OwnsResponse {
        owned: s.node.owns(&h),
    })
}

pub(crate) async fn start(s: Arc<Shared>, r: v1::StartRequest) -> Answer<v1::StartResponse> {
    let spec = spec(&s, r.spec)?;
    let h = s.node.start(&spec, r.warm).await.map_err(driver)?;
    Ok(v1::StartResponse {
        handle: Some((&h).into()),
    })
}

pub(crate) async fn claimed(s: Arc<Shared>, r: v1::ClaimedRequest) -> Answer<v1::ClaimedResponse> {
    let h = handle(r.handle, "handle")?;
    s.node.claimed(&h).await.map_err(driver)?;
    Ok(v1::ClaimedResponse {})
}

pub(crate) async fn stop(s: Arc<Shared>, r: v1::StopRequest) -> Answer<v1::StopResponse> {
    let h = handle(r.handle, "handle")?;
    s.node.stop(&h).await.map_err(driver)?;
    Ok(v1::StopResponse {})
}

/// Held until the sandbox dies or `timeout_ms` (capped at the server's `max_wait`; 0 is the
/// cap) passes.
pub(crate) async fn wait(s: Arc<Shared>, r: v1::WaitRequest) -> Answer<v1::WaitResponse> {
    let h = handle(r.handle, "handle")?;
    let asked = Duration::from_millis(u64::from(r.timeout_ms));
    let hold = if asked.is_zero() {
        s.max_wait
    } else {
        asked.min(s.max_wait)
    };
    let exited = tokio::time::timeout(hold, s.node.wait(&h)).await.is_ok();
    Ok(v1::WaitResponse { exited })
}

pub(crate) async fn adopt(s: Arc<Shared>, r: v1::AdoptRequest) -> Answer<v1::AdoptResponse> {
    let h = handle(r.handle, "handle")?;
    Ok(v1::AdoptResponse {
        adopted: s.node.adopt(&h).await,
    })
}

pub(crate) async fn usage(s: Arc<Shared>, r: v1::UsageRequest) -> Answer<v1::UsageResponse> {
    let h = handle(r.handle, "handle")?;
    let usage = s.node.usage(&h).await.map_err(driver)?;
    Ok(v1::UsageResponse {
        usage: Some((&usage).into()),
    })
}

pub(crate) async fn thaw(s: Arc<Shared>, r: v1::ThawRequest) -> Answer<v1::ThawResponse> {
    let h = handle(r.handle, "handle")?;
    s.node.thaw(&h).await.map_err(driver)?;
    Ok(v1::ThawResponse {})
}

pub(crate) async fn reclaim_orphans(
    s: Arc<Shared>,
    r: v1::ReclaimOrphansRequest,
) -> Answer<v1::ReclaimOrphansResponse> {
    let keep = r
        .keep
        .into_iter()
        .map(|h| handle(Some(h), "keep"))
        .collect::<Answer<Vec<_>>>()?;
    let stopped = s.node.reclaim_orphans(&keep).await.map_err(driver)?;
    Ok(v1::ReclaimOrphansResponse {
        stopped: stopped as u64,
    })
}

pub(crate) async fn init_agent(
    s: Arc<Shared>,
    r: v1::InitAgentRequest,
) -> Answer<v1::InitAgentResponse> {
    let h = handle(r.handle, "handle")?;
    let init = required(r.init, "init")?.into();
    let info = s
        .node
        .init_agent(&h, &init, r.auth.as_deref())
        .await
        .map_err(|e| Box::new(agent_call_detail(&e)))?;
    Ok(v1::InitAgentResponse {
        info: Some((&info).into()),
    })
}

pub(crate) async fn agent_info(
    s: Arc<Shared>,
    r: v1::AgentInfoRequest,
) -> Answer<v1::AgentInfoResponse> {
    let h = handle(r.handle, "handle")?;
    let info = s
        .node
        .agent_info(&h)
        .await
        .map_err(|e| Box::new(agent_call_detail(&e)))?;
    Ok(v1::AgentInfoResponse {
        info: Some((&info).into()),
    })
}

pub(crate) async fn reachable(
    s: Arc<Shared>,
    r: v1::ReachableRequest,
) -> Answer<v1::ReachableResponse> {
    let h = handle(r.handle, "handle")?;
    Ok(v1::ReachableResponse {
        reachable: s.node.reachable(&h).await,
    })
}

pub(crate) async fn checkpoint(
    s: Arc<Shared>,
    r: v1::CheckpointRequest,
) -> Answer<v1::CheckpointResponse> {
    let h = handle(r.handle, "handle")?;
    let dir = resolve(&s, Path::new(&r.dir), "dir")?;
    let opts = r.options.map(CheckpointOptions::from).unwrap_or_default();
    let info = s.node.checkpoint(&h, &dir, opts).await.map_err(driver)?;
    Ok(v1::CheckpointResponse {
        info: Some(checkpoint_out(&s, info).map_err(driver)?),
    })
}

pub(crate) async fn checkpoint_info(
    s: Arc<Shared>,
    r: v1::CheckpointInfoRequest,
) -> Answer<v1::CheckpointInfoResponse> {
    let dir = resolve(&s, Path::new(&r.dir), "dir")?;
    let info = match s.node.checkpoint_info(&dir).await {
        Some(info) => Some(checkpoint_out(&s, info).map_err(driver)?),
        None => None,
    };
    Ok(v1::CheckpointInfoResponse { info })
}

pub(crate) async fn remove_checkpoint(
    s: Arc<Shared>,
    r: v1::RemoveCheckpointRequest,
) -> Answer<v1::RemoveCheckpointResponse> {
    let dir = checkpoint_path(&s, Path::new(&r.dir), "dir")?;
    s.node.remove_checkpoint(&dir).await;
    Ok(v1::RemoveCheckpointResponse {})
}

pub(crate) async fn copy_checkpoint(
    s: Arc<Shared>,
    r: v1::CopyCheckpointRequest,
) -> Answer<v1::CopyCheckpointResponse> {
    let from = resolve(&s, Path::new(&r.from), "from")?;
    let to = checkpoint_path(&s, Path::new(&r.to), "to")?;
    let info = s.node.copy_checkpoint(&from, &to).await.map_err(driver)?;
    Ok(v1::CopyCheckpointResponse {
        info: Some(checkpoint_out(&s, info).map_err(driver)?),
    })
}

pub(crate) async fn restore(s: Arc<Shared>, r: v1::RestoreRequest) -> Answer<v1::RestoreResponse> {
    let spec = spec(&s, r.spec)?;
    let dir = resolve(&s, Path::new(&r.dir), "dir")?;
    let opts = r.options.map(RestoreOptions::from).unwrap_or_default();
    let h = s.node.restore(&spec, &dir, opts).await.map_err(driver)?;
    Ok(v1::RestoreResponse {
        handle: Some((&h).into()),
    })
}

pub(crate) async fn changes(s: Arc<Shared>, r: v1::ChangesRequest) -> Answer<v1::ChangesResponse> {
    let of = match ChangeSource::try_from(required(r.of, "of")?).map_err(RequestError::from)? {
        ChangeSource::Checkpoint(dir) => {
            ChangeSource::Checkpoint(resolve(&s, &dir, "ChangeSource.checkpoint")?)
        }
        running => running,
    };
    let since = match &r.since {
        Some(dir) => Some(resolve(&s, Path::new(dir), "since")?),
        None => None,
    };
    let changes = s
        .node
        .changes(&of, since.as_deref())
        .await
        .map_err(driver)?;
    Ok(v1::ChangesResponse {
        changes: changes.iter().map(Into::into).collect(),
    })
}

pub(crate) async fn export_changes(
    s: Arc<Shared>,
    r: v1::ExportChangesRequest,
) -> Answer<v1::ExportChangesResponse> {
    let h = handle(r.handle, "handle")?;
    let dest = resolve(&s, Path::new(&r.dest), "dest")?;
    s.node.export_changes(&h, &dest).await.map_err(driver)?;
    Ok(v1::ExportChangesResponse {})
}

pub(crate) async fn attach_network(
    s: Arc<Shared>,
    r: v1::AttachNetworkRequest,
) -> Answer<v1::AttachNetworkResponse> {
    let h = handle(r.handle, "handle")?;
    let policy = required(r.policy, "policy")?.into();
    s.node
        .attach_network(&r.sandbox_id, &h, policy)
        .await
        .map_err(|e| Box::new(network_detail(&e)))?;
    Ok(v1::AttachNetworkResponse {})
}

pub(crate) async fn set_network_policy(
    s: Arc<Shared>,
    r: v1::SetNetworkPolicyRequest,
) -> Answer<v1::SetNetworkPolicyResponse> {
    let policy = required(r.policy, "policy")?.into();
    s.node
        .set_network_policy(&r.sandbox_id, policy)
        .await
        .map_err(|e| Box::new(network_detail(&e)))?;
    Ok(v1::SetNetworkPolicyResponse {})
}

pub(crate) async fn detach_network(
    s: Arc<Shared>,
    r: v1::DetachNetworkRequest,
) -> Answer<v1::DetachNetworkResponse> {
    s.node.detach_network(&r.sandbox_id).await;
    Ok(v1::DetachNetworkResponse {})
}

pub(crate) async fn flush_audit(
    s: Arc<Shared>,
    _: v1::FlushAuditRequest,
) -> Answer<v1::FlushAuditResponse> {
    s.node.flush_audit().await;
    Ok(v1::FlushAuditResponse {})
}

pub(crate) async fn pool_take(
    s: Arc<Shared>,
    r: v1::PoolTakeRequest,
) -> Answer<v1::PoolTakeResponse> {
    let h = s.node.pool_take(&r.template).await;
    Ok(v1::PoolTakeResponse {
        handle: h.as_ref().map(Into::into),
    })
}

pub(crate) async fn pool_put(s: Arc<Shared>, r: v1::PoolPutRequest) -> Answer<v1::PoolPutResponse> {
    let h = handle(r.handle, "handle")?;
    s.node.pool_put(&r.template, h).await;
    Ok(v1::PoolPutResponse {})
}

pub(crate) async fn pool_take_surplus(
    s: Arc<Shared>,
    r: v1::PoolTakeSurplusRequest,
) -> Answer<v1::PoolTakeSurplusResponse> {
    let n = usize::try_from(r.n).unwrap_or(usize::MAX);
    let taken = s.node.pool_take_surplus(&r.template, n).await;
    Ok(v1::PoolTakeSurplusResponse {
        handles: handles(taken),
    })
}

pub(crate) async fn pool_drain(
    s: Arc<Shared>,
    r: v1::PoolDrainRequest,
) -> Answer<v1::PoolDrainResponse> {
    let drained = s.node.pool_drain(r.template.as_deref()).await;
    Ok(v1::PoolDrainResponse {
        handles: handles(drained),
    })
}

pub(crate) async fn pool_stock(
    s: Arc<Shared>,
    _: v1::PoolStockRequest,
) -> Answer<v1::PoolStockResponse> {
    let stock: BTreeMap<String, u64> = s
        .node
        .pool_stock()
        .into_iter()
        .map(|(template, n)| (template, n as u64))
        .collect();
    Ok(v1::PoolStockResponse { stock })
}

pub(crate) async fn pool_members(
    s: Arc<Shared>,
    _: v1::PoolMembersRequest,
) -> Answer<v1::PoolMembersResponse> {
    Ok(v1::PoolMembersResponse {
        handles: handles(s.node.pool_members().await),
    })
}
