//! The MCP server value: one per MCP session, holding the engine and the session's state, and
//! the plumbing every tool shares (who is calling, which sandbox a call addresses, argument
//! parsing). The tools themselves are in `tools`.

use std::sync::Arc;

use bulkhead_engine::{Caller, CreateGeneration, CreateRequest, Engine, EngineError};
use rmcp::RoleServer;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{Implementation, JsonObject, ProtocolVersion, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use serde::de::DeserializeOwned;

use crate::agent;
use crate::error::ToolError;
use crate::session::Session;

type Result<T, E = ToolError> = std::result::Result<T, E>;

/// The template of a session's default sandbox (the one with the code interpreter).
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";
/// TTL of a session's default sandbox. The session kills it when it ends (an idle session
/// ends after the transport's keep-alive, 5 minutes), so this only bounds a session that
/// keeps calling for longer; then the next call gets a fresh sandbox.
pub const DEFAULT_SANDBOX_TIMEOUT_SECS: u64 = 3600;

#[derive(Clone)]
pub struct BulkheadMcp {
    pub(crate) engine: Arc<Engine>,
    pub(crate) session: Arc<Session>,
    pub(crate) tool_router: ToolRouter<Self>,
}

/// A sandbox a call resolved to.
pub(crate) struct Resolved {
    pub caller: Caller,
    pub id: String,
    pub token: Option<String>,
    pub is_default: bool,
}

impl Resolved {
    pub fn agent<'a>(&'a self, engine: &'a Arc<Engine>) -> agent::Sandbox<'a> {
        agent::Sandbox {
            engine,
            id: &self.id,
            access_token: self.token.as_deref(),
        }
    }
}

impl BulkheadMcp {
    /// A server for one MCP session.
    pub fn new(engine: Arc<Engine>) -> Self {
        BulkheadMcp {
            session: Arc::new(Session::new(Arc::clone(&engine))),
            engine,
            tool_router: Self::tool_router(),
        }
    }

    /// The caller the HTTP layer authenticated (crates/api puts it in the request's
    /// extensions; rmcp hands the request's parts to the tool).
    pub(crate) fn authenticated(ctx: &RequestContext<RoleServer>) -> Result<Caller> {
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .ok_or(ToolError::Unauthenticated)
    }

    /// The caller of a tool call, who must be the one that opened this session. The HTTP layer
    /// ([`crate::bound`]) already answers another key's requests on a session as if it did
    /// not exist; this is the same rule where the session's state is used.
    pub(crate) fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller> {
        let caller = Self::authenticated(ctx)?;
        if self.session.admits(&caller) {
            Ok(caller)
        } else {
            Err(ToolError::ForeignSession)
        }
    }

    /// The id the API layer gave the HTTP request carrying this call (absent over stdio).
    pub(crate) fn request_id(ctx: &RequestContext<RoleServer>) -> Option<String> {
        let parts = ctx.extensions.get::<http::request::Parts>()?;
        let v = parts.headers.get(bulkhead_common::request_id::HEADER)?;
        bulkhead_common::request_id::accept(v.to_str().ok()?).map(str::to_owned)
    }

    /// The server's address as the client reached it (for signed file URLs).
    pub(crate) fn base_url(ctx: &RequestContext<RoleServer>) -> Option<String> {
        let parts = ctx.extensions.get::<http::request::Parts>()?;
        let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
        let scheme = parts
            .headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .filter(|p| *p == "https" || *p == "http")
            .unwrap_or("http");
        Some(format!("{scheme}://{host}"))
    }

    /// The sandbox a call addresses: the one named, else the session's default (created on
    /// first use). Every use asks the engine with the caller, so a session never reaches a
    /// sandbox its caller could not reach over REST.
    pub(crate) async fn resolve(
        &self,
        ctx: &RequestContext<RoleServer>,
        sandbox_id: Option<String>,
    ) -> Result<Resolved> {
        let caller = self.caller(ctx)?;
        if let Some(id) = sandbox_id.filter(|s| !s.trim().is_empty()) {
            return self.resolve_named(&caller, id.trim()).await;
        }
        if let Some(r) = self.existing_default(&caller).await? {
            return Ok(r);
        }
        let _creating = self.session.creating().await;
        // Another call may have created it while this one waited.
        if let Some(r) = self.existing_default(&caller).await? {
            return Ok(r);
        }
        let info = self
            .engine
            .create(
                &caller,
                CreateRequest {
                    template: DEFAULT_TEMPLATE.into(),
                    timeout: Some(DEFAULT_SANDBOX_TIMEOUT_SECS),
                    generation: CreateGeneration::V2,
                    metadata: [("bulkhead.mcp".to_string(), "session".to_string())].into(),
                    ..Default::default()
                },
            )
            .await?;
        self.session.adopt(&info.id, &caller, false);
        Ok(Resolved {
            caller,
            id: info.id,
            token: info.envd_access_token,
            is_default: true,
        })
    }

    /// A sandbox the call names.
    async fn resolve_named(&self, caller: &Caller, id: &str) -> Result<Resolved> {
        let token = self.engine.get(caller, id).await?.envd_access_token;
        Ok(Resolved {
            caller: caller.clone(),
            id: id.to_string(),
            token,
            is_default: false,
        })
    }

    /// The session's default sandbox, if it has one yet.
    async fn existing_default(&self, caller: &Caller) -> Result<Option<Resolved>> {
        // Only the owner may make the session forget its sandbox (below).
        if !self.session.admits(caller) {
            return Err(ToolError::ForeignSession);
        }
        let Some(id) = self.session.default_sandbox() else {
            return Ok(None);
        };
        let mut target = Resolved {
            caller: caller.clone(),
            id,
            token: None,
            is_default: true,
        };
        match self.engine.get(caller, &target.id).await {
            Ok(info) => {
                target.token = info.envd_access_token;
                Ok(Some(target))
            }
            Err(e) => Err(self.gone(&target, e.into())),
        }
    }

    /// An engine error on a resolved sandbox; a default sandbox that is gone is forgotten so
    /// the next call starts a new one.
    pub(crate) fn gone(&self, target: &Resolved, e: ToolError) -> ToolError {
        if let ToolError::Engine(EngineError::SandboxNotFound(_)) = &e {
            self.session.forget(&target.id);
            if target.is_default {
                return ToolError::invalid(format!(
                    "this session's sandbox {} has ended (it timed out or was killed); call again to get a new one (its state is lost)",
                    target.id
                ));
            }
        }
        e
    }
}

/// The JSON Schema of a tool's arguments (rmcp's, from schemars).
pub(crate) fn input<T: schemars::JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("invalid input schema: {e}"))
}

