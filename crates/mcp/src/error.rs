//! What a tool call can fail with. Every failure reaches the client as a tool result with
//! `isError: true` and a message saying what to do (never a JSON-RPC error, which most agent
//! frameworks surface as a crash rather than something the model can read and correct).

use bulkhead_engine::EngineError;
use rmcp::model::{ContentBlock, IntoContents};

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The engine refused or failed (its messages already say what to do).
    #[error("{0}")]
    Engine(#[from] EngineError),
    /// An argument the model can correct.
    #[error("{0}")]
    Invalid(String),
    /// The request reached the tool without an authenticated caller (the HTTP layer
    /// authenticates; this is a server wiring fault).
    #[error("not authenticated: send the API key in X-API-Key or `Authorization: Bearer <key>`")]
    Unauthenticated,
    /// A call on a session another API key opened (the HTTP layer answers these with 404
    /// before they reach a tool; this is its second line).
    #[error(
        "this MCP session belongs to another API key: open a session of your own (initialize) with your key"
    )]
    ForeignSession,
    /// The sandbox's agent answered with an error.
    #[error("{what} failed in sandbox {sandbox}: {message}")]
    Agent {
        what: &'static str,
        sandbox: String,
        message: String,
    },
    /// The sandbox's template serves no code interpreter on port 49999.
    #[error(
        "sandbox {0} has no code interpreter (its template serves none on port 49999): run code in a sandbox created from 'code-interpreter-v1', or use run_command"
    )]
    NoInterpreter(String),
    /// The call ran out of its time budget.
    #[error("{what} did not finish within {secs} s: raise timeout_seconds, or split the work")]
    Timeout { what: &'static str, secs: u64 },
}

impl ToolError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ToolError::Invalid(message.into())
    }
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        vec![ContentBlock::text(self.to_string())]
    }
}
