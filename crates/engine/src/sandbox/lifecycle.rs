//! The sandbox lifecycle: which operation is allowed in which state, which state it moves the
//! sandbox through, and what the caller is told otherwise. Every verb of the engine asks
//! [`transition`] before it touches a sandbox, so the rules live in this one table and not in
//! the verbs (the shape of youki's `container/state.rs` and Firecracker's `rpc_interface.rs`).
//!
//! E2B's answers where E2B has one: pausing a paused sandbox is a 409 ("already paused", the
//! SDK then returns `false`); connecting to a paused sandbox resumes it (201 instead of 200);
//! resuming a running one is a 409; any call on a sandbox that is changing state is a 409; an
//! ended (or ending) sandbox is a 404.

/// Where a sandbox is in its life (the engine's own type; the store keeps the same states under
/// the same spelling). Transient states are held only while an operation is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// Being created: claimed from the pool or started cold, not yet given its identity.
    Starting,
    Running,
    /// Being frozen (checkpoint in progress).
    Pausing,
    Paused,
    /// Being restored from a pause.
    Resuming,
    /// A snapshot (or a fork's checkpoint) of it is being taken; it runs again afterwards.
    Snapshotting,
    /// Being torn down.
    Killing,
    /// Killed, timed out or died.
    Dead,
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SandboxState {
    /// Every state, for exhaustive tests and listings.
    pub const ALL: [SandboxState; 8] = [
        SandboxState::Starting,
        SandboxState::Running,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Resuming,
        SandboxState::Snapshotting,
        SandboxState::Killing,
        SandboxState::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        bulkhead_store::SandboxState::from(self).as_str()
    }

    pub fn parse(s: &str) -> Option<Self> {
        bulkhead_store::SandboxState::parse(s).map(Self::from)
    }
}

impl From<bulkhead_store::SandboxState> for SandboxState {
    fn from(s: bulkhead_store::SandboxState) -> Self {
        use bulkhead_store::SandboxState as S;
        match s {
            S::Starting => Self::Starting,
            S::Running => Self::Running,
            S::Pausing => Self::Pausing,
            S::Paused => Self::Paused,
            S::Resuming => Self::Resuming,
            S::Snapshotting => Self::Snapshotting,
            S::Killing => Self::Killing,
            S::Dead => Self::Dead,
        }
    }
}

impl From<SandboxState> for bulkhead_store::SandboxState {
    fn from(s: SandboxState) -> Self {
        use SandboxState as S;
        match s {
            S::Starting => Self::Starting,
            S::Running => Self::Running,
            S::Pausing => Self::Pausing,
            S::Paused => Self::Paused,
            S::Resuming => Self::Resuming,
            S::Snapshotting => Self::Snapshotting,
            S::Killing => Self::Killing,
            S::Dead => Self::Dead,
        }
    }
}

/// What a caller asks of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Give a started (pooled or cold) sandbox its identity and hand it to the caller.
    Create,
    /// Read its description (`GET /sandboxes/{id}`).
    Get,
    /// Extend its TTL, resuming it when paused (`POST /sandboxes/{id}/connect`).
    Connect,
    /// Set its TTL (`POST /sandboxes/{id}/timeout`).
    SetTimeout,
    /// Stop it for good.
    Kill,
    /// Read its resource usage.
    Metrics,
    /// Replace its network config.
    UpdateNetwork,
    /// Open a stream to its agent (SDK traffic through the routing proxy).
    AgentTraffic,
    /// Freeze it (checkpoint, then stop).
    Pause,
    /// Restore a paused sandbox (the older `POST /sandboxes/{id}/resume`).
    Resume,
    /// Take a snapshot of it (a new template); it keeps its state afterwards.
    Snapshot,
    /// Start copies of it from a checkpoint; it keeps its state afterwards.
    Fork,
}

impl Operation {
    /// Every operation, for exhaustive tests.
    pub const ALL: [Operation; 12] = [
        Operation::Create,
        Operation::Get,
        Operation::Connect,
        Operation::SetTimeout,
        Operation::Kill,
        Operation::Metrics,
        Operation::UpdateNetwork,
        Operation::AgentTraffic,
        Operation::Pause,
        Operation::Resume,
        Operation::Snapshot,
        Operation::Fork,
    ];

