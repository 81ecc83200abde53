//! Error fidelity. Through an engine: every `DriverError` variant the fake driver can be made to
//! produce (its fail switches take any) reaches the engine over the wire as it does in process.
//! At the `Node` seam: network and agent-call errors the node produces come back the same. And
//! the conversions of the engine's own error types round-trip their detail (through the JSON
//! error body) exactly, except the egress variants holding foreign typed causes (`Policy`,
//! `Tls`, `Link`), which read the same (message and chain) as an `Io` variant.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_egress::{EgressError, NetworkPolicy, PolicyError};
use bulkhead_engine::agent_client::AgentClientError;
use bulkhead_engine::driver::{AgentExit, DriverError, Operation, SandboxSpec, StartError};
use bulkhead_engine::testing::{FakeDriver, RecordingEgress};
use bulkhead_engine::{AgentCallError, CreateRequest, EngineError, NetworkError, Node};
use bulkhead_node::errors::{
    agent::http_errors, agent_call_detail, agent_call_error, network_detail, network_error,
};
use bulkhead_node::wire::ErrorBody;
use bulkhead_node_proto::v1;

use crate::engine::{local_engine, remote_engine};
use crate::{Harness, chain};

/// Every `DriverError` variant (and every `StartError` one).
fn driver_errors() -> Vec<fn() -> DriverError> {
    vec![
        || DriverError::HostUnsupported {
            driver: "fake",
            reason: "no cgroup v2".into(),
        },
        || DriverError::unsupported("fake", Operation::Checkpoint),
        || StartError::RootfsMissing.into(),
        || StartError::NoFreeSlot { max: 4 }.into(),
        || {
            StartError::AgentExited {
                exit: AgentExit::Signaled(9),
                output: "killed".into(),
            }
            .into()
        },
        || {
            StartError::AgentTimeout {
                timeout: Duration::from_millis(1500),
                output: "slow".into(),
            }
            .into()
        },
        || StartError::Config("bad".into()).into(),
        || StartError::setup(io::Error::other("launcher failed")).into(),
        || DriverError::Connect(io::Error::from_raw_os_error(111)),
        || DriverError::NotRunning,
        || DriverError::io("reading the cgroup", io::ErrorKind::NotFound.into()),
        || {
            DriverError::io(
                "writing the image",
                io::Error::new(io::ErrorKind::PermissionDenied, "denied"),
            )
        },
    ]
}

/// A `DriverError` as a caller can tell it apart: variant, fields, io kinds and OS errors.
fn describe(e: &DriverError) -> String {
    let io = |e: &io::Error| format!("{:?}/{:?}", e.kind(), e.raw_os_error());
    match e {
        DriverError::Connect(source) => format!("Connect {}", io(source)),
        DriverError::Io { context, source } => format!("Io {context:?} {}", io(source)),
        DriverError::Start(StartError::Setup(_)) => "Start(Setup)".into(),
        other => format!("{other:?}"),
    }
}

/// The driver error an engine error holds.
fn driver_error_of(e: &EngineError) -> &DriverError {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<DriverError>())
        .unwrap_or_else(|| panic!("{e:?} holds no driver error"))
}

