//! Network policy: the E2B `network` shape (allowOut / denyOut / rules) plus matching and
//! per-connection decisions.
//!
//! Decision order (documented in the contract): the fixed deny set always wins unless the
//! operator opts in (`allow_private`); then an `allow_out` match (domain, IP or CIDR) wins over
//! `deny_out`; then `deny_out`; then `allow_internet`; otherwise the default is deny.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::denyset::{DenySet, canonical_ip};
use crate::secrets::{self, SecretRefError};

/// A sandbox's egress policy. `Default` is "no egress at all".
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NetworkPolicy {
    /// Allow every destination not otherwise denied (E2B `allow_internet_access`).
    #[serde(default)]
    pub allow_internet: bool,
    /// Domains (`example.com`, `*.example.com`), IPs and CIDRs that are allowed; wins over `deny_out`.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Domains, IPs and CIDRs that are denied (`0.0.0.0/0` denies everything not allowed).
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// Host (exact or `*.` wildcard) → header transforms applied by the TLS-terminating proxy.
    #[serde(default)]
    pub rules: BTreeMap<String, Vec<HeaderRule>>,
    /// Whose secrets `${e2b.secrets.NAME}` in `rules` resolve in: the sandbox's team. None: no
    /// secret resolves (a reference is refused like a missing secret).
    #[serde(default)]
    pub secret_scope: Option<String>,
}

/// Header transform for one host. Values may contain secret references (`${e2b.secrets.NAME}`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HeaderRule {
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error(
        "network.{field} entry {entry:?} is not a domain name (example.com or *.example.com), an IP address or a CIDR block (10.0.0.0/8)"
    )]
    InvalidEntry { field: &'static str, entry: String },
    #[error(
        "network.rules key {0:?} is not a domain name: rules apply to host names (example.com or *.example.com)"
    )]
    InvalidRuleHost(String),
    #[error("network.rules[{host:?}] header name {name:?} is not a valid HTTP header name")]
    InvalidHeaderName { host: String, name: String },
    #[error(
        "network.rules[{host:?}] header {name:?} is hop-by-hop or managed by the proxy and cannot be set"
    )]
    ForbiddenHeader { host: String, name: String },
    #[error("network.rules[{host:?}] header {name:?}: {source}")]
    InvalidHeaderValue {
        host: String,
        name: String,
        source: SecretRefError,
    },
    #[error("network.{field} has {count} entries; at most {max} are allowed")]
    TooManyEntries {
        field: &'static str,
        count: usize,
        max: usize,
    },
}

const MAX_ENTRIES: usize = 1024;

/// One parsed `allow_out` / `deny_out` entry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Entry {
    Domain(DomainPattern),
    Net(IpNet),
}

/// `example.com` (exact) or `*.example.com` (any name strictly below example.com).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DomainPattern {
    suffix: String,
    wildcard: bool,
}

impl DomainPattern {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let lower = normalize_name(s);
        let (wildcard, rest) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower),
        };
        if !is_valid_hostname(&rest) {
            return None;
        }
        Some(Self {
            suffix: rest,
            wildcard,
        })
    }

    /// `name` must already be normalized (lowercase, no trailing dot).
    pub(crate) fn matches(&self, name: &str) -> bool {
        if self.wildcard {
            name.len() > self.suffix.len() + 1
                && name.ends_with(&self.suffix)
                && name.as_bytes()[name.len() - self.suffix.len() - 1] == b'.'
        } else {
            name == self.suffix
        }
    }
}

/// Lowercase and strip one trailing dot: DNS names are case-insensitive and may be absolute.
pub fn normalize_name(s: &str) -> String {
    let s = s.trim();
    s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase()
}

