//! The sandbox's DNS server (GATEWAY:53): answers A queries for allowed names with fake IPs from
//! 198.18.0.0/15 (so the proxy learns the name from the destination address), NXDOMAIN for
//! denied names, and empty NOERROR for AAAA and other types (no IPv6 inside sandboxes).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType, rdata::A};

use crate::policy::{NameCheck, Verdict, is_valid_hostname, normalize_name};
use crate::stack::Sandbox;
use crate::{DNS_TTL_SECS, FAKE_IP_BASE, FAKE_IP_PREFIX_LEN};

const POOL_SIZE: u32 = 1 << (32 - FAKE_IP_PREFIX_LEN as u32);

/// Per-sandbox name ↔ fake IP mapping. Stable per name; when the pool wraps, the oldest
/// assignment is reused (131k names per sandbox before that happens).
#[derive(Debug, Default)]
pub(crate) struct FakePool {
    next: u32,
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
}

pub(crate) fn is_fake(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            (u32::from(v4) >> (32 - FAKE_IP_PREFIX_LEN))
                == (u32::from(FAKE_IP_BASE) >> (32 - FAKE_IP_PREFIX_LEN))
        }
        IpAddr::V6(_) => false,
    }
}

impl FakePool {
    pub fn assign(&mut self, name: &str) -> Ipv4Addr {
        if let Some(ip) = self.by_name.get(name) {
            return *ip;
        }
        // Skip .0 of the pool (network address) for readability of the mapping.
        self.next = if self.next + 1 >= POOL_SIZE {
            1
        } else {
            self.next + 1
        };
        let ip = Ipv4Addr::from(u32::from(FAKE_IP_BASE) + self.next);
        if let Some(old) = self.by_ip.insert(ip, name.to_string()) {
            self.by_name.remove(&old);
        }
        self.by_name.insert(name.to_string(), ip);
        ip
    }

    pub fn lookup(&self, ip: Ipv4Addr) -> Option<String> {
        self.by_ip.get(&ip).cloned()
    }
}

fn response_for(req: &Message, code: ResponseCode) -> Message {
    let mut resp = Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    resp.metadata.response_code = code;
    resp.queries = req.queries.clone();
    resp
}

/// Answers one DNS datagram; `None` when the bytes are not a DNS query at all.
pub(crate) async fn answer(sb: &Sandbox, packet: &[u8]) -> Option<Vec<u8>> {
    let req = Message::from_vec(packet).ok()?;
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    let resp = if req.metadata.op_code != OpCode::Query || req.queries.len() != 1 {
        response_for(&req, ResponseCode::NotImp)
    } else {
        answer_query(sb, &req, &req.queries[0]).await
    };
    resp.to_vec().ok()
}

