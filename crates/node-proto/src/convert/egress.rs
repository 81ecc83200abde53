//! The egress policy and the egress proxy's errors (feature `egress`: bulkhead-egress links
//! rustls, which a caller of the node protocol need not).

use bulkhead_egress::{EgressError, HeaderRule, NetworkPolicy};

use crate::v1;

impl From<&NetworkPolicy> for v1::NetworkPolicy {
    fn from(p: &NetworkPolicy) -> Self {
        v1::NetworkPolicy {
            allow_internet: p.allow_internet,
            allow_out: p.allow_out.clone(),
            deny_out: p.deny_out.clone(),
            rules: p
                .rules
                .iter()
                .map(|(host, rules)| {
                    let rules = rules
                        .iter()
                        .map(|r| v1::HeaderRule {
                            headers: r.headers.clone(),
                        })
                        .collect();
                    (host.clone(), v1::HeaderRules { rules })
                })
                .collect(),
            secret_scope: p.secret_scope.clone(),
        }
    }
}

impl From<v1::NetworkPolicy> for NetworkPolicy {
    fn from(p: v1::NetworkPolicy) -> Self {
        NetworkPolicy {
            allow_internet: p.allow_internet,
            allow_out: p.allow_out,
            deny_out: p.deny_out,
            rules: p
                .rules
                .into_iter()
                .map(|(host, rules)| {
                    let rules = rules
                        .rules
                        .into_iter()
                        .map(|r| HeaderRule { headers: r.headers })
                        .collect();
                    (host, rules)
                })
                .collect(),
            secret_scope: p.secret_scope,
        }
    }
}

impl From<&EgressError> for v1::EgressErrorKind {
    /// The variant of a `NetworkError::Proxy` cause (its text goes in `NodeError.causes`).
    fn from(e: &EgressError) -> Self {
        match e {
            EgressError::Ca { .. } => v1::EgressErrorKind::Ca,
            EgressError::Roots(_) => v1::EgressErrorKind::Roots,
            EgressError::Tls(_) => v1::EgressErrorKind::Tls,
            EgressError::NoRuntime => v1::EgressErrorKind::NoRuntime,
            EgressError::AlreadyAttached(_) => v1::EgressErrorKind::AlreadyAttached,
            EgressError::NotAttached(_) => v1::EgressErrorKind::NotAttached,
            EgressError::Policy(_) => v1::EgressErrorKind::Policy,
            EgressError::Link(_) => v1::EgressErrorKind::Link,
            EgressError::Io(_) => v1::EgressErrorKind::Io,
        }
    }
}
