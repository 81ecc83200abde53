//! Errors across the wire. A `DriverError` becomes a `DriverFault`, variant for variant, and comes
//! back equal (same variant, fields, messages and chain of causes); causes that are not data (a
//! driver's setup error, an `io::Error`'s inner error) travel as their chain of messages and come
//! back as [`RemoteCause`]s. A failed call carries a `NodeError` (see the .proto's header), whose
//! [`connect_code`](v1::NodeError::connect_code) is the Connect code it is sent with.

use std::error::Error;
use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bulkhead_driver::{AgentExit, DriverError, Operation, StartError};
use bulkhead_envd::Code;

use super::{ConvertError, known, required, unset};
use crate::v1;
use crate::v1::node_error::Code as NodeCode;

/// A cause that crossed the wire as text: its message and, in turn, its own cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCause {
    message: String,
    source: Option<Box<RemoteCause>>,
}

impl RemoteCause {
    /// The chain of `messages`, outermost first; `None` when there are none.
    pub fn chain(messages: impl IntoIterator<Item = String>) -> Option<RemoteCause> {
        let messages: Vec<String> = messages.into_iter().collect();
        messages.into_iter().rev().fold(None, |source, message| {
            Some(RemoteCause {
                message,
                source: source.map(Box::new),
            })
        })
    }
}

impl std::fmt::Display for RemoteCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for RemoteCause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn Error + 'static))
    }
}

/// `error`'s message, then its causes' (what `bulkhead_common::error_chain` joins).
pub fn messages(error: &(dyn Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(error), |&e| e.source())
        .map(ToString::to_string)
        .collect()
}