/// Parse a tool's arguments; a bad value is a tool error the model can read and fix (rmcp's
/// own `Parameters` answers a JSON-RPC error, which clients raise instead of showing).
pub(crate) fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T> {
    serde_json::from_value(serde_json::Value::Object(args))
        .map_err(|e| ToolError::invalid(format!("invalid arguments for {tool}: {e}")))
}

/// What the server tells a client at `initialize` (shared with the stdio bridge).
pub(crate) fn server_info() -> ServerConfig {
    ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        .with_server_info(Implementation::new("bulkhead", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Bulkhead runs code in isolated Linux sandboxes. Call run_code (Python by default) or run_command directly: the session creates its sandbox on first use and keeps it, with kernel state, until the session ends. Use create_sandbox first only to pick a template, lifetime or network policy.",
        )
}

/// Handshake-era versions only: a session maps to a sandbox, and the 2026-07-28 revision
/// removed sessions (SEP-2567); clients that speak it fall back to `initialize`.
pub(crate) fn supported_versions() -> std::borrow::Cow<'static, [ProtocolVersion]> {
    std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(
        &ProtocolVersion::LATEST_WITH_INITIALIZE,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{CreateSandbox, RunCode};

    fn args(v: serde_json::Value) -> JsonObject {
        match v {
            serde_json::Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn bad_arguments_are_tool_errors_naming_the_tool_and_field() {
        let e = parse::<RunCode>("run_code", args(serde_json::json!({}))).unwrap_err();
        assert!(matches!(e, ToolError::Invalid(_)));
        assert_eq!(
            e.to_string(),
            "invalid arguments for run_code: missing field `code`"
        );
        let e = parse::<RunCode>(
            "run_code",
            args(serde_json::json!({"code": "1", "lang": "py"})),
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown field `lang`"), "{e}");
        let e = parse::<CreateSandbox>(
            "create_sandbox",
            args(serde_json::json!({"timeout_seconds": -1})),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid arguments for create_sandbox: invalid value: integer `-1`"),
            "{e}"
        );
    }

    #[test]
    fn schemas_carry_the_field_docs() {
        let schema = input::<RunCode>();
        assert_eq!(schema["required"], serde_json::json!(["code"]));
        let desc = schema["properties"]["code"]["description"]
            .as_str()
            .unwrap();
        assert!(desc.contains("persist"), "{desc}");
        let schema = input::<CreateSandbox>();
        for field in [
            "template",
            "timeout_seconds",
            "allow_internet",
            "allowed_domains",
        ] {
            assert!(
                schema["properties"][field]["description"].is_string(),
                "{field} has no description: {schema:?}"
            );
        }
    }

    #[tokio::test]
    async fn session_state_is_used_only_through_the_engine_with_the_caller() {
        use bulkhead_engine::testing::{FakeEngine, base_template, fake_engine};
        use bulkhead_engine::{EngineConfig, keys, teams};
        let dir = tempfile::tempdir().unwrap();
        let cfg = EngineConfig {
            checkpoint_dir: dir.path().join("checkpoints"),
            ..Default::default()
        };
        let FakeEngine {
            store,
            engine,
            owner: a,
            ..
        } = fake_engine(dir.path(), cfg, base_template()).await;
        teams::create(&store, "b", None).await.unwrap();
        let b = keys::create_in(&store, "kb", "b").await.unwrap().0.caller();
        let a2 = keys::create(&store, "a2").await.unwrap().0.caller();
        let info = engine
            .create(
                &a,
                CreateRequest {
                    template: "base".into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mcp = BulkheadMcp::new(Arc::clone(&engine));
        assert!(mcp.session.admits(&a));
        mcp.session.adopt(&info.id, &a, false);

        // The owner reaches its default sandbox, with the token the engine has for it.
        let r = mcp.existing_default(&a).await.unwrap().unwrap();
        assert_eq!(r.id, info.id);
        assert!(r.token.is_some());
        assert_eq!(r.token, info.envd_access_token);

        // Anyone else is refused the session, and the sandbox is not theirs either.
        assert!(!mcp.session.admits(&b));
        assert!(!mcp.session.admits(&a2));
        assert!(mcp.session.admits(&a));
        assert!(matches!(
            mcp.existing_default(&b).await,
            Err(ToolError::ForeignSession)
        ));
        // The sandbox is not B's either, whatever B's session remembers.
        assert!(matches!(
            mcp.resolve_named(&b, &info.id).await,
            Err(ToolError::Engine(EngineError::SandboxNotFound(_)))
        ));
        assert_eq!(mcp.session.default_sandbox(), Some(info.id.clone()));

        // A default the engine no longer has is forgotten, not served from memory.
        engine.kill(&a, &info.id).await.unwrap();
        let e = mcp.existing_default(&a).await.err().unwrap();
        assert!(
            matches!(e, ToolError::Invalid(ref m) if m.contains(&info.id) && m.contains("ended")),
            "{e}"
        );
        assert!(mcp.session.default_sandbox().is_none());
    }

    #[test]
    fn only_handshake_versions_are_offered() {
        let v = supported_versions();
        assert!(!v.is_empty());
        assert!(v.iter().all(ProtocolVersion::has_initialize), "{v:?}");
    }
}
