//! The tools. Each one parses its arguments, resolves the sandbox it addresses and translates
//! into one engine verb or one agent call; none keeps sandbox state of its own.

use std::borrow::Cow;
use std::time::Duration;

use bulkhead_engine::{CreateGeneration, CreateRequest, ListRequest, ResumeRequest, SandboxInfo};
use bulkhead_envd::rest::{FileOperation, file_signature};
use bytes::Bytes;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, ProtocolVersion, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use serde_json::json;

use crate::error::ToolError;
use crate::execution;
use crate::params::{
    CreateCodeContext, CreateSandbox, FileUrl, ListFiles, ListSandboxes, ReadFile, ResumeSandbox,
    RunCode, RunCommand, SandboxRef, UrlOperation, WriteFile,
};
use crate::server::{BulkheadMcp, DEFAULT_TEMPLATE, input, parse, server_info, supported_versions};

type ToolResult = Result<CallToolResult, ToolError>;

/// Time budget of calls that only move a little data (files, listings, contexts).
const QUICK: Duration = Duration::from_secs(60);
const DEFAULT_CODE_TIMEOUT_SECS: u64 = 300;
const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 60;
const DEFAULT_URL_EXPIRY_SECS: u64 = 3600;
/// Largest file read_file returns inline; bigger ones are for file_url.
const MAX_INLINE_READ: usize = 1 << 20;

fn json_result(value: serde_json::Value) -> ToolResult {
    Ok(CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(&value).unwrap_or_default(),
    )]))
}

fn sandbox_json(info: &SandboxInfo) -> serde_json::Value {
    json!({
        "sandbox_id": info.id,
        "template": info.alias.clone().unwrap_or_else(|| info.template_id.clone()),
        "state": info.state,
        "started_at": info.started_at,
        "end_at": info.end_at,
        "cpu_count": info.cpu_count,
        "memory_mb": info.memory_mb,
        "allow_internet": info.allow_internet_access,
        "network": info.network,
        "metadata": info.metadata,
    })
}

fn secs(v: Option<u64>, default: u64, tool: &str) -> Result<Duration, ToolError> {
    match v.unwrap_or(default) {
        0 => Err(ToolError::invalid(format!(
            "{tool}: timeout_seconds must be at least 1"
        ))),
        s => Ok(Duration::from_secs(s)),
    }
}

