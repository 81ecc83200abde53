//! Tool arguments. The doc comments become the JSON Schema `description`s the model reads, so
//! they say what a value means and what happens when it is left out. Unknown fields are
//! refused (a misspelt argument is a clear error, not silently ignored).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template id or alias. Default: "code-interpreter-v1" (Python with a Jupyter kernel,
    /// numpy/pandas/matplotlib). "base" is a plain Debian userland without the interpreter.
    #[serde(default)]
    pub template: Option<String>,
    /// Seconds the sandbox lives before it is killed (its TTL). Default: the server's default
    /// (300 s unless configured).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Whether the sandbox may reach the internet at all. Default: the server's default.
    /// With false, only `allowed_domains` are reachable.
    #[serde(default)]
    pub allow_internet: Option<bool>,
    /// Domains (example.com, *.example.com), IPs or CIDRs the sandbox may reach. When given
    /// with allow_internet=false, these are the only destinations allowed.
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    /// IPs or CIDRs the sandbox may not reach (allowed_domains wins over this).
    #[serde(default)]
    pub denied_destinations: Vec<String>,
    /// Environment variables set for every process and code execution in the sandbox.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Key/value labels, shown by list_sandboxes.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Keep the sandbox after this MCP session ends (it then lives until its timeout).
    /// Default false: sandboxes created in a session are killed when the session closes.
    #[serde(default)]
    pub keep_after_session: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The code to run, e.g. "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf".
    /// Variables, imports and functions persist across calls in the same context.
    pub code: String,
    /// Language of the default context to run in: "python" (default), "javascript", "r",
    /// "java" or "bash", as the template provides. Leave out when context_id is given.
    #[serde(default)]
    pub language: Option<String>,
    /// A context from create_code_context (its own kernel and state). Default: the
    /// language's default context, shared by every call without a context_id.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Sandbox to run in. Default: this session's sandbox (created on first use).
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Seconds to wait for the execution. Default 300.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCodeContext {
    /// Language of the context's kernel: "python" (default), "javascript", "r", "java", "bash".
    #[serde(default)]
    pub language: Option<String>,
    /// Working directory of the kernel. Default: the user's home.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Sandbox to create it in. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// A shell command line, run with `bash -l -c`, e.g. "ls -la /tmp && pip list".
    pub command: String,
    /// Working directory. Default: the user's home.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Seconds before the command is killed. Default 60.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Sandbox to run in. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// Path of the file; relative paths are from the user's home.
    pub path: String,
    /// Sandbox to read from. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// Path of the file; parent directories are created; an existing file is replaced.
    pub path: String,
    /// The file's content as text (UTF-8).
    pub content: String,
    /// Sandbox to write to. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// Directory to list; relative paths are from the user's home. Default: the home.
    #[serde(default)]
    pub path: Option<String>,
    /// How many levels deep to list (1 = the directory's own entries). Default 1, at most 10.
    #[serde(default)]
    pub depth: Option<u32>,
    /// Sandbox to list in. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum UrlOperation {
    /// A URL to GET the file from.
    Download,
    /// A URL to POST the file to (multipart/form-data or application/octet-stream).
    Upload,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileUrl {
    /// Path of the file in the sandbox (absolute, or relative to the user's home).
    pub path: String,
    /// "download" or "upload".
    pub operation: UrlOperation,
    /// Seconds the URL stays valid. Default 3600.
    #[serde(default)]
    pub expires_in_seconds: Option<u64>,
    /// Sandbox of the file. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxRef {
    /// The sandbox. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSandbox {
    /// The paused sandbox. Default: this session's sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// New TTL in seconds from now. Default: the server's default.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxes {
    /// Only sandboxes whose metadata has all these key/value pairs.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}
