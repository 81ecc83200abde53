//! `bulkhead serve`'s network flags (kept apart from serve.rs, which other features edit too);
//! the egress proxy they configure is started by `bulkhead_server`.

use std::path::PathBuf;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkDefault {
    Deny,
    Allow,
}

#[derive(clap::Args, Debug, Clone)]
pub struct NetworkArgs {
    /// Internet access of sandboxes whose create request does not set `allow_internet_access`.
    /// `deny`: no network unless the request allows it (allowOut or allow_internet_access).
    #[arg(
        long,
        env = "BULKHEAD_NETWORK_DEFAULT",
        value_enum,
        default_value = "deny"
    )]
    pub network_default: NetworkDefault,
    /// DANGEROUS: let sandbox policies reach loopback, private (RFC 1918, fc00::/7), link-local,
    /// CGNAT, cloud-metadata and this host's own addresses when a policy allows them. Without it
    /// those are always denied, whatever the policy says.
    #[arg(long, env = "BULKHEAD_EGRESS_ALLOW_PRIVATE")]
    pub egress_allow_private: bool,
    /// PEM bundle added to every sandbox's trust store, e.g. /etc/ssl/certs/ca-certificates.crt
    /// on hosts whose outbound TLS is re-signed by an inspecting proxy.
    #[arg(long, env = "BULKHEAD_SANDBOX_CA_BUNDLE", value_name = "PEM")]
    pub sandbox_ca_bundle: Option<PathBuf>,
    /// Extra PEM roots the egress proxy trusts when it connects upstream for header injection
    /// (besides the host's trust store); repeatable.
    #[arg(long, env = "BULKHEAD_EGRESS_UPSTREAM_CA", value_name = "PEM")]
    pub egress_upstream_ca: Vec<PathBuf>,
    /// TEST ONLY: resolve NAME to IP in the egress proxy instead of DNS (points test domains at
    /// local test servers). Never use in production: it bypasses real name resolution.
    #[arg(long, hide = true, value_name = "NAME=IP")]
    pub egress_resolve: Vec<String>,
}
