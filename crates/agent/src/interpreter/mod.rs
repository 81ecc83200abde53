//! The code-interpreter API on sandbox port 49999, compatible with E2B's code-interpreter server
//! (`e2b-code-interpreter` / `@e2b/code-interpreter` SDKs), speaking Jupyter's ZeroMQ protocol to
//! kernels the template lists in `/opt/bulkhead/interpreter/kernels.json`.
//!
//! Model: a *context* is one kernel process plus its language and working directory. Each
//! language has a default context. The manifest's `default_contexts` are created with the agent
//! (so warm-pooled sandboxes have live, warmed kernels), except that a language marked
//! `start_lazily` (Deno) has its default context listed at once but its kernel started by its
//! first execution; other languages get theirs on first `language=` use. Executions on one
//! context are serialized by an async mutex (FIFO); different contexts run concurrently.
//!
//! For checkpoint-restored pools (see `docs/persistence.md`), the host asks [`Interpreter::warm`]
//! before it checkpoints a warm sandbox and [`Interpreter::reseed`] in every clone restored from
//! it, before the clone is handed to anyone.
//!
//! Semantics worth knowing (see [`execute`] for the details):
//! - A client that disconnects mid-execution gets its cell interrupted (SIGINT to the kernel's
//!   process group, or `interrupt_request` when the manifest says `interrupt_mode: message`);
//!   the kernel keeps its state. An execution still *queued* when its client disconnects is
//!   dropped and never runs. Deno's kernel (JS/TS in the template, 2.9.6) cannot be interrupted:
//!   SIGINT ends it and `interrupt_request` is ignored, so an abandoned JS/TS cell costs the
//!   kernel, which is restarted at once (state lost) so the context stays usable.
//! - A kernel that dies (OOM kill, `os._exit`) ends the execution with an `error` line named
//!   `ContextRestarting` (what E2B's Jupyter server reports when it auto-restarts a dead kernel)
//!   and `end_of_execution`; the agent then starts a fresh kernel for the context right away.
//! - The sandbox's environment variables (from `/init`) are applied to a kernel started before
//!   `/init` (warm pool) before its next execution; per-request `env_vars` are set in a silent
//!   cell before the user's code and restored afterwards.

mod account;
mod cell;
pub mod execute;
pub mod http;
pub mod kernel;
pub mod local;
pub mod manifest;
pub mod output;
pub mod snippets;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use self::account::KernelUser;
use self::kernel::{Kernel, KernelError, KillHandle, StartSpec};
use self::manifest::{Dialect, LanguageSpec, Manifest};
use crate::state::SharedState;
use crate::users::Identity;

/// Kernel starts tried when the kernel could not bind its ports.
const START_ATTEMPTS: u32 = 3;

/// The sandbox port of the code-interpreter API.
pub const INTERPRETER_PORT: u16 = 49999;

/// Interpreter settings.
#[derive(Debug, Clone)]
pub struct InterpreterConfig {
    /// Where connection files are written (created 0711).
    pub runtime_dir: PathBuf,
    /// Who kernels run as.
    pub kernel_user: KernelUser,
    /// Working directory of contexts created without `cwd` (E2B: `/home/user`).
    pub default_cwd: PathBuf,
    /// How long a kernel may take to answer its first `kernel_info_request`.
    pub start_timeout: Duration,
}

impl Default for InterpreterConfig {
    fn default() -> Self {
        Self {
            runtime_dir: PathBuf::from("/run/bulkhead-interpreter"),
            kernel_user: KernelUser::Sandbox("user".to_owned()),
            default_cwd: PathBuf::from("/home/user"),
            start_timeout: Duration::from_secs(60),
        }
    }
}

/// Errors creating a context.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// No kernel for the language.
    #[error(
        "Failed to create context: no kernel is installed for language {language:?} (available: {available})"
    )]
    UnknownLanguage {
        /// Normalized language.
        language: String,
        /// The manifest's languages.
        available: String,
    },
    /// The working directory is unusable.
    #[error("Failed to set working directory: {0} is not an existing directory")]
    Cwd(String),
    /// The kernel did not start.
    #[error("Failed to create context: {}", crate::report::error_chain(.0))]
    Kernel(#[from] KernelError),
}

/// Kill switch and flags that restart/delete use without waiting for the running execution.
#[derive(Default)]
struct Control {
    kill: Option<KillHandle>,
    restarting: bool,
    deleted: bool,
}

/// What an execution needs exclusively: the kernel and what the agent knows of its environment.
#[derive(Default)]
pub(crate) struct Slot {
    kernel: Option<Kernel>,
    /// The kernel's environment as the agent set it (spawn environment plus applied changes).
    env: BTreeMap<String, String>,
    /// The sandbox-wide variables last applied to the kernel.
    globals: BTreeMap<String, String>,
}