/// LDH labels (underscore tolerated, as real DNS has `_acme-challenge` style names), 1..=63 chars
/// each, total <= 253, at least one non-numeric label so IP literals never parse as names.
pub(crate) fn is_valid_hostname(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 || name.parse::<IpAddr>().is_ok() {
        return false;
    }
    name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

pub(crate) fn parse_entry(s: &str) -> Option<Entry> {
    let t = s.trim();
    if let Ok(ip) = IpAddr::from_str(t) {
        return Some(Entry::Net(IpNet::from(canonical_ip(ip))));
    }
    if let Ok(net) = IpNet::from_str(t) {
        // Host bits set ("10.1.2.3/8") are tolerated and truncated, as firewalls do.
        return Some(Entry::Net(net.trunc()));
    }
    DomainPattern::parse(t).map(Entry::Domain)
}

/// Headers a rule may not touch: hop-by-hop headers and framing, which the proxy manages.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
];

impl NetworkPolicy {
    /// A policy that allows nothing (the server default).
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// Checks every entry; the messages are meant for a 400 response.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (field, list) in [("allowOut", &self.allow_out), ("denyOut", &self.deny_out)] {
            if list.len() > MAX_ENTRIES {
                return Err(PolicyError::TooManyEntries {
                    field,
                    count: list.len(),
                    max: MAX_ENTRIES,
                });
            }
            for entry in list {
                if parse_entry(entry).is_none() {
                    return Err(PolicyError::InvalidEntry {
                        field,
                        entry: entry.clone(),
                    });
                }
            }
        }
        if self.rules.len() > MAX_ENTRIES {
            return Err(PolicyError::TooManyEntries {
                field: "rules",
                count: self.rules.len(),
                max: MAX_ENTRIES,
            });
        }
        for (host, rules) in &self.rules {
            if DomainPattern::parse(host).is_none() {
                return Err(PolicyError::InvalidRuleHost(host.clone()));
            }
            for rule in rules {
                for (name, value) in &rule.headers {
                    let Ok(hn) = http::HeaderName::from_str(name) else {
                        return Err(PolicyError::InvalidHeaderName {
                            host: host.clone(),
                            name: name.clone(),
                        });
                    };
                    if FORBIDDEN_HEADERS.contains(&hn.as_str()) {
                        return Err(PolicyError::ForbiddenHeader {
                            host: host.clone(),
                            name: name.clone(),
                        });
                    }
                    secrets::check_template(value).map_err(|source| {
                        PolicyError::InvalidHeaderValue {
                            host: host.clone(),
                            name: name.clone(),
                            source,
                        }
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Whether this policy can ever allow anything: decides whether a sandbox gets a link at all.
    pub fn allows_any_egress(&self) -> bool {
        self.allow_internet || !self.allow_out.is_empty()
    }
}

/// Outcome of one policy decision; `rule` is what the audit log shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub allowed: bool,
    pub rule: String,
}

impl Verdict {
    pub(crate) fn allow(rule: impl Into<String>) -> Self {
        Self {
            allowed: true,
            rule: rule.into(),
        }
    }
    pub(crate) fn deny(rule: impl Into<String>) -> Self {
        Self {
            allowed: false,
            rule: rule.into(),
        }
    }
}

/// A name-level decision before resolution.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum NameCheck {
    /// Allowed by a domain entry in allow_out: resolved addresses only need the fixed deny set.
    Allowed(String),
    /// Denied without resolving.
    Denied(String),
    /// Depends on the resolved addresses (IP/CIDR entries or allow_internet).
    ByAddress,
}

/// A policy compiled for matching; rebuilt on every `set_policy`.
#[derive(Debug)]
pub(crate) struct CompiledPolicy {
    pub source: NetworkPolicy,
    allow_domains: Vec<(DomainPattern, String)>,
    allow_nets: Vec<(IpNet, String)>,
    deny_domains: Vec<(DomainPattern, String)>,
    deny_nets: Vec<(IpNet, String)>,
    rules: Vec<(DomainPattern, Vec<HeaderRule>)>,
}

impl CompiledPolicy {
    /// Entries that fail to parse are skipped; `validate` rejects them before they get here.
    pub fn new(source: NetworkPolicy) -> Self {
        let mut allow_domains = Vec::new();
        let mut allow_nets = Vec::new();
        let mut deny_domains = Vec::new();
        let mut deny_nets = Vec::new();
        for e in &source.allow_out {
            match parse_entry(e) {
                Some(Entry::Domain(d)) => allow_domains.push((d, format!("allowOut:{e}"))),
                Some(Entry::Net(n)) => allow_nets.push((n, format!("allowOut:{e}"))),
                None => {}
            }
        }
        for e in &source.deny_out {
            match parse_entry(e) {
                Some(Entry::Domain(d)) => deny_domains.push((d, format!("denyOut:{e}"))),
                Some(Entry::Net(n)) => deny_nets.push((n, format!("denyOut:{e}"))),
                None => {}
            }
        }
        let rules = source
            .rules
            .iter()
            .filter_map(|(h, r)| DomainPattern::parse(h).map(|p| (p, r.clone())))
            .collect();
        Self {
            source,
            allow_domains,
            allow_nets,
            deny_domains,
            deny_nets,
            rules,
        }
    }

    /// Name-level check; `name` normalized.
    pub fn check_name(&self, name: &str) -> NameCheck {
        if let Some((_, rule)) = self.allow_domains.iter().find(|(p, _)| p.matches(name)) {
            return NameCheck::Allowed(rule.clone());
        }
        if let Some((_, rule)) = self.deny_domains.iter().find(|(p, _)| p.matches(name)) {
            return NameCheck::Denied(rule.clone());
        }
        if !self.source.allow_internet && self.allow_nets.is_empty() {
            return NameCheck::Denied("default-deny".into());
        }
        NameCheck::ByAddress
    }

    /// Address-level decision for a destination IP (direct connection or a resolved address of
    /// a name that was not allowed by domain).
    pub fn check_ip(&self, ip: IpAddr, deny: &DenySet, allow_private: bool) -> Verdict {
        let ip = canonical_ip(ip);
        if !allow_private && let Some(range) = deny.matches(ip) {
            return Verdict::deny(format!("fixed-deny:{range}"));
        }
        if let Some((_, rule)) = self.allow_nets.iter().find(|(n, _)| n.contains(&ip)) {
            return Verdict::allow(rule.clone());
        }
        if let Some((_, rule)) = self.deny_nets.iter().find(|(n, _)| n.contains(&ip)) {
            return Verdict::deny(rule.clone());
        }
        if self.source.allow_internet {
            return Verdict::allow("allowInternet");
        }
        Verdict::deny("default-deny")
    }

    /// Full decision for a name and its resolved addresses. Returns the verdict and the
    /// addresses that may be connected to (non-empty iff allowed).
    pub fn decide_resolved(
        &self,
        name: &str,
        addrs: &[IpAddr],
        deny: &DenySet,
        allow_private: bool,
    ) -> (Verdict, Vec<IpAddr>) {
        if addrs.is_empty() {
            return (Verdict::deny("unresolvable"), Vec::new());
        }
        match self.check_name(name) {
            NameCheck::Denied(rule) => (Verdict::deny(rule), Vec::new()),
            NameCheck::Allowed(rule) => {
                let mut first_denied = None;
                let ok: Vec<IpAddr> = addrs
                    .iter()
                    .copied()
                    .filter(|ip| {
                        if allow_private {
                            return true;
                        }
                        match deny.matches(canonical_ip(*ip)) {
                            Some(range) => {
                                first_denied.get_or_insert_with(|| format!("fixed-deny:{range}"));
                                false
                            }
                            None => true,
                        }
                    })
                    .collect();
                if ok.is_empty() {
                    (
                        Verdict::deny(first_denied.unwrap_or_else(|| "fixed-deny".into())),
                        ok,
                    )
                } else {
                    (Verdict::allow(rule), ok)
                }
            }
            NameCheck::ByAddress => {
                let mut ok = Vec::new();
                let mut allow_rule = None;
                let mut deny_rule = None;
                for ip in addrs {
                    let v = self.check_ip(*ip, deny, allow_private);
                    if v.allowed {
                        allow_rule.get_or_insert(v.rule);
                        ok.push(*ip);
                    } else {
                        deny_rule.get_or_insert(v.rule);
                    }
                }
                match allow_rule {
                    Some(rule) => (Verdict::allow(rule), ok),
                    None => (
                        Verdict::deny(deny_rule.unwrap_or_else(|| "default-deny".into())),
                        ok,
                    ),
                }
            }
        }
    }

    /// Header rules for `name` (normalized): exact matches first, then wildcards, so a specific
    /// rule overrides a wildcard one for the same header.
    pub fn header_rules(&self, name: &str) -> Option<Vec<HeaderRule>> {
        let mut out: Vec<HeaderRule> = Vec::new();
        let mut found = false;
        for (_, r) in self
            .rules
            .iter()
            .filter(|(p, _)| p.wildcard && p.matches(name))
        {
            out.extend(r.iter().cloned());
            found = true;
        }
        for (_, r) in self
            .rules
            .iter()
            .filter(|(p, _)| !p.wildcard && p.matches(name))
        {
            out.extend(r.iter().cloned());
            found = true;
        }
        found.then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pol(allow: &[&str], deny: &[&str], internet: bool) -> CompiledPolicy {
        CompiledPolicy::new(NetworkPolicy {
            allow_internet: internet,
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            rules: BTreeMap::new(),
            secret_scope: None,
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn domain_patterns() {
        let exact = DomainPattern::parse("Example.COM.").unwrap();
        assert!(exact.matches("example.com"));
        assert!(!exact.matches("a.example.com"));
        let wild = DomainPattern::parse("*.example.com").unwrap();
        assert!(wild.matches("a.example.com"));
        assert!(wild.matches("a.b.example.com"));
        assert!(!wild.matches("example.com"));
        assert!(!wild.matches("badexample.com"));
        assert!(!wild.matches("a.example.com.evil"));
        assert!(DomainPattern::parse("*").is_none());
        assert!(DomainPattern::parse("a.*.com").is_none());
        assert!(DomainPattern::parse("1.2.3.4").is_none());
        assert!(DomainPattern::parse("bad host").is_none());
    }

    #[test]
    fn validate_entries() {
        let mut p = NetworkPolicy {
            allow_out: vec![
                "example.com".into(),
                "*.pypi.org".into(),
                "1.2.3.4".into(),
                "10.0.0.0/8".into(),
                "::1".into(),
            ],
            deny_out: vec!["0.0.0.0/0".into()],
            ..Default::default()
        };
        assert_eq!(p.validate(), Ok(()));
        p.allow_out.push("http://example.com".into());
        let err = p.validate().unwrap_err();
        assert!(err.to_string().contains("http://example.com"), "{err}");
        let mut p = NetworkPolicy::default();
        p.rules.insert(
            "api.example.com".into(),
            vec![HeaderRule {
                headers: BTreeMap::from([(
                    "Authorization".into(),
                    "Bearer ${e2b.secrets.tok}".into(),
                )]),
            }],
        );
        assert_eq!(p.validate(), Ok(()));
        p.rules.insert(
            "x.example.com".into(),
            vec![HeaderRule {
                headers: BTreeMap::from([("Host".into(), "evil".into())]),
            }],
        );
        assert!(matches!(
            p.validate(),
            Err(PolicyError::ForbiddenHeader { .. })
        ));
        let mut p = NetworkPolicy::default();
        p.rules.insert("10.0.0.0/8".into(), vec![]);
        assert!(matches!(p.validate(), Err(PolicyError::InvalidRuleHost(_))));
    }

    #[test]
    fn name_decisions() {
        let deny = DenySet::fixed_only();
        let p = pol(&["api.allowed.test", "*.wild.test"], &["0.0.0.0/0"], false);
        let pub_ip = [ip("203.0.113.10")];
        assert!(
            p.decide_resolved("api.allowed.test", &pub_ip, &deny, false)
                .0
                .allowed
        );
        assert!(
            p.decide_resolved("x.wild.test", &pub_ip, &deny, false)
                .0
                .allowed
        );
        assert!(
            !p.decide_resolved("wild.test", &pub_ip, &deny, false)
                .0
                .allowed
        );
        assert_eq!(
            p.check_name("other.test"),
            NameCheck::Denied("default-deny".into())
        );
        assert!(
            !p.decide_resolved("other.test", &pub_ip, &deny, false)
                .0
                .allowed
        );
        // With an IP entry the name is judged by its addresses; denyOut 0.0.0.0/0 then applies.
        let p = pol(
            &["api.allowed.test", "*.wild.test", "198.51.100.0/24"],
            &["0.0.0.0/0"],
            false,
        );
        assert_eq!(p.check_name("other.test"), NameCheck::ByAddress);
        let (v, _) = p.decide_resolved("other.test", &pub_ip, &deny, false);
        assert_eq!(v, Verdict::deny("denyOut:0.0.0.0/0"));
        assert!(
            p.decide_resolved("other.test", &[ip("198.51.100.9")], &deny, false)
                .0
                .allowed
        );
        // Allowed by name but resolving to loopback: the fixed deny set wins.
        let (v, ok) = p.decide_resolved("api.allowed.test", &[ip("127.0.0.1")], &deny, false);
        assert!(
            !v.allowed && ok.is_empty() && v.rule.starts_with("fixed-deny"),
            "{v:?}"
        );
        // Mixed answers: only the public address survives.
        let (v, ok) = p.decide_resolved(
            "api.allowed.test",
            &[ip("10.1.1.1"), ip("203.0.113.10")],
            &deny,
            false,
        );
        assert!(v.allowed);
        assert_eq!(ok, vec![ip("203.0.113.10")]);
        // Operator opt-in.
        assert!(
            p.decide_resolved("api.allowed.test", &[ip("127.0.0.1")], &deny, true)
                .0
                .allowed
        );
        // No entries at all → default deny without resolving.
        let none = pol(&[], &[], false);
        assert_eq!(
            none.check_name("example.com"),
            NameCheck::Denied("default-deny".into())
        );
        // Domain in denyOut with allow_internet.
        let p = pol(&[], &["*.evil.test"], true);
        assert_eq!(
            p.check_name("a.evil.test"),
            NameCheck::Denied("denyOut:*.evil.test".into())
        );
        assert!(
            p.decide_resolved("good.test", &pub_ip, &deny, false)
                .0
                .allowed
        );
    }

    #[test]
    fn ip_decisions_allow_wins() {
        let deny = DenySet::fixed_only();
        let p = pol(
            &["203.0.113.0/28", "127.0.0.1", "10.0.0.0/8"],
            &["203.0.113.0/24"],
            false,
        );
        assert!(p.check_ip(ip("203.0.113.5"), &deny, false).allowed);
        assert_eq!(
            p.check_ip(ip("203.0.113.50"), &deny, false),
            Verdict::deny("denyOut:203.0.113.0/24")
        );
        // Fixed deny set wins over allowOut unless opted in.
        assert!(!p.check_ip(ip("127.0.0.1"), &deny, false).allowed);
        assert!(!p.check_ip(ip("10.2.3.4"), &deny, false).allowed);
        assert!(!p.check_ip(ip("::ffff:127.0.0.1"), &deny, false).allowed);
        assert!(p.check_ip(ip("127.0.0.1"), &deny, true).allowed);
        let open = pol(&[], &["198.51.100.0/24"], true);
        assert_eq!(
            open.check_ip(ip("192.0.2.1"), &deny, false),
            Verdict::allow("allowInternet")
        );
        assert!(!open.check_ip(ip("198.51.100.7"), &deny, false).allowed);
        assert!(!open.check_ip(ip("169.254.169.254"), &deny, false).allowed);
    }

    #[test]
    fn header_rules_specific_overrides_wildcard() {
        let mut np = NetworkPolicy::default();
        np.rules.insert(
            "*.api.test".into(),
            vec![HeaderRule {
                headers: BTreeMap::from([("x-a".into(), "wild".into())]),
            }],
        );
        np.rules.insert(
            "one.api.test".into(),
            vec![HeaderRule {
                headers: BTreeMap::from([("x-a".into(), "exact".into())]),
            }],
        );
        let p = CompiledPolicy::new(np);
        let r = p.header_rules("one.api.test").unwrap();
        assert_eq!(r.last().unwrap().headers["x-a"], "exact");
        assert_eq!(
            p.header_rules("two.api.test").unwrap()[0].headers["x-a"],
            "wild"
        );
        assert!(p.header_rules("api.test").is_none());
    }
}
