//! The node's part of sandbox networking: the egress proxy (installed once at startup; without
//! it no sandbox may have network access) and its audit sink.

use std::sync::{Arc, OnceLock};

use crate::error::NetworkError;
use crate::node::driver::{Driver, DriverHandle};
use crate::node::network::{EgressControl, StoreAuditSink};

#[derive(Default)]
pub(crate) struct Links {
    egress: OnceLock<Arc<dyn EgressControl>>,
    audit: OnceLock<Arc<StoreAuditSink>>,
}

impl Links {
    pub(crate) fn install(
        &self,
        egress: Arc<dyn EgressControl>,
        audit: Option<Arc<StoreAuditSink>>,
    ) {
        let _ = self.egress.set(egress);
        if let Some(a) = audit {
            let _ = self.audit.set(a);
        }
    }

    pub(crate) fn has_egress(&self) -> bool {
        self.egress.get().is_some()
    }

    fn egress(&self) -> Result<&Arc<dyn EgressControl>, NetworkError> {
        self.egress.get().ok_or(NetworkError::NoProxy)
    }

    /// Open the sandbox's link through its driver and hand it to the proxy.
    pub(crate) async fn attach(
        &self,
        driver: &dyn Driver,
        sandbox_id: &str,
        handle: &DriverHandle,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        let egress = self.egress()?;
        let tun = driver
            .open_network(handle)
            .await
            .map_err(NetworkError::Link)?;
        egress
            .attach(sandbox_id, tun, policy)
            .map_err(NetworkError::Proxy)?;
        tracing::info!(sandbox = %sandbox_id, "network link attached");
        Ok(())
    }

    pub(crate) fn set_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), NetworkError> {
        self.egress()?
            .set_policy(sandbox_id, policy)
            .map_err(NetworkError::Proxy)
    }

    pub(crate) fn detach(&self, sandbox_id: &str) {
        if let Some(e) = self.egress.get() {
            e.detach(sandbox_id);
        }
    }

    pub(crate) async fn flush_audit(&self) {
        if let Some(a) = self.audit.get() {
            a.flush().await;
        }
    }
}
