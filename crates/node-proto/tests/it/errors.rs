//! Each `DriverError` variant crosses the wire and comes back the same: same variant and fields,
//! same message and chain of causes, same `io::ErrorKind` and OS error number.

use std::io;
use std::time::Duration;

use bulkhead_driver::{AgentExit, DriverError, Operation, StartError};
use bulkhead_envd::Code;
use bulkhead_node_proto::convert::error::messages;
use bulkhead_node_proto::convert::{ConvertError, RemoteCause};
use bulkhead_node_proto::v1;
use bulkhead_node_proto::v1::node_error::Code as NodeCode;
use proptest::prelude::*;
use proptest::strategy::LazyJust;

use crate::over_the_wire;

fn driver_name() -> impl Strategy<Value = &'static str> {
    // The known names and one other (interned on the way back).
    prop_oneof![
        Just("jail"),
        Just("microvm"),
        Just("fake"),
        Just("firecracker")
    ]
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        Just(Operation::OpenNetwork),
        Just(Operation::Freeze),
        Just(Operation::Thaw),
        Just(Operation::Checkpoint),
        Just(Operation::Snapshot),
        Just(Operation::Restore),
        Just(Operation::Changes),
        Just(Operation::ExportChanges),
    ]
}

fn io_kind() -> impl Strategy<Value = io::ErrorKind> {
    use io::ErrorKind::*;
    prop::sample::select(vec![
        Other,
        NotFound,
        PermissionDenied,
        ConnectionRefused,
        ConnectionReset,
        HostUnreachable,
        NetworkUnreachable,
        ConnectionAborted,
        NotConnected,
        AddrInUse,
        AddrNotAvailable,
        NetworkDown,
        BrokenPipe,
        AlreadyExists,
        WouldBlock,
        NotADirectory,
        IsADirectory,
        DirectoryNotEmpty,
        ReadOnlyFilesystem,
        StaleNetworkFileHandle,
        InvalidInput,
        InvalidData,
        TimedOut,
        WriteZero,
        StorageFull,
        NotSeekable,
        QuotaExceeded,
        FileTooLarge,
        ResourceBusy,
        ExecutableFileBusy,
        Deadlock,
        CrossesDevices,
        TooManyLinks,
        InvalidFilename,
        ArgumentListTooLong,
        Interrupted,
        Unsupported,
        UnexpectedEof,
        OutOfMemory,
    ])
}

/// A chain of one to three messages.
fn cause() -> impl Strategy<Value = RemoteCause> {
    prop::collection::vec(".{0,16}", 1..4).prop_map(|m| RemoteCause::chain(m).unwrap())
}

/// Every shape of `io::Error`: an OS error, a bare kind, a message, a chain of causes.
fn io_error() -> impl Strategy<Value = io::Error> {
    prop_oneof![
        (1..134i32).prop_map(io::Error::from_raw_os_error),
        io_kind().prop_map(io::Error::from),
        (io_kind(), ".{0,16}").prop_map(|(k, m)| io::Error::new(k, m)),
        (io_kind(), cause()).prop_map(|(k, c)| io::Error::new(k, c)),
    ]
}

fn start_error() -> impl Strategy<Value = StartError> {
    let exit = prop_oneof![
        any::<i32>().prop_map(AgentExit::Exited),
        any::<i32>().prop_map(AgentExit::Signaled),
        Just(AgentExit::Unknown),
    ];
    prop_oneof![
        LazyJust::new(|| StartError::RootfsMissing),
        any::<u32>().prop_map(|max| StartError::NoFreeSlot { max }),
        (exit, ".{0,16}").prop_map(|(exit, output)| StartError::AgentExited { exit, output }),
        (any::<u64>(), 0..1_000_000_000u32, ".{0,16}").prop_map(|(s, n, output)| {
            StartError::AgentTimeout {
                timeout: Duration::new(s, n),
                output,
            }
        }),
        ".{0,16}".prop_map(StartError::Config),
        cause().prop_map(StartError::setup),
        io_error().prop_map(StartError::setup),
    ]
}

pub fn driver_error() -> impl Strategy<Value = DriverError> {
    prop_oneof![
        (driver_name(), ".{0,16}")
            .prop_map(|(driver, reason)| DriverError::HostUnsupported { driver, reason }),
        (operation(), driver_name())
            .prop_map(|(operation, driver)| DriverError::unsupported(driver, operation)),
        start_error().prop_map(DriverError::Start),
        io_error().prop_map(DriverError::Connect),
        LazyJust::new(|| DriverError::NotRunning),
        (".{0,16}", io_error()).prop_map(|(context, source)| DriverError::io(context, source)),
        ".{0,16}".prop_map(|reason| DriverError::NoCapacity { reason }),
    ]
}

/// The same `io::Error`, as far as a caller can tell.
fn same_io(a: &io::Error, b: &io::Error) {
    assert_eq!(a.kind(), b.kind());
    assert_eq!(a.raw_os_error(), b.raw_os_error());
    assert_eq!(messages(a), messages(b));
}