#[tool_router(vis = "pub(crate)")]
impl BulkheadMcp {
    #[tool(
        description = "Create a new isolated sandbox (a Linux machine) and return its sandbox_id. Optional: the session creates one automatically on first use, so call this only to choose the template, the lifetime or the network policy. The first sandbox a session creates becomes its default for the other tools.",
        input_schema = input::<CreateSandbox>()
    )]
    async fn create_sandbox(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let p: CreateSandbox = parse("create_sandbox", args)?;
        let caller = self.caller(&ctx)?;
        let network =
            (!p.allowed_domains.is_empty() || !p.denied_destinations.is_empty()).then(|| {
                bulkhead_engine::SandboxNetwork {
                    allow_out: p.allowed_domains,
                    deny_out: p.denied_destinations,
                    rules: Default::default(),
                }
            });
        let info = self
            .engine
            .create(
                &caller,
                CreateRequest {
                    template: p.template.unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
                    timeout: p.timeout_seconds,
                    metadata: p.metadata,
                    env_vars: p.envs,
                    generation: CreateGeneration::V2,
                    allow_internet_access: p.allow_internet,
                    network,
                    ..Default::default()
                },
            )
            .await?;
        self.session.adopt(&info.id, &caller, p.keep_after_session);
        let mut v = sandbox_json(&info);
        v["session_default"] = json!(self.session.default_sandbox().as_deref() == Some(&info.id));
        json_result(v)
    }

    #[tool(
        description = "Run code in a Jupyter kernel inside the sandbox and return stdout, stderr, rich results (text, markdown, chart data) and the error if the code raised; plots (e.g. matplotlib) come back as PNG images. State (variables, imports) persists across calls in the same context, so build on earlier calls instead of repeating them.",
        input_schema = input::<RunCode>()
    )]
    async fn run_code(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: RunCode = parse("run_code", args)?;
        if p.context_id.as_deref().is_some_and(|c| !c.is_empty())
            && p.language.as_deref().is_some_and(|l| !l.is_empty())
        {
            return Err(ToolError::invalid(
                "run_code: give either language or context_id, not both (a context already has a language)",
            ));
        }
        let limit = secs(p.timeout_seconds, DEFAULT_CODE_TIMEOUT_SECS, "run_code")?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let mut body = json!({ "code": p.code });
        if let Some(l) = p.language.filter(|l| !l.is_empty()) {
            body["language"] = json!(l);
        }
        if let Some(c) = p.context_id.filter(|c| !c.is_empty()) {
            body["context_id"] = json!(c);
        }
        let stream = target
            .agent(&self.engine)
            .execute(&body, limit)
            .await
            .map_err(|e| self.gone(&target, e))?;
        Ok(CallToolResult::success(
            execution::parse(&stream).into_contents(),
        ))
    }

    #[tool(
        description = "Create a separate code context (its own kernel and variables) and return its context_id, for run_code calls that must not share state with the default context.",
        input_schema = input::<CreateCodeContext>()
    )]
    async fn create_code_context(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let p: CreateCodeContext = parse("create_code_context", args)?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let mut body = json!({});
        if let Some(l) = p.language {
            body["language"] = json!(l);
        }
        if let Some(c) = p.cwd {
            body["cwd"] = json!(c);
        }
        let context = target
            .agent(&self.engine)
            .create_context(&body, QUICK)
            .await
            .map_err(|e| self.gone(&target, e))?;
        json_result(json!({
            "context_id": context.get("id"),
            "language": context.get("language"),
            "cwd": context.get("cwd"),
            "sandbox_id": target.id,
        }))
    }

    #[tool(
        description = "Run a shell command (bash -l -c) in the sandbox and return its exit code, stdout and stderr. For long-running work raise timeout_seconds; the command is killed when it runs out.",
        input_schema = input::<RunCommand>()
    )]
    async fn run_command(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: RunCommand = parse("run_command", args)?;
        if p.command.trim().is_empty() {
            return Err(ToolError::invalid("run_command: command is empty"));
        }
        let limit = secs(
            p.timeout_seconds,
            DEFAULT_COMMAND_TIMEOUT_SECS,
            "run_command",
        )?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let out = target
            .agent(&self.engine)
            .run_command(&p.command, p.cwd, p.envs, limit)
            .await
            .map_err(|e| self.gone(&target, e))?;
        json_result(serde_json::to_value(&out).unwrap_or_default())
    }

    #[tool(
        description = "Read a text file from the sandbox. For binary or large files use file_url to get a download URL.",
        input_schema = input::<ReadFile>()
    )]
    async fn read_file(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: ReadFile = parse("read_file", args)?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let data = target
            .agent(&self.engine)
            .read_file(&p.path, QUICK)
            .await
            .map_err(|e| self.gone(&target, e))?;
        if data.len() > MAX_INLINE_READ {
            return Err(ToolError::invalid(format!(
                "read_file: {} is {} bytes, more than the {} read_file returns; use file_url with operation \"download\"",
                p.path,
                data.len(),
                MAX_INLINE_READ
            )));
        }
        match String::from_utf8(data.to_vec()) {
            Ok(text) => Ok(CallToolResult::success(vec![ContentBlock::text(text)])),
            Err(_) => Err(ToolError::invalid(format!(
                "read_file: {} is not UTF-8 text; use file_url with operation \"download\" for binary files",
                p.path
            ))),
        }
    }

    #[tool(
        description = "Write a text file in the sandbox (parent directories are created, an existing file is replaced).",
        input_schema = input::<WriteFile>()
    )]
    async fn write_file(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: WriteFile = parse("write_file", args)?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let len = p.content.len();
        target
            .agent(&self.engine)
            .write_file(&p.path, Bytes::from(p.content), QUICK)
            .await
            .map_err(|e| self.gone(&target, e))?;
        json_result(json!({ "path": p.path, "bytes_written": len, "sandbox_id": target.id }))
    }

    #[tool(
        description = "List a directory in the sandbox: name, type (file/dir/symlink), path and size of each entry.",
        input_schema = input::<ListFiles>()
    )]
    async fn list_files(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: ListFiles = parse("list_files", args)?;
        let depth = p.depth.unwrap_or(1);
        if !(1..=10).contains(&depth) {
            return Err(ToolError::invalid("list_files: depth must be from 1 to 10"));
        }
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let path = p.path.unwrap_or_default();
        let listing = target
            .agent(&self.engine)
            .list_dir(&path, depth, QUICK)
            .await
            .map_err(|e| self.gone(&target, e))?;
        let entries: Vec<_> = listing
            .entries
            .iter()
            .map(|e| {
                let kind = match e.r#type {
                    1 => "file",
                    2 => "dir",
                    3 => "symlink",
                    _ => "unknown",
                };
                json!({ "name": e.name, "type": kind, "path": e.path, "size": e.size })
            })
            .collect();
        json_result(json!({ "entries": entries }))
    }

    #[tool(
        description = "Get a signed URL to download a file from the sandbox (HTTP GET) or upload one to it (HTTP POST, multipart or octet-stream), for files too large or binary for read_file/write_file. Anyone with the URL can use it until it expires.",
        input_schema = input::<FileUrl>()
    )]
    async fn file_url(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: FileUrl = parse("file_url", args)?;
        if p.path.trim().is_empty() {
            return Err(ToolError::invalid("file_url: path is empty"));
        }
        let expiry = secs(p.expires_in_seconds, DEFAULT_URL_EXPIRY_SECS, "file_url")?;
        let base = Self::base_url(&ctx).ok_or_else(|| {
            ToolError::invalid("file_url: the request carried no Host header to build the URL on")
        })?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let op = match p.operation {
            UrlOperation::Download => FileOperation::Read,
            UrlOperation::Upload => FileOperation::Write,
        };
        let mut url = format!("{base}/files?path={}", urlencoding::encode(&p.path));
        let expires_at = chrono::Utc::now().timestamp() + expiry.as_secs() as i64;
        match &target.token {
            Some(token) => {
                let sig = file_signature(&p.path, op, "", token, Some(expires_at));
                url.push_str(&format!(
                    "&signature={}&signature_expiration={expires_at}",
                    urlencoding::encode(&sig)
                ));
            }
            // An unsecured sandbox takes unsigned URLs, but then the proxy cannot tell which
            // sandbox the URL is for.
            None => {
                return Err(ToolError::invalid(format!(
                    "file_url: sandbox {} has no access token, so its files cannot be reached by a signed URL; create the sandbox with create_sandbox",
                    target.id
                )));
            }
        }
        json_result(json!({
            "url": url,
            "method": if op == FileOperation::Read { "GET" } else { "POST" },
            "expires_at": expires_at,
            "sandbox_id": target.id,
        }))
    }

    #[tool(
        description = "List this API key's sandboxes (running and paused) with their state, template and end time.",
        input_schema = input::<ListSandboxes>()
    )]
    async fn list_sandboxes(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let p: ListSandboxes = parse("list_sandboxes", args)?;
        let caller = self.caller(&ctx)?;
        let list = self
            .engine
            .list_all(
                &caller,
                &ListRequest {
                    metadata: p.metadata,
                    ..Default::default()
                },
            )
            .await?;
        let default = self.session.default_sandbox();
        let items: Vec<_> = list
            .iter()
            .map(|i| {
                let mut v = sandbox_json(i);
                v["session_default"] = json!(default.as_deref() == Some(&i.id));
                v
            })
            .collect();
        json_result(json!({ "sandboxes": items }))
    }

    #[tool(
        description = "Pause a sandbox: its memory and files are saved and it stops using CPU; resume_sandbox brings it back with its state (running processes and kernel variables included).",
        input_schema = input::<SandboxRef>()
    )]
    async fn pause_sandbox(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: SandboxRef = parse("pause_sandbox", args)?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        self.engine
            .pause(&target.caller, &target.id, true)
            .await
            .map_err(|e| self.gone(&target, e.into()))?;
        json_result(json!({ "sandbox_id": target.id, "state": "paused" }))
    }

    #[tool(
        description = "Resume a paused sandbox (or extend a running one's lifetime) and return its details.",
        input_schema = input::<ResumeSandbox>()
    )]
    async fn resume_sandbox(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult {
        let p: ResumeSandbox = parse("resume_sandbox", args)?;
        let target = self.resolve(&ctx, p.sandbox_id).await?;
        let (info, resumed) = self
            .engine
            .connect(
                &target.caller,
                &target.id,
                ResumeRequest {
                    timeout: p.timeout_seconds,
                    memory: true,
                },
            )
            .await
            .map_err(|e| self.gone(&target, e.into()))?;
        let mut v = sandbox_json(&info);
        v["resumed"] = json!(resumed);
        json_result(v)
    }

    #[tool(
        description = "Kill a sandbox now; its processes and files are gone. Killing the session's default sandbox makes the next call start a fresh one.",
        input_schema = input::<SandboxRef>()
    )]
    async fn kill_sandbox(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> ToolResult {
        let p: SandboxRef = parse("kill_sandbox", args)?;
        let caller = self.caller(&ctx)?;
        let id = match p.sandbox_id.filter(|s| !s.trim().is_empty()) {
            Some(id) => id.trim().to_string(),
            None => self.session.default_sandbox().ok_or_else(|| {
                ToolError::invalid("kill_sandbox: this session has no sandbox; pass sandbox_id")
            })?,
        };
        self.engine.kill(&caller, &id).await?;
        self.session.forget(&id);
        json_result(json!({ "sandbox_id": id, "killed": true }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for BulkheadMcp {
    fn get_info(&self) -> ServerConfig {
        server_info()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        supported_versions()
    }

    /// The default handshake, which also binds the session to the API key that opened it.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, rmcp::ErrorData> {
        if let Ok(caller) = BulkheadMcp::authenticated(&context) {
            self.session.admits(&caller);
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// The macro's `call_tool`, run with the HTTP request's id as the current one (rmcp runs
    /// tools in the session's own task, where the API layer's id is not set), so the agent
    /// calls a tool makes carry it.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let id = BulkheadMcp::request_id(&context);
        let call = async {
            let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
            self.tool_router.call(tcc).await
        };
        match id {
            Some(id) => bulkhead_common::request_id::scope(id, call).await,
            None => call.await,
        }
    }
}