async fn answer_query(sb: &Sandbox, req: &Message, q: &Query) -> Message {
    let name = normalize_name(&q.name().to_ascii());
    if q.query_class() != DNSClass::IN || !is_valid_hostname(&name) {
        return response_for(req, ResponseCode::NXDomain);
    }
    let policy = sb.policy();
    let check = policy.check_name(&name);
    if let NameCheck::Denied(rule) = &check {
        sb.audit_dns(&name, &Verdict::deny(rule.clone()), None);
        return response_for(req, ResponseCode::NXDomain);
    }
    if q.query_type() != RecordType::A {
        // No IPv6 (and nothing else) inside sandboxes: "no records of this type".
        return response_for(req, ResponseCode::NoError);
    }
    let addrs = sb.shared.resolve(&name).await;
    let (verdict, ok) = policy.decide_resolved(
        &name,
        &addrs,
        &sb.shared.deny.get(),
        sb.shared.allow_private,
    );
    if !verdict.allowed {
        sb.audit_dns(&name, &verdict, addrs.first().copied());
        return response_for(req, ResponseCode::NXDomain);
    }
    let fake = sb.fakes.lock().expect("fake pool").assign(&name);
    sb.audit_dns(&name, &verdict, ok.first().copied());
    let mut resp = response_for(req, ResponseCode::NoError);
    let rname = Name::from_ascii(format!("{name}.")).unwrap_or_else(|_| q.name().clone());
    resp.answers
        .push(Record::from_rdata(rname, DNS_TTL_SECS, RData::A(A(fake))));
    resp
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::NetworkPolicy;
    use crate::stack::tests::test_sandbox;

    pub(crate) fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.queries
            .push(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn parse(b: &[u8]) -> Message {
        Message::from_vec(b).unwrap()
    }

    #[test]
    fn pool_is_stable_and_wraps() {
        let mut p = FakePool::default();
        let a = p.assign("a.test");
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.assign("a.test"), a);
        let b = p.assign("b.test");
        assert_ne!(a, b);
        assert!(is_fake(IpAddr::V4(b)));
        assert!(is_fake("198.19.255.255".parse().unwrap()));
        assert!(!is_fake("198.20.0.1".parse().unwrap()));
        assert_eq!(p.lookup(b).as_deref(), Some("b.test"));
        p.next = POOL_SIZE - 1;
        let w = p.assign("c.test");
        assert_eq!(w, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(p.lookup(w).as_deref(), Some("c.test"));
        assert!(!p.by_name.contains_key("a.test"));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn answers_follow_policy() {
        let policy = NetworkPolicy {
            allow_out: vec![
                "api.allowed.test".into(),
                "*.wild.test".into(),
                "loop.allowed.test".into(),
            ],
            ..Default::default()
        };
        let (sb, audit) = test_sandbox(policy);
        // Allowed → fake A record, short TTL.
        let r = parse(
            &answer(&sb, &query("API.allowed.test.", RecordType::A))
                .await
                .unwrap(),
        );
        assert_eq!(r.metadata.id, 0x1234);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        let RData::A(A(ip)) = r.answers[0].data.clone() else {
            panic!("{r:?}")
        };
        assert!(is_fake(IpAddr::V4(ip)));
        assert_eq!(r.answers[0].ttl, DNS_TTL_SECS);
        assert_eq!(
            sb.fakes.lock().unwrap().lookup(ip).as_deref(),
            Some("api.allowed.test")
        );
        // Wildcard.
        let r = parse(
            &answer(&sb, &query("x.wild.test.", RecordType::A))
                .await
                .unwrap(),
        );
        assert_eq!(r.answers.len(), 1);
        // AAAA → empty NOERROR.
        let r = parse(
            &answer(&sb, &query("api.allowed.test.", RecordType::AAAA))
                .await
                .unwrap(),
        );
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        // Denied → NXDOMAIN, for every type.
        for t in [RecordType::A, RecordType::AAAA, RecordType::TXT] {
            let r = parse(&answer(&sb, &query("denied.test.", t)).await.unwrap());
            assert_eq!(r.metadata.response_code, ResponseCode::NXDomain, "{t:?}");
        }
        // Allowed by name but resolving to loopback → NXDOMAIN.
        let r = parse(
            &answer(&sb, &query("loop.allowed.test.", RecordType::A))
                .await
                .unwrap(),
        );
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        // Garbage is ignored.
        assert!(answer(&sb, b"\x00\x01").await.is_none());
        let events: Vec<_> = audit.try_iter().collect();
        assert!(events.iter().any(|e| e.protocol == "dns"
            && e.allowed
            && e.host.as_deref() == Some("api.allowed.test")));
        assert!(events.iter().any(|e| !e.allowed
            && e.host.as_deref() == Some("denied.test")
            && e.rule == "default-deny"));
        assert!(events.iter().any(|e| !e.allowed
            && e.host.as_deref() == Some("loop.allowed.test")
            && e.rule.starts_with("fixed-deny")));
        // Live update: the same name is now denied.
        sb.set_policy(NetworkPolicy::default());
        let r = parse(
            &answer(&sb, &query("api.allowed.test.", RecordType::A))
                .await
                .unwrap(),
        );
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    }
}