/// A context (kernel session).
pub struct Context {
    /// Id (a UUID, like Jupyter's kernel ids that E2B uses).
    pub id: String,
    /// Canonical language.
    pub language: String,
    /// Working directory.
    pub cwd: String,
    spec: LanguageSpec,
    seq: u64,
    slot: tokio::sync::Mutex<Slot>,
    control: Mutex<Control>,
}

impl Context {
    fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The snippet dialect of this context.
    pub fn dialect(&self) -> Dialect {
        self.spec.dialect(&self.language)
    }

    fn is_deleted(&self) -> bool {
        self.control().deleted
    }

    fn is_restarting(&self) -> bool {
        self.control().restarting
    }

    /// The JSON E2B returns for a context.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"id": self.id, "language": self.language, "cwd": self.cwd})
    }
}

/// The interpreter: contexts and their kernels.
pub struct Interpreter {
    manifest: Manifest,
    config: InterpreterConfig,
    state: SharedState,
    contexts: Mutex<HashMap<String, Arc<Context>>>,
    defaults: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<String>>>>>,
    next_seq: AtomicU64,
}

impl Interpreter {
    /// An interpreter for `manifest`.
    pub fn new(manifest: Manifest, config: InterpreterConfig, state: SharedState) -> Arc<Self> {
        Arc::new(Self {
            manifest,
            config,
            state,
            contexts: Mutex::new(HashMap::new()),
            defaults: Mutex::new(HashMap::new()),
            next_seq: AtomicU64::new(0),
        })
    }