/// The messages of `error`'s causes only.
fn causes(error: &(dyn Error + 'static)) -> Vec<String> {
    error.source().map(messages).unwrap_or_default()
}

/// A driver's name as `DriverError` holds it (`&'static str`: drivers name themselves with
/// constants). The known names map to constants; another is leaked once and reused, and past a
/// bound (a peer sending ever new names) reads as a fixed placeholder, so memory stays bounded.
fn driver_name(name: String) -> &'static str {
    const KNOWN: &[&str] = &["jail", "microvm", "fake"];
    const MAX_OTHERS: usize = 64;
    static OTHERS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    if let Some(known) = KNOWN.iter().find(|k| **k == name) {
        return known;
    }
    let mut others = OTHERS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(seen) = others.iter().find(|k| **k == name) {
        return seen;
    }
    if others.len() >= MAX_OTHERS {
        return "(unrecognised driver)";
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    others.push(leaked);
    leaked
}

impl From<Operation> for v1::Operation {
    fn from(op: Operation) -> Self {
        match op {
            Operation::OpenNetwork => v1::Operation::OpenNetwork,
            Operation::Freeze => v1::Operation::Freeze,
            Operation::Thaw => v1::Operation::Thaw,
            Operation::Checkpoint => v1::Operation::Checkpoint,
            Operation::Snapshot => v1::Operation::Snapshot,
            Operation::Restore => v1::Operation::Restore,
            Operation::Changes => v1::Operation::Changes,
            Operation::ExportChanges => v1::Operation::ExportChanges,
        }
    }
}

fn operation(value: i32) -> Result<Operation, ConvertError> {
    const FIELD: &str = "DriverFault.Unsupported.operation";
    Ok(match known(value, FIELD, "Operation")? {
        v1::Operation::OpenNetwork => Operation::OpenNetwork,
        v1::Operation::Freeze => Operation::Freeze,
        v1::Operation::Thaw => Operation::Thaw,
        v1::Operation::Checkpoint => Operation::Checkpoint,
        v1::Operation::Snapshot => Operation::Snapshot,
        v1::Operation::Restore => Operation::Restore,
        v1::Operation::Changes => Operation::Changes,
        v1::Operation::ExportChanges => Operation::ExportChanges,
        v1::Operation::Unspecified => return Err(unset(FIELD, "Operation")),
    })
}

/// `io::ErrorKind` ↔ `IoErrorKind`: the generated names are the Rust ones.
macro_rules! io_kinds {
    ($($kind:ident),* $(,)?) => {
        fn io_kind_to_wire(kind: io::ErrorKind) -> v1::IoErrorKind {
            match kind {
                $(io::ErrorKind::$kind => v1::IoErrorKind::$kind,)*
                // A kind newer than this list (or unstable, like `Uncategorized`).
                _ => v1::IoErrorKind::Other,
            }
        }

        fn io_kind_from_wire(kind: v1::IoErrorKind) -> io::ErrorKind {
            match kind {
                $(v1::IoErrorKind::$kind => io::ErrorKind::$kind,)*
                v1::IoErrorKind::Unspecified => io::ErrorKind::Other,
            }
        }
    };
}

io_kinds!(
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
);

impl From<&io::Error> for v1::IoFault {
    fn from(e: &io::Error) -> Self {
        let raw_os_error = e.raw_os_error();
        v1::IoFault {
            kind: io_kind_to_wire(e.kind()).into(),
            raw_os_error,
            // An OS error is whole in its number (its message is the C library's).
            messages: if raw_os_error.is_some() {
                Vec::new()
            } else {
                messages(e)
            },
        }
    }
}

impl TryFrom<v1::IoFault> for io::Error {
    type Error = ConvertError;

    fn try_from(f: v1::IoFault) -> Result<Self, ConvertError> {
        if let Some(code) = f.raw_os_error {
            return Ok(io::Error::from_raw_os_error(code));
        }
        let kind = io_kind_from_wire(known(f.kind, "IoFault.kind", "IoErrorKind")?);
        Ok(match RemoteCause::chain(f.messages) {
            Some(cause) => io::Error::new(kind, cause),
            None => io::Error::from(kind),
        })
    }
}

fn io_fault(f: Option<v1::IoFault>, field: &'static str) -> Result<io::Error, ConvertError> {
    required(f, field)?.try_into()
}

impl From<&AgentExit> for v1::AgentExit {
    fn from(e: &AgentExit) -> Self {
        use v1::agent_exit::How;
        v1::AgentExit {
            how: Some(match *e {
                AgentExit::Exited(code) => How::Exited(code),
                AgentExit::Signaled(signal) => How::Signaled(signal),
                AgentExit::Unknown => How::Unknown(v1::agent_exit::Unknown {}),
            }),
        }
    }
}

impl TryFrom<v1::AgentExit> for AgentExit {
    type Error = ConvertError;

    fn try_from(e: v1::AgentExit) -> Result<Self, ConvertError> {
        use v1::agent_exit::How;
        Ok(match required(e.how, "AgentExit.how")? {
            How::Exited(code) => AgentExit::Exited(code),
            How::Signaled(signal) => AgentExit::Signaled(signal),
            How::Unknown(_) => AgentExit::Unknown,
        })
    }
}

impl From<&StartError> for v1::StartFault {
    fn from(e: &StartError) -> Self {
        use v1::start_fault::{self as sf, Kind};
        let kind = match e {
            StartError::RootfsMissing => Kind::RootfsMissing(sf::RootfsMissing {}),
            StartError::NoFreeSlot { max } => Kind::NoFreeSlot(sf::NoFreeSlot { max: *max }),
            StartError::AgentExited { exit, output } => Kind::AgentExited(sf::AgentExited {
                exit: Some(exit.into()),
                output: output.clone(),
            }),
            StartError::AgentTimeout { timeout, output } => Kind::AgentTimeout(sf::AgentTimeout {
                timeout_seconds: timeout.as_secs(),
                timeout_nanos: timeout.subsec_nanos(),
                output: output.clone(),
            }),
            StartError::Config(message) => Kind::Config(message.clone()),
            StartError::Setup(cause) => Kind::Setup(sf::Setup {
                causes: messages(cause.as_ref()),
            }),
        };
        v1::StartFault { kind: Some(kind) }
    }
}

impl TryFrom<v1::StartFault> for StartError {
    type Error = ConvertError;

    fn try_from(f: v1::StartFault) -> Result<Self, ConvertError> {
        use v1::start_fault::Kind;
        Ok(match required(f.kind, "StartFault.kind")? {
            Kind::RootfsMissing(_) => StartError::RootfsMissing,
            Kind::NoFreeSlot(s) => StartError::NoFreeSlot { max: s.max },
            Kind::AgentExited(a) => StartError::AgentExited {
                exit: required(a.exit, "StartFault.AgentExited.exit")?.try_into()?,
                output: a.output,
            },
            Kind::AgentTimeout(t) => {
                if t.timeout_nanos >= 1_000_000_000 {
                    return Err(ConvertError::OutOfRange {
                        field: "StartFault.AgentTimeout.timeout_nanos",
                        value: t.timeout_nanos.to_string(),
                        expected: "below 1000000000 (whole seconds go in timeout_seconds)",
                    });
                }
                StartError::AgentTimeout {
                    timeout: Duration::new(t.timeout_seconds, t.timeout_nanos),
                    output: t.output,
                }
            }
            Kind::Config(message) => StartError::Config(message),
            Kind::Setup(s) => StartError::Setup(Box::new(RemoteCause::chain(s.causes).ok_or(
                ConvertError::MissingField {
                    field: "StartFault.Setup.causes",
                },
            )?)),
        })
    }
}

impl From<&DriverError> for v1::DriverFault {
    fn from(e: &DriverError) -> Self {
        use v1::driver_fault::{self as df, Kind};
        let kind = match e {
            DriverError::HostUnsupported { driver, reason } => {
                Kind::HostUnsupported(df::HostUnsupported {
                    driver: driver.to_string(),
                    reason: reason.clone(),
                })
            }
            DriverError::Unsupported { operation, driver } => Kind::Unsupported(df::Unsupported {
                operation: v1::Operation::from(*operation).into(),
                driver: driver.to_string(),
            }),
            DriverError::Start(start) => Kind::Start(start.into()),
            DriverError::Connect(io) => Kind::Connect(io.into()),
            DriverError::NotRunning => Kind::NotRunning(df::NotRunning {}),
            DriverError::Io { context, source } => Kind::Io(df::Io {
                context: context.clone(),
                source: Some(source.into()),
            }),
            DriverError::NoCapacity { reason } => Kind::NoCapacity(df::NoCapacity {
                reason: reason.clone(),
            }),
        };
        v1::DriverFault { kind: Some(kind) }
    }
}

impl TryFrom<v1::DriverFault> for DriverError {
    type Error = ConvertError;

    fn try_from(f: v1::DriverFault) -> Result<Self, ConvertError> {
        use v1::driver_fault::Kind;
        Ok(match required(f.kind, "DriverFault.kind")? {
            Kind::HostUnsupported(h) => DriverError::HostUnsupported {
                driver: driver_name(h.driver),
                reason: h.reason,
            },
            Kind::Unsupported(u) => DriverError::Unsupported {
                operation: operation(u.operation)?,
                driver: driver_name(u.driver),
            },
            Kind::Start(s) => DriverError::Start(s.try_into()?),
            Kind::Connect(io) => DriverError::Connect(io.try_into()?),
            Kind::NotRunning(_) => DriverError::NotRunning,
            Kind::Io(io) => DriverError::Io {
                context: io.context,
                source: io_fault(io.source, "DriverFault.Io.source")?,
            },
            Kind::NoCapacity(n) => DriverError::NoCapacity { reason: n.reason },
        })
    }
}

impl From<&DriverError> for v1::NodeError {
    /// The detail of a `Node` method that failed with a `DriverError` (`CODE_DRIVER`).
    fn from(e: &DriverError) -> Self {
        v1::NodeError {
            driver: Some(e.into()),
            ..v1::NodeError::new(NodeCode::Driver, e)
        }
    }
}

impl TryFrom<v1::NodeError> for DriverError {
    type Error = ConvertError;

    /// The `DriverError` a `CODE_DRIVER` detail carries. The wrappers (`CODE_NETWORK_LINK`,
    /// `CODE_AGENT_REACH`) are the engine's to rebuild, from `driver` converted alone.
    fn try_from(e: v1::NodeError) -> Result<Self, ConvertError> {
        if e.code != i32::from(NodeCode::Driver) {
            return Err(ConvertError::NotADriverError { code: e.code });
        }
        required(e.driver, "NodeError.driver")?.try_into()
    }
}

impl v1::NodeError {
    /// A detail with `code` and `error`'s message and causes; the caller sets the typed field
    /// the code names (`driver`, `egress`, `agent_status`).
    pub fn new(code: NodeCode, error: &(dyn Error + 'static)) -> v1::NodeError {
        v1::NodeError {
            code: code.into(),
            message: error.to_string(),
            causes: causes(error),
            driver: None,
            egress: 0,
            agent_status: None,
        }
    }

    /// The Connect code a node answers this error with: a summary for curl, proxies and
    /// retries; the engine reads the detail itself.
    pub fn connect_code(&self) -> Code {
        use v1::driver_fault::Kind as Driver;
        use v1::start_fault::Kind as Start;
        let driver = || self.driver.as_ref().and_then(|d| d.kind.as_ref());
        match NodeCode::try_from(self.code).unwrap_or(NodeCode::Unspecified) {
            NodeCode::StaleEpoch | NodeCode::StaleGeneration => Code::Aborted,
            NodeCode::InvalidArgument => Code::InvalidArgument,
            NodeCode::Driver | NodeCode::NetworkLink | NodeCode::AgentReach => match driver() {
                Some(Driver::Unsupported(_)) => Code::Unimplemented,
                Some(Driver::HostUnsupported(_) | Driver::NotRunning(_)) => {
                    Code::FailedPrecondition
                }
                Some(Driver::Connect(_)) => Code::Unavailable,
                Some(Driver::NoCapacity(_)) => Code::ResourceExhausted,
                Some(Driver::Start(s)) => match s.kind {
                    Some(Start::NoFreeSlot(_)) => Code::ResourceExhausted,
                    _ => Code::Internal,
                },
                Some(Driver::Io(_)) | None => Code::Internal,
            },
            NodeCode::NetworkNoProxy => Code::Unimplemented,
            NodeCode::NetworkProxy => {
                match v1::EgressErrorKind::try_from(self.egress).unwrap_or_default() {
                    v1::EgressErrorKind::Policy => Code::InvalidArgument,
                    v1::EgressErrorKind::AlreadyAttached => Code::AlreadyExists,
                    v1::EgressErrorKind::NotAttached => Code::NotFound,
                    _ => Code::Internal,
                }
            }
            NodeCode::AgentHandshake | NodeCode::AgentRequest => Code::Unavailable,
            NodeCode::AgentBuild
            | NodeCode::AgentEncode
            | NodeCode::AgentStatus
            | NodeCode::AgentDecode => Code::Internal,
            NodeCode::Unspecified => Code::Unknown,
        }
    }
}
