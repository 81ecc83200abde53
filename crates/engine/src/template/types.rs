//! The data of template builds (leaf module): requests, status, log entries, the records of
//! builds in flight and of built templates, and the build error. The verbs are in
//! `template_builds`, the execution in `template_builder`.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::template::spec::BuildStep;
use crate::types::TemplateRuntime;

/// Largest build-context archive accepted for one COPY step.
pub const MAX_UPLOAD_BYTES: u64 = 1 << 30;
/// Log entries kept per build (older ones are dropped first).
pub(crate) const MAX_LOG_ENTRIES: usize = 20_000;

#[derive(Debug, thiserror::Error)]
pub enum TemplateBuildError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the upload is larger than the limit of {limit} bytes; copy fewer files per step")]
    TooLarge { limit: u64 },
    #[error("the template's start command did not become ready: {0}")]
    StartFailed(StepError),
    #[error("template builds are not configured on this server (no template directory)")]
    NotConfigured,
    /// Storing a build's files failed. The message names the step only; the host path goes to
    /// the server's log (never into a response).
    #[error(
        "The template build could not {what}: try again, and if it keeps failing ask the operator to check the server's disk and log"
    )]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Why a template build failed: the base, a step, its build sandbox, or the finished tree's
/// start and ready check. The message is what the build's status and log carry (the SDK shows
/// it to the user); the cause stays typed. Host paths never appear in it (they go to the log).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("no base image or template given")]
    NoBase,
    #[error("template {0:?} not found on this server")]
    NoSuchTemplate(String),
    #[error("{0}")]
    Pull(bulkhead_images::oci::OciError),
    #[error("checking the image failed: {0}")]
    CheckImage(tokio::task::JoinError),
    #[error(
        "image {image} cannot run as a sandbox: it has no {missing}. Start from an image with glibc \
         and bash, such as a Debian- or Ubuntu-based one (from_debian_image(), \
         from_ubuntu_image(), from_python_image(), from_node_image())"
    )]
    NotRunnable { image: String, missing: String },
    #[error("starting the build sandbox failed: {0}")]
    SandboxStart(crate::node::driver::DriverError),
    #[error("the build sandbox's agent did not start: {0}")]
    AgentStart(Box<dyn std::error::Error + Send + Sync>),
    #[error("the build sandbox's network failed: {0}")]
    Network(Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    Reach(crate::node::driver::DriverError),
    #[error("{0}")]
    Upload(Box<TemplateBuildError>),
    #[error("the files of step {step} ({file}) were not uploaded")]
    NotUploaded { step: String, file: String },
    #[error("copying the files into the build sandbox failed: {0}")]
    CopyFiles(crate::template::exec::ExecError),
    #[error("step {step} ({what}) failed: {source}")]
    Exec {
        step: String,
        what: String,
        source: crate::template::exec::ExecError,
    },
    /// `output`: the last lines the step printed, as `":\n…"` (empty when it printed nothing).
    #[error("step {step} ({what}) failed with exit code {code}{output}")]
    Exit {
        step: String,
        what: String,
        code: i32,
        output: String,
    },
    #[error("preparing the step's work directory failed: {0}")]
    WorkDir(std::io::Error),
    #[error("exporting the step's changes failed: {0}")]
    Export(crate::node::driver::DriverError),
    #[error("step {step} added {size} bytes, over the server's limit of {limit} bytes per step")]
    TooBig { step: String, size: u64, limit: u64 },
    #[error("the start command could not be started: {0}")]
    StartCommand(crate::template::exec::ExecError),
    #[error("the start command could not be started (exit code {0})")]
    StartCommandExit(i32),
    /// `output`: what the last check printed, as `": …"` (empty when nothing).
    #[error("the ready check {cmd:?} did not pass within {limit:?}{output}")]
    NotReady {
        cmd: String,
        limit: std::time::Duration,
        output: String,
    },
    #[error("read /etc/passwd: {0}")]
    ReadPasswd(std::io::Error),
    #[error("the template has no /etc/passwd file")]
    NoPasswd,
    #[error(
        "user {0:?} does not exist in the template: create it first, e.g. \
         .run_cmd(\"useradd -m {0}\", user=\"root\")"
    )]
    NoSuchUser(String),
    #[error("user {0:?} does not exist")]
    NoHome(String),
}

impl StepError {
    /// A build sandbox on a pulled image whose agent does not come up: most likely the image's
    /// C library is older than the one the agent was built against.
    pub(crate) fn message_for_image(&self) -> String {
        match self {
            StepError::AgentStart(_) => format!(
                "{self} (the image's GNU C library may be older than the one Bulkhead's agent \
                 needs; start from a current Debian or Ubuntu based image)"
            ),
            _ => self.to_string(),
        }
    }
}

/// `TemplateBuildError::Io` for step `what` on `path` (logged here, kept out of the message).
pub(crate) fn io_err(
    what: &'static str,
    path: Option<&std::path::Path>,
) -> impl FnOnce(io::Error) -> TemplateBuildError {
    let path = path.map(|p| p.display().to_string());
    move |source| {
        tracing::error!(path = path.as_deref().unwrap_or("-"), error = %source, "template build: could not {what}");
        TemplateBuildError::Io { what, source }
    }
}

