//! Host-side egress for sandboxes: a TUN link inside the sandbox's network namespace whose only
//! peer is a userspace TCP/IP stack ([`ipstack`]) in this process, a fake-IP DNS responder, and a
//! transparent proxy that decides per connection (domain from DNS/SNI/Host, IPs, CIDRs, a fixed
//! deny set), injects headers with secrets for configured domains (TLS terminated with a
//! per-deployment CA), and records one [`AuditEvent`] per decision.
//!
//! Packets from the sandbox never reach the host kernel's routing or netfilter: the proxy is the
//! only reachable peer by construction. The link itself is the drivers' business
//! (`bulkhead_host::link`): the jail's TUN ([`open_tun_in_netns`]) or a microVM's NIC bridged by
//! [`ethernet_link`], which turns QEMU's stream of Ethernet frames into a TUN-like packet fd;
//! the engine hands either descriptor to [`Egress::attach`].
//!
//! Runtime requirement: `attach` must run inside a **multi-threaded** tokio runtime (ipstack's
//! TCP streams use `block_in_place` when dropped).

mod audit;
#[cfg(feature = "testing")]
pub mod bench;
mod ca;
mod config;
mod conn;
mod denyset;
mod device;
mod dns;
mod error;
mod fakeip;
mod inject;
#[cfg(feature = "testing")]
pub mod netlab;
mod policy;
mod proxy;
mod sandbox;
mod secrets;
mod shared;
mod sniff;
mod stack;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

pub use audit::{AuditEvent, AuditSink};
/// The sandbox's link (created by the drivers, see `bulkhead-host`), re-exported for the
/// engine and this crate's tests.
pub use bulkhead_host::link::{
    GATEWAY_MAC, GUEST_MAC, LinkError, ethernet_link, open_tun_in_netns,
};
pub use config::{
    CONNECT_TIMEOUT, DNS_TTL_SECS, EgressConfig, FAKE_IP_BASE, FAKE_IP_PREFIX_LEN, GATEWAY_ADDR,
    MTU, PREFIX_LEN, SANDBOX_ADDR,
};
pub use denyset::{DenySet, host_addresses};
pub use error::EgressError;
pub use policy::{HeaderRule, NetworkPolicy, PolicyError, Verdict, normalize_name};
pub use secrets::{SecretRefError, SecretSource};

use sandbox::Sandbox;
use shared::Shared;

struct Attached {
    sandbox: Arc<Sandbox>,
    cancel: CancellationToken,
}

pub struct Egress {
    shared: Arc<Shared>,
    attached: Mutex<HashMap<String, Attached>>,
}

impl Egress {
    /// Loads (or creates once) the CA in `state_dir` and the upstream trust store.
    pub fn new(
        cfg: EgressConfig,
        secrets: Arc<dyn SecretSource>,
        audit: Arc<dyn AuditSink>,
    ) -> Result<Arc<Self>, EgressError> {
        Ok(Arc::new(Self {
            shared: Arc::new(Shared::new(cfg, secrets, audit)?),
            attached: Mutex::new(HashMap::new()),
        }))
    }

    /// The per-deployment CA certificate (PEM) to install in sandbox trust stores.
    pub fn ca_cert_pem(&self) -> String {
        self.shared.ca.cert_pem().to_string()
    }

    /// Starts the userspace stack for `sandbox_id` over `tun` (from [`open_tun_in_netns`]) on the
    /// current tokio runtime.
    pub fn attach(
        &self,
        sandbox_id: &str,
        tun: OwnedFd,
        policy: NetworkPolicy,
    ) -> Result<(), EgressError> {
        policy.validate()?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| EgressError::NoRuntime)?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(EgressError::NoRuntime);
        }
        let mut attached = self.attached.lock().expect("egress lock");
        if attached.contains_key(sandbox_id) {
            return Err(EgressError::AlreadyAttached(sandbox_id.to_string()));
        }
        let sandbox = Arc::new(Sandbox::new(sandbox_id, self.shared.clone(), policy));
        let cancel = CancellationToken::new();
        let _guard = handle.enter();
        stack::spawn(sandbox.clone(), tun, cancel.clone())?;
        attached.insert(sandbox_id.to_string(), Attached { sandbox, cancel });
        Ok(())
    }

    /// Replaces the policy; new connections and DNS answers use it at once.
    pub fn set_policy(&self, sandbox_id: &str, policy: NetworkPolicy) -> Result<(), EgressError> {
        policy.validate()?;
        let attached = self.attached.lock().expect("egress lock");
        let a = attached
            .get(sandbox_id)
            .ok_or_else(|| EgressError::NotAttached(sandbox_id.to_string()))?;
        a.sandbox.set_policy(policy);
        Ok(())
    }

    /// The policy currently enforced for `sandbox_id`, if attached.
    pub fn policy(&self, sandbox_id: &str) -> Option<NetworkPolicy> {
        let attached = self.attached.lock().expect("egress lock");
        attached
            .get(sandbox_id)
            .map(|a| a.sandbox.policy().source.clone())
    }

    /// Stops the stack and closes all of the sandbox's connections (and the TUN fd).
    pub fn detach(&self, sandbox_id: &str) {
        let removed = self
            .attached
            .lock()
            .expect("egress lock")
            .remove(sandbox_id);
        if let Some(a) = removed {
            a.cancel.cancel();
        }
    }

    /// Ids of attached sandboxes.
    pub fn attached(&self) -> Vec<String> {
        self.attached
            .lock()
            .expect("egress lock")
            .keys()
            .cloned()
            .collect()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        if let Ok(attached) = self.attached.get_mut() {
            for (_, a) in attached.drain() {
                a.cancel.cancel();
            }
        }
    }
}