    /// The verb as it appears in messages ("Cannot pause sandbox …").
    pub fn verb(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Get => "get",
            Operation::Connect => "connect to",
            Operation::SetTimeout => "set the timeout of",
            Operation::Kill => "kill",
            Operation::Metrics => "read the metrics of",
            Operation::UpdateNetwork => "update the network of",
            Operation::AgentTraffic => "reach",
            Operation::Pause => "pause",
            Operation::Resume => "resume",
            Operation::Snapshot => "snapshot",
            Operation::Fork => "fork",
        }
    }

    /// May this operation run on a sandbox whose agent is too old to be driven? Only the ones
    /// that do not talk to the agent: describing it and killing it (so it is never lost and
    /// never stuck).
    pub fn works_with_unsupported_agent(self) -> bool {
        matches!(self, Operation::Get | Operation::Kill)
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.verb())
    }
}

/// An allowed operation: the state the sandbox is in while it runs and the state it ends in.
/// Operations that change nothing have `during == after == ` the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub during: SandboxState,
    pub after: SandboxState,
}

impl Step {
    fn stay(s: SandboxState) -> Self {
        Step {
            during: s,
            after: s,
        }
    }
    fn through(during: SandboxState, after: SandboxState) -> Self {
        Step { during, after }
    }
    /// Does the operation change the sandbox's state at all?
    pub fn is_change(self, from: SandboxState) -> bool {
        self.during != from || self.after != from
    }
}

/// Why an operation is refused. The engine adds the sandbox id and the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The sandbox has ended or is being killed: to the client it is gone (404).
    #[error("it has ended; create a new one")]
    Ended,
    /// E2B: 409 "already paused" (the SDK's `pause()` then returns false).
    #[error("it is already paused")]
    AlreadyPaused,
    /// E2B: 409 on resuming a running sandbox.
    #[error("it is already running")]
    AlreadyRunning,
    /// It is paused and this operation needs it running.
    #[error("it is paused; resume it with connect first")]
    Paused,
    /// Another operation is changing its state (E2B: 409, "sandbox changing state").
    #[error("it is {0}; try again in a moment")]
    Busy(SandboxState),
    /// Only a sandbox being created can be created.
    #[error("it already exists")]
    Exists,
}

/// The state as E2B's clients know it (`running` or `paused`): a sandbox changing state is
/// still what it was (or what it is about to be again) until the change is done.
pub fn e2b_state(state: SandboxState) -> &'static str {
    use SandboxState as S;
    match state {
        S::Starting | S::Running | S::Pausing | S::Snapshotting | S::Killing => "running",
        S::Paused | S::Resuming => "paused",
        S::Dead => "dead",
    }
}