/// `POST /v3/templates`.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// `name` or `name:tag`.
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct BuildCreated {
    pub template_id: String,
    pub build_id: String,
    pub name: String,
    pub tags: Vec<String>,
}

/// `POST /v2/templates/{id}/builds/{build}`: what to build.
#[derive(Debug, Clone, Default)]
pub struct BuildStart {
    pub from_image: Option<String>,
    /// `fromImageRegistry`: credentials for this build's pull only (never stored or logged;
    /// their `Debug` is redacted).
    pub registry_credentials: Option<bulkhead_images::oci::RegistryCredentials>,
    pub from_template: Option<String>,
    pub force: bool,
    pub steps: Vec<BuildStep>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildLogEntry {
    pub timestamp_ms: i64,
    /// `info`, `warn`, `error`, `debug`.
    pub level: &'static str,
    pub message: String,
    /// `base`, a 1-based step number, or `finalize`.
    pub step: Option<String>,
}

#[derive(Debug, Clone)]
pub struct BuildFailure {
    pub message: String,
    pub step: Option<String>,
}

/// A build's status with the log entries from an offset on.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub template_id: String,
    pub build_id: String,
    pub status: BuildStatus,
    pub entries: Vec<BuildLogEntry>,
    pub failure: Option<BuildFailure>,
    /// The last log entries, for the failure's context.
    pub failure_entries: Vec<BuildLogEntry>,
}

/// One build in flight or finished (kept in memory for this server's life).
pub(crate) struct BuildRecord {
    /// The team of the key that requested it: the template is this team's, and only its
    /// keys see the build.
    pub(crate) team_id: String,
    pub(crate) template_id: String,
    pub(crate) build_id: String,
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) cpu_count: u32,
    pub(crate) memory_mb: u64,
    pub(crate) state: Mutex<BuildState>,
}

pub(crate) struct BuildState {
    pub(crate) status: BuildStatus,
    /// A ring: a chatty step drops the oldest entries without shifting the rest.
    pub(crate) logs: std::collections::VecDeque<BuildLogEntry>,
    /// Entries dropped from the front (so offsets stay stable).
    pub(crate) dropped: usize,
    pub(crate) failure: Option<BuildFailure>,
}

impl BuildRecord {
    pub(crate) fn log(&self, level: &'static str, step: Option<&str>, message: impl Into<String>) {
        let mut s = self.state.lock().expect("build state");
        s.logs.push_back(BuildLogEntry {
            timestamp_ms: now_ms(),
            level,
            message: message.into(),
            step: step.map(str::to_owned),
        });
        if s.logs.len() > MAX_LOG_ENTRIES {
            s.logs.pop_front();
            s.dropped += 1;
        }
    }

    pub(crate) fn finish(&self, failure: Option<BuildFailure>) {
        let mut s = self.state.lock().expect("build state");
        s.status = if failure.is_some() {
            BuildStatus::Error
        } else {
            BuildStatus::Ready
        };
        s.failure = failure;
    }
}

/// One finished build of a custom template.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BuiltTemplate {
    pub(crate) rootfs: PathBuf,
    pub(crate) content_hash: String,
    pub(crate) runtime: TemplateRuntime,
    pub(crate) created_at_ms: i64,
}

/// A custom template as saved in `<template dir>/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CustomTemplate {
    pub(crate) id: String,
    /// The team that built it (only its keys see, start, retag or delete it). Files saved
    /// before templates had teams were built by the seeded default team's keys.
    #[serde(default = "default_team")]
    pub(crate) team_id: String,
    /// Unique within the team.
    pub(crate) name: String,
    pub(crate) cpu_count: u32,
    pub(crate) memory_mb: u64,
    pub(crate) created_at_ms: i64,
    pub(crate) builds: BTreeMap<String, BuiltTemplate>,
    /// Tag → build id; `default` is what the bare name starts.
    pub(crate) tags: BTreeMap<String, (String, i64)>,
}

fn default_team() -> String {
    bulkhead_store::DEFAULT_TEAM.to_owned()
}

impl CustomTemplate {
    /// What the bare name starts: the `default` tag, or the most recently tagged build when a
    /// template was only ever built with explicit tags. (Build id, when tagged.)
    pub(crate) fn main_build(&self) -> Option<&(String, i64)> {
        self.tags
            .get(DEFAULT_TAG)
            .or_else(|| self.tags.values().max_by_key(|(_, at)| *at))
    }
}

/// The engine's template-build state.
#[derive(Default)]
pub struct TemplateBuilds {
    pub(crate) builds: Mutex<HashMap<String, Arc<BuildRecord>>>,
    pub(crate) custom: Mutex<BTreeMap<String, CustomTemplate>>,
    /// Serialises changes to custom templates (saving, registering, deleting).
    pub(crate) change: tokio::sync::Mutex<()>,
    /// Upload tokens handed out in upload links: token → the upload it allows.
    pub(crate) uploads: Mutex<HashMap<String, UploadGrant>>,
}

/// What an upload link lets its bearer store: one archive, in one team's files.
pub(crate) struct UploadGrant {
    pub(crate) team_id: String,
    /// Lowercase.
    pub(crate) files_hash: String,
    pub(crate) expires: std::time::Instant,
}

/// How long an upload link stays valid (the SDK uploads right after asking).
pub(crate) const UPLOAD_LINK_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

pub const DEFAULT_TAG: &str = "default";