/// The same engine error, but for the sandbox ids (`ids`: the remote's, the local one's).
fn assert_same_engine_error(remote: &EngineError, local: &EngineError, ids: (&str, &str)) {
    let named = |e: &EngineError, id: &str| {
        chain(e)
            .into_iter()
            .map(|m| {
                if id.is_empty() {
                    m
                } else {
                    m.replace(id, "<id>")
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(named(remote, ids.0), named(local, ids.1));
    assert_eq!(
        describe(driver_error_of(remote)),
        describe(driver_error_of(local))
    );
    assert_eq!(remote.operation(), local.operation());
}

#[tokio::test]
async fn driver_errors_reach_the_engine_as_in_process() {
    let h = Harness::start().await;
    let (remote, owner, _) = remote_engine(h.dir.path(), h.remote.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(FakeDriver::default());
    let (local, local_owner, _) = local_engine(dir.path(), driver.clone()).await;
    let base = || CreateRequest {
        template: "base".into(),
        ..Default::default()
    };

    for make in driver_errors() {
        // Start.
        *h.driver.fail_start.lock().unwrap() = Some(make);
        *driver.fail_start.lock().unwrap() = Some(make);
        let r = remote.create(&owner, base()).await.unwrap_err();
        let l = local.create(&local_owner, base()).await.unwrap_err();
        assert_same_engine_error(&r, &l, ("", ""));
        assert_eq!(describe(driver_error_of(&r)), describe(&make()));
        *h.driver.fail_start.lock().unwrap() = None;
        *driver.fail_start.lock().unwrap() = None;

        // Usage, pause (checkpoint) and resume (restore) of a running sandbox.
        let rs = remote.create(&owner, base()).await.unwrap();
        let ls = local.create(&local_owner, base()).await.unwrap();
        *h.driver.fail_usage.lock().unwrap() = Some(make);
        *driver.fail_usage.lock().unwrap() = Some(make);
        let r = remote.usage(&owner, &rs.id).await.unwrap_err();
        let l = local.usage(&local_owner, &ls.id).await.unwrap_err();
        assert_eq!(
            chain(&r).join(": ").replace(&rs.id, "<id>"),
            chain(&l).join(": ").replace(&ls.id, "<id>")
        );
        *h.driver.fail_usage.lock().unwrap() = None;
        *driver.fail_usage.lock().unwrap() = None;

        *h.driver.fail_checkpoint.lock().unwrap() = Some(make);
        *driver.fail_checkpoint.lock().unwrap() = Some(make);
        let r = remote.pause(&owner, &rs.id, true).await.unwrap_err();
        let l = local.pause(&local_owner, &ls.id, true).await.unwrap_err();
        assert_same_engine_error(&r, &l, (&rs.id, &ls.id));
        *h.driver.fail_checkpoint.lock().unwrap() = None;
        *driver.fail_checkpoint.lock().unwrap() = None;

        remote.pause(&owner, &rs.id, true).await.unwrap();
        local.pause(&local_owner, &ls.id, true).await.unwrap();
        *h.driver.fail_restore.lock().unwrap() = Some(make);
        *driver.fail_restore.lock().unwrap() = Some(make);
        let resume = bulkhead_engine::ResumeRequest::default();
        let r = remote.resume(&owner, &rs.id, resume).await.unwrap_err();
        let l = local
            .resume(&local_owner, &ls.id, resume)
            .await
            .unwrap_err();
        assert_same_engine_error(&r, &l, (&rs.id, &ls.id));
        *h.driver.fail_restore.lock().unwrap() = None;
        *driver.fail_restore.lock().unwrap() = None;
        remote.kill(&owner, &rs.id).await.unwrap();
        local.kill(&local_owner, &ls.id).await.unwrap();
    }
}

fn spec(h: &Harness) -> SandboxSpec {
    SandboxSpec {
        template_id: "base".into(),
        rootfs: h.dir.path().join("templates/base/rootfs"),
        cpu_count: 1,
        memory_mb: 128,
        pids_max: 16,
        disk_mb: 0,
        volumes: Vec::new(),
    }
}

#[tokio::test]
async fn network_and_agent_errors_at_the_seam_are_the_nodes() {
    // No egress proxy: NoProxy.
    let h = Harness::start().await;
    let handle = h.remote.start(&spec(&h), false).await.unwrap();
    let policy = NetworkPolicy::default();
    let r = h
        .remote
        .attach_network("sb", &handle, policy.clone())
        .await
        .unwrap_err();
    let l = h
        .local
        .attach_network("sb", &handle, policy.clone())
        .await
        .unwrap_err();
    assert!(matches!(r, NetworkError::NoProxy), "{r:?}");
    assert_eq!(chain(&r), chain(&l));

    // The agent of a stopped sandbox: Reach(NotRunning).
    h.remote.stop(&handle).await.unwrap();
    let r = h.remote.agent_info(&handle).await.unwrap_err();
    let l = h.local.agent_info(&handle).await.unwrap_err();
    assert!(
        matches!(r, AgentCallError::Reach(DriverError::NotRunning)),
        "{r:?}"
    );
    assert_eq!(chain(&r), chain(&l));

    // With an egress proxy: a policy for a sandbox it does not know.
    let h = Harness::start_with_egress(Arc::new(RecordingEgress::default())).await;
    assert!(h.remote.has_egress());
    let r = h
        .remote
        .set_network_policy("nope", policy.clone())
        .await
        .unwrap_err();
    let l = h
        .local
        .set_network_policy("nope", policy)
        .await
        .unwrap_err();
    assert!(
        matches!(&r, NetworkError::Proxy(EgressError::NotAttached(id)) if id == "nope"),
        "{r:?}"
    );
    assert_eq!(chain(&r), chain(&l));
}

/// `detail` through the JSON error body a node answers, and back.
fn over_the_wire(detail: &v1::NodeError) -> v1::NodeError {
    let body = ErrorBody::from_detail(detail).to_json();
    let parsed = ErrorBody::parse(500, &body);
    assert_eq!(parsed.code, detail.connect_code());
    parsed.detail().expect("the detail is in the body")
}

fn egress_errors() -> Vec<(EgressError, bool)> {
    // (error, comes back as its own variant)
    vec![
        (
            EgressError::Ca {
                path: "/etc/bulkhead/ca.pem".into(),
                message: "no key: in file".into(),
            },
            true,
        ),
        (EgressError::Roots("none found".into()), true),
        (EgressError::NoRuntime, true),
        (EgressError::AlreadyAttached("sb1".into()), true),
        (EgressError::NotAttached("sb2".into()), true),
        (EgressError::Io(io::Error::from_raw_os_error(2)), true),
        (EgressError::Io(io::Error::other("socket gone")), true),
        (
            EgressError::Policy(PolicyError::InvalidRuleHost("1.2.3.4".into())),
            false,
        ),
    ]
}

#[test]
fn network_errors_round_trip_exactly() {
    let mut cases = vec![NetworkError::NoProxy];
    cases.extend(driver_errors().into_iter().map(|e| NetworkError::Link(e())));
    for e in &cases {
        let back = network_error(over_the_wire(&network_detail(e))).unwrap();
        assert_eq!(chain(&back), chain(e));
        match (e, &back) {
            (NetworkError::NoProxy, NetworkError::NoProxy) => {}
            (NetworkError::Link(a), NetworkError::Link(b)) => assert_eq!(describe(a), describe(b)),
            (a, b) => panic!("{a:?} came back as {b:?}"),
        }
    }
    for (egress, exact) in egress_errors() {
        let want = format!("{egress:?}");
        let io_kind = match &egress {
            EgressError::Io(io) => Some((io.kind(), io.raw_os_error())),
            _ => None,
        };
        let e = NetworkError::Proxy(egress);
        let back = network_error(over_the_wire(&network_detail(&e))).unwrap();
        let NetworkError::Proxy(got) = &back else {
            panic!("{e:?} came back as {back:?}");
        };
        // The log line reads the same for every variant.
        assert_eq!(
            bulkhead_common::error_chain(&back),
            bulkhead_common::error_chain(&e),
        );
        if !exact {
            assert!(matches!(got, EgressError::Io(_)), "{got:?}");
            continue;
        }
        assert_eq!(chain(&back), chain(&e));
        match (io_kind, got) {
            (Some((kind, os)), EgressError::Io(io)) => {
                assert_eq!((io.kind(), io.raw_os_error()), (kind, os))
            }
            (None, got) => assert_eq!(format!("{got:?}"), want),
            (_, got) => panic!("{want} came back as {got:?}"),
        }
    }
}

/// A real `hyper::Error` (a connection closed before its answer).
async fn hyper_error() -> hyper::Error {
    let (client, server) = tokio::io::duplex(64);
    drop(server);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    sender.send_request(req).await.unwrap_err()
}

fn json_error() -> serde_json::Error {
    serde_json::from_str::<serde_json::Value>("{nope").unwrap_err()
}

#[tokio::test]
async fn agent_call_errors_round_trip_exactly() {
    let mut cases: Vec<AgentCallError> = driver_errors()
        .into_iter()
        .map(|e| AgentCallError::Reach(e()))
        .collect();
    cases.push(AgentCallError::Call(AgentClientError::Handshake(Box::new(
        hyper_error().await,
    ))));
    cases.push(AgentCallError::Call(AgentClientError::Request(Box::new(
        hyper_error().await,
    ))));
    cases.extend(
        http_errors()
            .into_iter()
            .map(|e| AgentCallError::Call(AgentClientError::Build(e))),
    );
    let unencodable = serde_json::to_vec(&std::collections::HashMap::from([(vec![1u8], 1)]));
    cases.push(AgentCallError::Call(AgentClientError::Encode(
        unencodable.unwrap_err(),
    )));
    cases.push(AgentCallError::Call(AgentClientError::Decode(json_error())));
    cases.push(AgentCallError::Call(AgentClientError::Status {
        status: 503,
        body: "agent busy".into(),
    }));
    for e in &cases {
        let back = agent_call_error(over_the_wire(&agent_call_detail(e))).unwrap();
        assert_eq!(chain(&back), chain(e), "{e:?}");
        use AgentClientError as C;
        match (e, &back) {
            (AgentCallError::Reach(a), AgentCallError::Reach(b)) => {
                assert_eq!(describe(a), describe(b))
            }
            (AgentCallError::Call(a), AgentCallError::Call(b)) => match (a, b) {
                (C::Handshake(_), C::Handshake(_))
                | (C::Request(_), C::Request(_))
                | (C::Build(_), C::Build(_))
                | (C::Encode(_), C::Encode(_))
                | (C::Decode(_), C::Decode(_)) => {}
                (C::Status { status, body }, C::Status { status: s, body: b }) => {
                    assert_eq!((status, body), (s, b))
                }
                (a, b) => panic!("{a:?} came back as {b:?}"),
            },
            (a, b) => panic!("{a:?} came back as {b:?}"),
        }
    }
}

#[test]
fn every_http_error_message_is_distinct() {
    // The rebuild picks an http::Error by its message: each message names one error.
    let messages: Vec<String> = http_errors().iter().map(ToString::to_string).collect();
    let distinct: std::collections::BTreeSet<&String> = messages.iter().collect();
    assert!(messages.len() >= 15, "{messages:?}");
    assert_eq!(distinct.len(), messages.len(), "{messages:?}");
}
