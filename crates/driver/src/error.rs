//! Driver errors. Causes stay typed and reachable through `source()`; a message never repeats
//! its source inline (print the chain to see everything).

use std::time::Duration;

use crate::capability::Operation;

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The host lacks something the driver needs (root, a kernel feature, a cgroup layout).
    #[error("This host cannot run {driver} sandboxes: {reason}")]
    HostUnsupported {
        driver: &'static str,
        reason: String,
    },
    /// An optional operation the driver does not offer (see [`crate::Capabilities`]).
    #[error(
        "The {driver} driver cannot {operation}: check the driver's capabilities before asking"
    )]
    Unsupported {
        operation: Operation,
        driver: &'static str,
    },
    #[error("Sandbox could not be started")]
    Start(#[source] StartError),
    #[error("Sandbox agent is not reachable: the sandbox may be stopping; retry or restart it")]
    Connect(#[source] std::io::Error),
    #[error("Sandbox is not running")]
    NotRunning,
    /// No node can take the sandbox now: a cluster's placement found every node full, draining
    /// or unable to restore its checkpoint (`reason` says which, without host details).
    /// Answered by a router over nodes, never by a driver, whose own refusal is
    /// [`StartError::NoFreeSlot`].
    #[error("No node can take the sandbox now: {reason}")]
    NoCapacity { reason: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl DriverError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DriverError::Io {
            context: context.into(),
            source,
        }
    }

    /// The answer of an optional operation a driver does not offer.
    pub fn unsupported(driver: &'static str, operation: Operation) -> Self {
        DriverError::Unsupported { operation, driver }
    }
}

impl From<StartError> for DriverError {
    fn from(e: StartError) -> Self {
        DriverError::Start(e)
    }
}

/// Why a sandbox did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "The template's root filesystem is missing or not a directory: rebuild the template \
         with `bulkhead template build`"
    )]
    RootfsMissing,
    #[error("All {max} sandbox slots are in use: stop unused sandboxes or raise the slot limit")]
    NoFreeSlot { max: u32 },
    #[error("The agent {exit} before accepting connections{}", output_suffix(.output))]
    AgentExited { exit: AgentExit, output: String },
    #[error(
        "The agent did not accept connections within {} s{}: the host may be overloaded; retry, \
         or raise the start timeout",
        .timeout.as_secs_f64(),
        output_suffix(.output)
    )]
    AgentTimeout { timeout: Duration, output: String },
    #[error("Invalid driver configuration: {0}")]
    Config(String),
    /// A driver-specific step failed (the jail's launcher, a VMM); the cause says which.
    #[error("The sandbox could not be set up")]
    Setup(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl StartError {
    pub fn setup(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        StartError::Setup(Box::new(cause))
    }
}

/// The agent's last words, when it left any.
fn output_suffix(output: &str) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!("; agent output: {output}")
    }
}

/// How a sandbox's init ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentExit {
    Exited(i32),
    Signaled(i32),
    /// It ended, but its status was not ours to read (adopted from a previous server run).
    Unknown,
}

impl std::fmt::Display for AgentExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentExit::Exited(c) => write!(f, "exited with status {c}"),
            AgentExit::Signaled(s) => write!(f, "was killed by signal {s}"),
            AgentExit::Unknown => f.write_str("exited (status unavailable)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkhead_common::error_chain;

    #[test]
    fn start_causes_stay_reachable() {
        let e = DriverError::from(StartError::AgentExited {
            exit: AgentExit::Exited(3),
            output: "boom".into(),
        });
        assert_eq!(e.to_string(), "Sandbox could not be started");
        assert_eq!(
            error_chain(&e),
            "Sandbox could not be started: The agent exited with status 3 before accepting \
             connections; agent output: boom"
        );
        let t = StartError::AgentTimeout {
            timeout: Duration::from_millis(1500),
            output: String::new(),
        };
        assert!(
            t.to_string()
                .starts_with("The agent did not accept connections within 1.5 s:")
        );
    }

    #[test]
    fn unsupported_names_the_operation_and_the_driver() {
        let e = DriverError::unsupported("fake", Operation::Checkpoint);
        assert_eq!(
            e.to_string(),
            "The fake driver cannot checkpoint a sandbox: check the driver's capabilities before \
             asking"
        );
    }
}