/// The one transition function: may `op` run on a sandbox in `state`, and through which states?
pub fn transition(state: SandboxState, op: Operation) -> Result<Step, Refusal> {
    use Operation as O;
    use SandboxState as S;
    match (state, op) {
        // Gone, or going: a 404 to every caller; a second kill is a 404 too (E2B: kill → false).
        (S::Dead | S::Killing, _) => Err(Refusal::Ended),

        (S::Starting, O::Create) => Ok(Step::through(S::Starting, S::Running)),
        (_, O::Create) => Err(Refusal::Exists),

        // Kill wins over everything in flight: the operation in progress fails on its own.
        (_, O::Kill) => Ok(Step::through(S::Killing, S::Dead)),

        (S::Starting, _) => Err(Refusal::Busy(S::Starting)),

        (S::Running, O::Get | O::Connect | O::SetTimeout | O::Metrics | O::UpdateNetwork)
        | (S::Running, O::AgentTraffic) => Ok(Step::stay(S::Running)),
        (S::Running, O::Pause) => Ok(Step::through(S::Pausing, S::Paused)),
        (S::Running, O::Resume) => Err(Refusal::AlreadyRunning),
        (S::Running, O::Snapshot | O::Fork) => Ok(Step::through(S::Snapshotting, S::Running)),

        (S::Paused, O::Get) => Ok(Step::stay(S::Paused)),
        // E2B: connect resumes a paused sandbox (answered with 201).
        (S::Paused, O::Connect | O::Resume) => Ok(Step::through(S::Resuming, S::Running)),
        (S::Paused, O::Pause) => Err(Refusal::AlreadyPaused),
        (S::Paused, O::Snapshot | O::Fork) => Ok(Step::through(S::Snapshotting, S::Paused)),
        (S::Paused, O::SetTimeout | O::Metrics | O::UpdateNetwork | O::AgentTraffic) => {
            Err(Refusal::Paused)
        }

        // Describing a sandbox is always fine while it exists.
        (S::Pausing | S::Resuming | S::Snapshotting, O::Get) => Ok(Step::stay(state)),
        (S::Pausing | S::Resuming | S::Snapshotting, _) => Err(Refusal::Busy(state)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Operation as O;
    use SandboxState as S;

    /// The whole table, written out once more by hand: every (state, operation) pair.
    fn expected(state: S, op: O) -> Result<Step, Refusal> {
        let stay = Ok(Step {
            during: state,
            after: state,
        });
        let through = |during, after| Ok(Step { during, after });
        match state {
            S::Dead | S::Killing => Err(Refusal::Ended),
            S::Starting => match op {
                O::Create => through(S::Starting, S::Running),
                O::Kill => through(S::Killing, S::Dead),
                _ => Err(Refusal::Busy(S::Starting)),
            },
            S::Running => match op {
                O::Create => Err(Refusal::Exists),
                O::Get
                | O::Connect
                | O::SetTimeout
                | O::Metrics
                | O::UpdateNetwork
                | O::AgentTraffic => stay,
                O::Kill => through(S::Killing, S::Dead),
                O::Pause => through(S::Pausing, S::Paused),
                O::Resume => Err(Refusal::AlreadyRunning),
                O::Snapshot | O::Fork => through(S::Snapshotting, S::Running),
            },
            S::Paused => match op {
                O::Create => Err(Refusal::Exists),
                O::Get => stay,
                O::Connect | O::Resume => through(S::Resuming, S::Running),
                O::Kill => through(S::Killing, S::Dead),
                O::Pause => Err(Refusal::AlreadyPaused),
                O::Snapshot | O::Fork => through(S::Snapshotting, S::Paused),
                O::SetTimeout | O::Metrics | O::UpdateNetwork | O::AgentTraffic => {
                    Err(Refusal::Paused)
                }
            },
            S::Pausing | S::Resuming | S::Snapshotting => match op {
                O::Create => Err(Refusal::Exists),
                O::Get => stay,
                O::Kill => through(S::Killing, S::Dead),
                _ => Err(Refusal::Busy(state)),
            },
        }
    }

    #[test]
    fn every_state_and_operation_pair() {
        let mut checked = 0;
        for state in S::ALL {
            for op in O::ALL {
                assert_eq!(
                    transition(state, op),
                    expected(state, op),
                    "{state} × {op:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, S::ALL.len() * O::ALL.len());
    }

    #[test]
    fn every_change_ends_in_a_stable_state() {
        for state in S::ALL {
            for op in O::ALL {
                if let Ok(step) = transition(state, op)
                    && step.is_change(state)
                {
                    assert!(
                        matches!(step.after, S::Running | S::Paused | S::Dead),
                        "{state} × {op:?} ends in {}",
                        step.after
                    );
                }
            }
        }
    }

    #[test]
    fn e2b_answers() {
        assert_eq!(transition(S::Paused, O::Pause), Err(Refusal::AlreadyPaused));
        assert_eq!(
            transition(S::Paused, O::Connect).map(|s| s.during),
            Ok(S::Resuming)
        );
        assert_eq!(
            transition(S::Running, O::Resume),
            Err(Refusal::AlreadyRunning)
        );
        assert_eq!(transition(S::Dead, O::Kill), Err(Refusal::Ended));
        assert!(
            !transition(S::Running, O::Metrics)
                .unwrap()
                .is_change(S::Running)
        );
    }

    #[test]
    fn only_describe_and_kill_reach_an_unsupported_agent() {
        let allowed: Vec<O> = O::ALL
            .into_iter()
            .filter(|o| o.works_with_unsupported_agent())
            .collect();
        assert_eq!(allowed, vec![O::Get, O::Kill]);
    }
}
