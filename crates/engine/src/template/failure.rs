//! Why a template build failed: the base, a step, its build sandbox, or the finished tree's
//! start and ready check. The message is what the build's status and log carry (the SDK shows it
//! to the user); the cause stays typed. Host paths never appear in it (they go to the log).

use std::time::Duration;

use crate::error::EngineError;
use crate::node::driver::DriverError;
use crate::template::exec::ExecError;
use crate::template::types::TemplateBuildError;

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
    SandboxStart(DriverError),
    #[error("the build sandbox's agent did not start: {0}")]
    AgentStart(Box<EngineError>),
    #[error("the build sandbox's network failed: {0}")]
    Network(Box<EngineError>),
    #[error("{0}")]
    Reach(DriverError),
    #[error("{0}")]
    Upload(Box<TemplateBuildError>),
    #[error("the files of step {step} ({file}) were not uploaded")]
    NotUploaded { step: String, file: String },
    #[error("copying the files into the build sandbox failed: {0}")]
    CopyFiles(ExecError),
    #[error("step {step} ({what}) failed: {source}")]
    Exec {
        step: String,
        what: String,
        source: ExecError,
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
    Export(DriverError),
    #[error("step {step} added {size} bytes, over the server's limit of {limit} bytes per step")]
    TooBig { step: String, size: u64, limit: u64 },
    #[error("the start command could not be started: {0}")]
    StartCommand(ExecError),
    #[error("the start command could not be started (exit code {0})")]
    StartCommandExit(i32),
    /// `output`: what the last check printed, as `": …"` (empty when nothing).
    #[error("the ready check {cmd:?} did not pass within {limit:?}{output}")]
    NotReady {
        cmd: String,
        limit: Duration,
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
