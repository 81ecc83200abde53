//! The [`RemoteNode`] value: its settings, its connection pool, the node's `Info` it caches per
//! epoch and the pool stock it keeps; connecting and refreshing them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use bulkhead_engine::driver::{Capabilities, DriverHandle};
use bulkhead_node_proto::v1;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::error::RemoteError;
use super::paths::PathMap;

/// Driver names a node is asked whether it owns, besides its own (a node running several
/// drivers, one per template, owns the handles of each).
const KNOWN_DRIVERS: &[&str] = &["jail", "microvm", "fake"];

/// Deadlines and pool settings of a [`RemoteNode`].
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// A call that answers at once (Info, Usage, pool and network calls, the agent's routes).
    pub call_timeout: Duration,
    /// A call that does the node's heavy work: Start, Restore, Checkpoint, Changes,
    /// ExportChanges, Stop, ReclaimOrphans.
    pub slow_call_timeout: Duration,
    /// How long one `Wait` poll asks the node to hold (the node may cap it); the poll's
    /// deadline is this plus `call_timeout`.
    pub wait_poll: Duration,
    /// Opening a TCP connection to the node.
    pub connect_timeout: Duration,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Duration,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            call_timeout: Duration::from_secs(30),
            slow_call_timeout: Duration::from_secs(600),
            wait_poll: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            pool_idle_timeout: Duration::from_secs(90),
        }
    }
}

/// What a node said about itself in `Info` (constant while it runs: one per epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub node_id: String,
    pub epoch: u64,
    pub protocol_version: u32,
    pub driver_name: String,
    pub capabilities: Capabilities,
    pub has_egress: bool,
    pub checkpoint_key: Option<String>,
    /// The driver names whose handles the node owns.
    pub owned_drivers: BTreeSet<String>,
}

/// A node reached over HTTP (see the module docs).
pub struct RemoteNode {
    /// `http://host:port`, without a trailing slash.
    pub(super) base: String,
    /// `Bearer <token>`.
    pub(super) auth: http::HeaderValue,
    pub(super) client: Client<HttpConnector, Full<Bytes>>,
    pub(super) paths: PathMap,
    pub(super) cfg: RemoteConfig,
    info: RwLock<Arc<NodeInfo>>,
    stock: Mutex<BTreeMap<String, usize>>,
}

impl RemoteNode {
    /// Connects to the node at `url` (`http://host:port`) with its `token`, and reads its Info
    /// and pool stock, with the default [`RemoteConfig`].
    pub async fn connect(
        url: &str,
        token: &str,
        paths: PathMap,
    ) -> Result<RemoteNode, RemoteError> {
        RemoteNode::connect_with(url, token, paths, RemoteConfig::default()).await
    }

    pub async fn connect_with(
        url: &str,
        token: &str,
        paths: PathMap,
        cfg: RemoteConfig,
    ) -> Result<RemoteNode, RemoteError> {
        let base = url.trim_end_matches('/').to_string();
        let uri: http::Uri = base
            .parse()
            .map_err(|_| RemoteError::BadUrl { url: url.into() })?;
        let plain = uri.scheme_str() == Some("http")
            && uri.authority().is_some()
            && matches!(uri.path(), "" | "/")
            && uri.query().is_none();
        if !plain {
            return Err(RemoteError::BadUrl { url: url.into() });
        }
        let mut auth = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| RemoteError::BadToken)?;
        auth.set_sensitive(true);
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .build(connector);
        let node = RemoteNode {
            base,
            auth,
            client,
            paths,
            cfg,
            info: RwLock::new(Arc::new(NodeInfo {
                node_id: String::new(),
                epoch: 0,
                protocol_version: 0,
                driver_name: String::new(),
                capabilities: Capabilities::default(),
                has_egress: false,
                checkpoint_key: None,
                owned_drivers: BTreeSet::new(),
            })),
            stock: Mutex::new(BTreeMap::new()),
        };
        node.refresh().await?;
        Ok(node)
    }

    /// Reads the node's Info and pool stock again: the sync getters and `pool_stock` answer
    /// from what this read (call it after a heartbeat noticed a new epoch, or to see what other
    /// callers did to the pools).
    pub async fn refresh(&self) -> Result<(), RemoteError> {
        self.refresh_info().await?;
        let stock = self
            .call(v1::PoolStockRequest::default(), self.cfg.call_timeout)
            .await
            .map_err(|e| e.into_remote(&self.base))?;
        *self.stock.lock().unwrap_or_else(PoisonError::into_inner) = stock
            .stock
            .into_iter()
            .map(|(template, n)| (template, usize::try_from(n).unwrap_or(usize::MAX)))
            .collect();
        Ok(())
    }

    /// Reads Info (any epoch is answered) and which drivers' handles the node owns.
    pub(crate) async fn refresh_info(&self) -> Result<(), RemoteError> {
        let timeout = self.cfg.call_timeout;
        let info = self
            .send(v1::InfoRequest::default(), 0, timeout)
            .await
            .map_err(|e| e.into_remote(&self.base))?;
        let capabilities = info
            .capabilities
            .ok_or(bulkhead_node_proto::ConvertError::MissingField {
                field: "InfoResponse.capabilities",
            })
            .and_then(Capabilities::try_from)
            .map_err(|e| RemoteError::Decode {
                node: self.base.clone(),
                method: "Info",
                source: e.into(),
            })?;
        let mut owned = BTreeSet::from([info.driver_name.clone()]);
        for name in KNOWN_DRIVERS.iter().filter(|n| **n != info.driver_name) {
            let probe = DriverHandle::new(*name, 0, 0, 0, serde_json::Value::Null);
            let req = v1::OwnsRequest {
                context: None,
                handle: Some((&probe).into()),
            };
            let answer = self
                .send(req, info.epoch, timeout)
                .await
                .map_err(|e| e.into_remote(&self.base))?;
            if answer.owned {
                owned.insert(name.to_string());
            }
        }
        let fresh = NodeInfo {
            node_id: info.node_id,
            epoch: info.epoch,
            protocol_version: info.protocol_version,
            driver_name: info.driver_name,
            capabilities,
            has_egress: info.has_egress,
            checkpoint_key: info.checkpoint_key,
            owned_drivers: owned,
        };
        *self.info.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }

    /// The node's Info as last read.
    pub fn info(&self) -> Arc<NodeInfo> {
        self.info
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The base URL calls go to.
    pub fn url(&self) -> &str {
        &self.base
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.info().epoch
    }

    pub(super) fn stock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, usize>> {
        self.stock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
