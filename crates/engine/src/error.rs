use crate::driver::DriverError;

/// Errors of engine operations. Each variant maps to one E2B HTTP status in the API layer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("Sandbox {0} not found: it may have timed out or been killed; create a new one")]
    SandboxNotFound(String),
    #[error("Template '{0}' not found: build it with `bulkhead template build {0}` or use 'base'")]
    TemplateNotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("Sandbox capacity exhausted: kill unused sandboxes or raise the server's limit")]
    Capacity,
    #[error("Sandbox could not be started")]
    Driver(#[from] DriverError),
    #[error("Sandbox agent failed: {0}")]
    Agent(String),
    #[error("Secret {0} not found: list secrets with GET /secrets or `bulkhead secrets ls`")]
    SecretNotFound(String),
    #[error("{0} already exists")]
    Conflict(String),
    #[error("Sandbox network setup failed: {0}")]
    Network(String),
    #[error("Cannot {op} sandbox {id}: {reason}")]
    Refused {
        id: String,
        op: crate::lifecycle::Operation,
        reason: crate::lifecycle::Refusal,
    },
    #[error("This server cannot {0} sandboxes yet: upgrade Bulkhead or create a new sandbox")]
    Unsupported(crate::lifecycle::Operation),
    #[error("Storage failure")]
    Store(#[from] bulkhead_store::StoreError),
}
