//! The sandbox's DNS server (GATEWAY:53): answers A queries for allowed names with fake IPs from
//! 198.18.0.0/15 (so the proxy learns the name from the destination address), NXDOMAIN for
//! denied names, and empty NOERROR for AAAA and other types (no IPv6 inside sandboxes).

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType, rdata::A};

use crate::config::DNS_TTL_SECS;
use crate::policy::{NameCheck, Verdict, is_valid_hostname, normalize_name};
use crate::sandbox::Sandbox;

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
mod tests {
    use super::*;
    use crate::fakeip::is_fake;
    use crate::policy::NetworkPolicy;
    use crate::sandbox::tests::{test_sandbox, test_sandbox_with};
    use std::net::IpAddr;

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

    mod props {
        //! Property tests: the responder parses datagrams from an untrusted sandbox, so it must
        //! never panic, and every well-formed query must get the answer its policy dictates.

        use std::collections::HashMap;

        use proptest::prelude::*;

        use super::*;

        fn rt() -> tokio::runtime::Runtime {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
        }

        /// Lowercase LDH labels; the sandbox's resolver may send any case, so tests vary it.
        fn labels() -> impl Strategy<Value = String> {
            prop::collection::vec("[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?", 1..4)
                .prop_map(|l| l.join("."))
        }

        fn record_type() -> impl Strategy<Value = RecordType> {
            prop::sample::select(vec![
                RecordType::A,
                RecordType::AAAA,
                RecordType::TXT,
                RecordType::MX,
                RecordType::CNAME,
                RecordType::HTTPS,
            ])
        }

        fn shout(name: &str, mask: u64) -> String {
            name.chars()
                .enumerate()
                .map(|(i, c)| {
                    if mask >> (i % 64) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            #[test]
            fn arbitrary_packets_never_panic(
                packets in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 1..16),
                mutations in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            ) {
                let (sb, _audit) = test_sandbox(NetworkPolicy {
                    allow_out: vec!["*.allowed.test".into()],
                    ..Default::default()
                });
                // A real query with a few bytes overwritten reaches deeper into the parser.
                let mut mutated = query("x.denied.test.", RecordType::A);
                for (at, byte) in mutations {
                    let n = mutated.len();
                    mutated[at % n] = byte;
                }
                rt().block_on(async {
                    for p in packets.iter().chain([&mutated]) {
                        if let Some(resp) = answer(&sb, p).await {
                            // Whatever we send back is a well-formed response to that id.
                            let req = Message::from_vec(p).unwrap();
                            let r = Message::from_vec(&resp).unwrap();
                            assert_eq!(r.metadata.message_type, MessageType::Response);
                            assert_eq!(r.metadata.id, req.metadata.id);
                        }
                    }
                });
            }

            #[test]
            fn queries_get_the_policy_answer(
                allowed in labels(),
                denied in labels(),
                t in record_type(),
                mask in any::<u64>(),
                id in any::<u16>(),
            ) {
                let allowed = format!("{allowed}.allowed.test");
                let denied = format!("{denied}.denied.test");
                let (sb, _audit) = test_sandbox_with(
                    NetworkPolicy {
                        allow_out: vec!["*.allowed.test".into()],
                        ..Default::default()
                    },
                    HashMap::from([(allowed.clone(), vec!["203.0.113.10".parse().unwrap()])]),
                );
                let ask = |name: &str| {
                    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
                    m.metadata.recursion_desired = true;
                    m.queries.push(Query::query(
                        Name::from_ascii(format!("{}.", shout(name, mask))).unwrap(),
                        t,
                    ));
                    m.to_vec().unwrap()
                };
                let (ok, no) = rt().block_on(async {
                    (
                        parse(&answer(&sb, &ask(&allowed)).await.unwrap()),
                        parse(&answer(&sb, &ask(&denied)).await.unwrap()),
                    )
                });
                for r in [&ok, &no] {
                    prop_assert_eq!(r.metadata.id, id);
                    prop_assert_eq!(r.metadata.message_type, MessageType::Response);
                    prop_assert_eq!(r.queries.len(), 1);
                    prop_assert_eq!(r.queries[0].query_type(), t);
                }
                // Denied names do not exist, whatever the type.
                prop_assert_eq!(no.metadata.response_code, ResponseCode::NXDomain);
                prop_assert!(no.answers.is_empty());
                prop_assert_eq!(ok.metadata.response_code, ResponseCode::NoError);
                if t == RecordType::A {
                    // One fake address, short-lived, that maps back to the name.
                    prop_assert_eq!(ok.answers.len(), 1);
                    let RData::A(A(ip)) = ok.answers[0].data.clone() else {
                        panic!("{ok:?}")
                    };
                    prop_assert!(is_fake(IpAddr::V4(ip)));
                    prop_assert_eq!(ok.answers[0].ttl, DNS_TTL_SECS);
                    prop_assert_eq!(ok.answers[0].name.to_ascii(), format!("{allowed}."));
                    let mapped = sb.fakes.lock().unwrap().lookup(ip);
                    prop_assert_eq!(mapped.as_deref(), Some(allowed.as_str()));
                } else {
                    // No IPv6 and no other records inside sandboxes: an empty answer.
                    prop_assert!(ok.answers.is_empty());
                }
            }
        }
    }
}