/// The same `DriverError`: variant, fields, message and chain.
pub fn assert_same(a: &DriverError, b: &DriverError) {
    assert_eq!(messages(a), messages(b));
    match (a, b) {
        (
            DriverError::HostUnsupported { driver, reason },
            DriverError::HostUnsupported {
                driver: d,
                reason: r,
            },
        ) => assert_eq!((driver, reason), (d, r)),
        (
            DriverError::Unsupported { operation, driver },
            DriverError::Unsupported {
                operation: o,
                driver: d,
            },
        ) => assert_eq!((operation, driver), (o, d)),
        (DriverError::Start(x), DriverError::Start(y)) => match (x, y) {
            (StartError::RootfsMissing, StartError::RootfsMissing) => {}
            (StartError::NoFreeSlot { max }, StartError::NoFreeSlot { max: m }) => {
                assert_eq!(max, m)
            }
            (
                StartError::AgentExited { exit, output },
                StartError::AgentExited { exit: e, output: o },
            ) => assert_eq!((exit, output), (e, o)),
            (
                StartError::AgentTimeout { timeout, output },
                StartError::AgentTimeout {
                    timeout: t,
                    output: o,
                },
            ) => assert_eq!((timeout, output), (t, o)),
            (StartError::Config(c), StartError::Config(d)) => assert_eq!(c, d),
            // The cause's chain is compared above, with the rest.
            (StartError::Setup(_), StartError::Setup(_)) => {}
            (x, y) => panic!("{x:?} came back as {y:?}"),
        },
        (DriverError::Connect(x), DriverError::Connect(y)) => same_io(x, y),
        (DriverError::NotRunning, DriverError::NotRunning) => {}
        (DriverError::NoCapacity { reason }, DriverError::NoCapacity { reason: r }) => {
            assert_eq!(reason, r)
        }
        (
            DriverError::Io { context, source },
            DriverError::Io {
                context: c,
                source: s,
            },
        ) => {
            assert_eq!(context, c);
            same_io(source, s);
        }
        (a, b) => panic!("{a:?} came back as {b:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn driver_errors_round_trip_as_faults(e in driver_error()) {
        let back = DriverError::try_from(over_the_wire(&v1::DriverFault::from(&e))).unwrap();
        assert_same(&e, &back);
    }

    #[test]
    fn driver_errors_round_trip_as_node_errors(e in driver_error()) {
        let detail = over_the_wire(&v1::NodeError::from(&e));
        prop_assert_eq!(detail.code(), NodeCode::Driver);
        prop_assert_eq!(&detail.message, &e.to_string());
        prop_assert_eq!(&detail.causes, &messages(&e)[1..].to_vec());
        let back = DriverError::try_from(detail).unwrap();
        assert_same(&e, &back);
    }
}

/// One of each variant, by name, so a failure says which.
#[test]
fn each_variant_round_trips() {
    let cases = [
        DriverError::HostUnsupported {
            driver: "jail",
            reason: "no cgroup v2".into(),
        },
        DriverError::unsupported("microvm", Operation::Snapshot),
        StartError::RootfsMissing.into(),
        StartError::NoFreeSlot { max: 64 }.into(),
        StartError::AgentExited {
            exit: AgentExit::Signaled(9),
            output: "killed".into(),
        }
        .into(),
        StartError::AgentTimeout {
            timeout: Duration::from_millis(1500),
            output: String::new(),
        }
        .into(),
        StartError::Config("bad".into()).into(),
        StartError::setup(io::Error::other("launcher failed")).into(),
        DriverError::Connect(io::Error::from_raw_os_error(111)),
        DriverError::NotRunning,
        DriverError::io("reading the cgroup", io::ErrorKind::NotFound.into()),
        DriverError::NoCapacity {
            reason: "every node is full".into(),
        },
    ];
    for e in &cases {
        let back = DriverError::try_from(over_the_wire(&v1::NodeError::from(e))).unwrap();
        assert_same(e, &back);
    }
}

#[test]
fn connect_codes_summarise_the_detail() {
    let code = |e: DriverError| v1::NodeError::from(&e).connect_code();
    assert_eq!(code(DriverError::NotRunning), Code::FailedPrecondition);
    assert_eq!(
        code(DriverError::unsupported("jail", Operation::Freeze)),
        Code::Unimplemented
    );
    assert_eq!(
        code(StartError::NoFreeSlot { max: 1 }.into()),
        Code::ResourceExhausted
    );
    assert_eq!(
        code(DriverError::NoCapacity {
            reason: "full".into()
        }),
        Code::ResourceExhausted
    );
    assert_eq!(
        code(DriverError::Connect(
            io::ErrorKind::ConnectionRefused.into()
        )),
        Code::Unavailable
    );
    let stale = v1::NodeError {
        code: NodeCode::StaleEpoch.into(),
        ..v1::NodeError::default()
    };
    assert_eq!(stale.connect_code(), Code::Aborted);
    let policy = v1::NodeError {
        code: NodeCode::NetworkProxy.into(),
        egress: v1::EgressErrorKind::Policy.into(),
        ..v1::NodeError::default()
    };
    assert_eq!(policy.connect_code(), Code::InvalidArgument);
    let unknown = v1::NodeError {
        code: 999,
        ..v1::NodeError::default()
    };
    assert_eq!(unknown.connect_code(), Code::Unknown);
}

#[test]
fn egress_errors_keep_their_variant() {
    let e = bulkhead_egress::EgressError::NotAttached("sbx".into());
    assert_eq!(
        v1::EgressErrorKind::from(&e),
        v1::EgressErrorKind::NotAttached
    );
    let detail = v1::NodeError {
        egress: v1::EgressErrorKind::from(&e).into(),
        ..v1::NodeError::new(NodeCode::NetworkProxy, &e)
    };
    let detail = over_the_wire(&detail);
    assert_eq!(detail.egress(), v1::EgressErrorKind::NotAttached);
    assert_eq!(detail.message, e.to_string());
}

#[test]
fn a_node_error_of_another_code_is_not_a_driver_error() {
    let e = v1::NodeError {
        code: NodeCode::NetworkNoProxy.into(),
        message: "This server has no egress proxy".into(),
        ..v1::NodeError::default()
    };
    assert!(matches!(
        DriverError::try_from(e),
        Err(ConvertError::NotADriverError { code: 20 })
    ));
}