    /// Starts the manifest's default contexts in the background (lazy ones without a kernel).
    pub fn start_default_contexts(self: &Arc<Self>) {
        for language in self.manifest.default_contexts.clone() {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                let language = this.manifest.normalize(Some(&language));
                if let Err(e) = this.default_context(&language).await {
                    tracing::warn!(language, error = %e, "could not start a default context; it will be retried on first use");
                }
            });
        }
    }

    /// Waits until every default context whose kernel starts with the agent has a running,
    /// warmed kernel (starting it again if its first start failed): after this, a sandbox's
    /// first execution does not pay for a kernel start. The host asks for it before it
    /// checkpoints a warm sandbox for a pool.
    pub async fn warm(&self) -> Result<(), ContextError> {
        for language in self.manifest.default_contexts.clone() {
            let language = self.manifest.normalize(Some(&language));
            if self
                .manifest
                .language(&language)
                .is_some_and(|s| s.start_lazily)
            {
                continue;
            }
            let context = self.default_context(&language).await?;
            let mut slot = context.slot.lock().await;
            self.ensure_kernel(&context, &mut slot).await?;
        }
        Ok(())
    }

    /// Start `context`'s kernel unless one is running (the first use of a lazily started
    /// context, or after its kernel died).
    pub(crate) async fn ensure_kernel(
        &self,
        context: &Context,
        slot: &mut Slot,
    ) -> Result<(), KernelError> {
        if slot.kernel.as_ref().is_none_or(|k| k.exited().is_some()) {
            slot.kernel = None;
            self.start_kernel(context, slot).await?;
        }
        Ok(())
    }

    /// This sandbox is one of several restored from one checkpoint: give every running kernel
    /// its own randomness and identity before any user code runs. Python kernels re-seed their
    /// generators and take a new Jupyter session id ([`snippets::PYTHON_RESEED`]); a kernel of
    /// another language cannot be re-seeded from outside (V8's `Math.random`) and is restarted
    /// (a pool member holds no user state). Waits for executions in progress.
    pub async fn reseed(&self) -> Result<(), KernelError> {
        for context in self.list() {
            let mut slot = context.slot.lock().await;
            let Some(kernel) = slot.kernel.as_mut().filter(|k| k.exited().is_none()) else {
                continue;
            };
            if matches!(context.dialect(), Dialect::Python | Dialect::Sql) {
                kernel.discard_pending();
                if let Some(error) = kernel
                    .run_silent(snippets::PYTHON_RESEED, Duration::from_secs(30))
                    .await?
                {
                    return Err(KernelError::Died(format!(
                        "its re-seeding cell failed: {}: {}",
                        error.name, error.value
                    )));
                }
            } else {
                if let Some(kill) = context.control().kill.take() {
                    kill.kill();
                }
                slot.kernel = None;
                self.start_kernel(&context, &mut slot).await?;
            }
            tracing::info!(
                id = context.id,
                language = context.language,
                "kernel re-seeded after a clone restore"
            );
        }
        Ok(())
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Context>>> {
        self.contexts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A context by id.
    pub fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.table().get(id).cloned()
    }

    /// All contexts, oldest first.
    pub fn list(&self) -> Vec<Arc<Context>> {
        let mut all: Vec<_> = self.table().values().cloned().collect();
        all.sort_by_key(|c| c.seq);
        all
    }

    /// The default context of a (normalized) language, created on first use.
    pub async fn default_context(&self, language: &str) -> Result<Arc<Context>, ContextError> {
        let slot = Arc::clone(
            self.defaults
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(language.to_owned())
                .or_default(),
        );
        let mut id = slot.lock().await;
        // A deleted default context is replaced by a new one (E2B would answer 404 forever).
        if let Some(context) = id.as_deref().and_then(|id| self.get(id)) {
            return Ok(context);
        }
        let cwd = self.config.default_cwd.to_string_lossy().into_owned();
        // A lazy language's kernel starts with the execution that asked for its context.
        let lazy = self
            .manifest
            .language(language)
            .is_some_and(|s| s.start_lazily);
        let context = self.new_context(language, &cwd, !lazy).await?;
        *id = Some(context.id.clone());
        Ok(context)
    }

    /// Creates a context and starts its kernel.
    pub async fn create_context(
        &self,
        language: &str,
        cwd: &str,
    ) -> Result<Arc<Context>, ContextError> {
        self.new_context(language, cwd, true).await
    }

    /// Creates a context; its kernel starts now when `start`, else on its first execution.
    async fn new_context(
        &self,
        language: &str,
        cwd: &str,
        start: bool,
    ) -> Result<Arc<Context>, ContextError> {
        let Some(spec) = self.manifest.language(language) else {
            return Err(ContextError::UnknownLanguage {
                language: language.to_owned(),
                available: self.manifest.language_names(),
            });
        };
        if !Path::new(cwd).is_dir() {
            return Err(ContextError::Cwd(cwd.to_owned()));
        }
        let context = Arc::new(Context {
            id: uuid::Uuid::new_v4().to_string(),
            language: language.to_owned(),
            cwd: cwd.to_owned(),
            spec: spec.clone(),
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            slot: tokio::sync::Mutex::new(Slot::default()),
            control: Mutex::new(Control::default()),
        });
        // Listed from the start (E2B lists the default contexts as soon as the sandbox is up);
        // executions queue on the slot, which we hold until the kernel is ready.
        let mut slot = context.slot.lock().await;
        self.table()
            .insert(context.id.clone(), Arc::clone(&context));
        if start && let Err(e) = self.start_kernel(&context, &mut slot).await {
            self.table().remove(&context.id);
            return Err(e.into());
        }
        drop(slot);
        tracing::info!(
            id = context.id,
            language,
            cwd,
            started = start,
            "context created"
        );
        Ok(context)
    }

    /// Kills the context's kernel and starts a new one (state is lost; cwd is re-applied).
    pub async fn restart(&self, context: &Context) -> Result<(), ContextError> {
        {
            let mut control = context.control();
            control.restarting = true;
            if let Some(kill) = &control.kill {
                kill.kill();
            }
        }
        // A running execution notices the death, reports it and lets go.
        let mut slot = context.slot.lock().await;
        slot.kernel = None;
        let result = self.start_kernel(context, &mut slot).await;
        context.control().restarting = false;
        result.map_err(ContextError::from)
    }

    /// Removes a context and kills its kernel; `false` if there is no such context.
    pub async fn delete(&self, id: &str) -> bool {
        let Some(context) = self.table().remove(id) else {
            return false;
        };
        {
            let mut control = context.control();
            control.deleted = true;
            if let Some(kill) = control.kill.take() {
                kill.kill();
            }
        }
        // Queued executions find the context deleted; dropping the kernel reaps it.
        context.slot.lock().await.kernel = None;
        tracing::info!(id, "context deleted");
        true
    }

    /// Starts a kernel for `context` into `slot` (which must be empty).
    async fn start_kernel(&self, context: &Context, slot: &mut Slot) -> Result<(), KernelError> {
        let cwd = PathBuf::from(&context.cwd);
        let user = account::for_cwd(&self.config.kernel_user, &cwd);
        let globals = self.state.settings().env_vars;
        // The manifest's variables win over the sandbox's (contract).
        let env = crate::process::build_env(&user, &cwd, &globals, &context.spec.env, false);
        let dialect = context.dialect();
        let warmup = context
            .spec
            .warmup
            .clone()
            .unwrap_or_else(|| snippets::default_warmup(dialect).to_owned());
        let mut attempt = 1;
        let kernel = loop {
            let started = Kernel::start(StartSpec {
                language: &context.language,
                spec: &context.spec,
                cwd: &cwd,
                env: env.clone(),
                identity: Identity {
                    uid: user.uid,
                    gid: user.gid,
                    groups: user.groups.clone(),
                },
                runtime_dir: &self.config.runtime_dir,
                start_timeout: self.config.start_timeout,
                warmup: &warmup,
            })
            .await;
            match started {
                // The reserved ports are free for a moment between our release and the kernel's
                // bind; another socket may take one (Jupyter has the same race). Try new ports.
                Err(e) if e.is_port_race() && attempt < START_ATTEMPTS => {
                    tracing::info!(
                        language = context.language,
                        attempt,
                        "kernel lost a port race; retrying"
                    );
                    attempt += 1;
                }
                other => break other?,
            }
        };
        context.control().kill = Some(kernel.kill_handle());
        slot.kernel = Some(kernel);
        slot.env = env.into_iter().collect();
        slot.globals = globals;
        Ok(())
    }
}
