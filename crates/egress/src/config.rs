//! Addresses and limits of the sandbox's network link, and the operator's egress configuration.
//! A leaf: every other module may read these, none of them is needed here.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// The link's addresses: the sandbox's (`SANDBOX_ADDR`) and ours, the gateway and DNS server
/// (`GATEWAY_ADDR`); fixed by the link the drivers create (`bulkhead_host::link`).
pub use bulkhead_host::link::{GATEWAY_ADDR, MTU, PREFIX_LEN, SANDBOX_ADDR};
/// DNS answers for allowed names come from this pool (198.18.0.0/15, per-sandbox mapping).
pub const FAKE_IP_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
pub const FAKE_IP_PREFIX_LEN: u8 = 15;
/// TTL of fake-IP answers: short, so policy changes are picked up by resolvers quickly.
pub const DNS_TTL_SECS: u32 = 5;
/// Upper bound on connecting to an upstream.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Default)]
pub struct EgressConfig {
    /// Where the CA lives (`ca.pem` 0644, `ca.key` 0600); created on first start.
    pub state_dir: PathBuf,
    /// Operator opt-in: let policies reach the fixed deny set (private ranges, loopback, host).
    pub allow_private: bool,
    /// Name → addresses used instead of real resolution (TEST-ONLY: local test upstreams).
    pub resolve_overrides: HashMap<String, Vec<IpAddr>>,
    /// Extra PEM CA bundles trusted for upstream TLS on injection domains (besides the host store).
    pub upstream_extra_roots: Vec<PathBuf>,
}
