//! What one MCP session remembers: its default sandbox (created on first use, or the first one
//! it creates explicitly), the sandboxes it owns (killed when the session ends: the client
//! closes it, or it stays idle past the transport's keep-alive), and the API key that opened
//! it. A session is one value per MCP session (the transport builds a handler per session), so
//! nothing here is shared between clients. Access tokens are not kept: each use asks the engine
//! with the caller (`BulkheadMcp::resolve`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bulkhead_engine::{Caller, Engine};

#[derive(Default)]
struct State {
    /// The caller that opened the session (bound at `initialize`, or at the first call of a
    /// client that skipped it); nobody else may use it.
    owner: Option<Caller>,
    default: Option<String>,
    /// Sandboxes to kill when the session ends, with the caller that created them.
    owned: HashMap<String, Caller>,
    /// Sandboxes marked "keep after session" (never killed here).
    kept: HashSet<String>,
}

pub(crate) struct Session {
    engine: Arc<Engine>,
    state: Mutex<State>,
    /// Serialises the default sandbox's creation so two concurrent first calls share one.
    creating: tokio::sync::Mutex<()>,
}

impl Session {
    pub fn new(engine: Arc<Engine>) -> Self {
        Session {
            engine,
            state: Mutex::new(State::default()),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves maps that are still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `caller` may use this session: the first caller binds it to its API key (and
    /// so its team); every later one must be the same key.
    pub fn admits(&self, caller: &Caller) -> bool {
        let mut s = self.state();
        match &s.owner {
            Some(owner) => owner == caller,
            None => {
                s.owner = Some(caller.clone());
                true
            }
        }
    }

    pub fn default_sandbox(&self) -> Option<String> {
        self.state().default.clone()
    }

    /// The lock a first use holds while it creates the default sandbox.
    pub async fn creating(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.creating.lock().await
    }

    /// Record a sandbox this session created; the first becomes the default.
    pub fn adopt(&self, id: &str, caller: &Caller, keep: bool) {
        let mut s = self.state();
        if s.default.is_none() {
            s.default = Some(id.to_string());
        }
        if keep {
            s.kept.insert(id.to_string());
        } else {
            s.owned.insert(id.to_string(), caller.clone());
        }
    }

    /// A sandbox was killed (by a tool): forget it; a killed default is replaced on next use.
    pub fn forget(&self, id: &str) {
        let mut s = self.state();
        s.owned.remove(id);
        s.kept.remove(id);
        if s.default.as_deref() == Some(id) {
            s.default = None;
        }
    }
}

impl Drop for Session {
    /// The session ended: kill the sandboxes it owns. Without a runtime (a process exiting)
    /// their TTLs end them.
    fn drop(&mut self) {
        let owned = std::mem::take(&mut self.state().owned);
        if owned.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let engine = Arc::clone(&self.engine);
        rt.spawn(async move {
            for (id, caller) in owned {
                match engine.kill(&caller, &id).await {
                    Ok(()) => tracing::info!(sandbox = %id, "MCP session ended: sandbox killed"),
                    Err(bulkhead_engine::EngineError::SandboxNotFound(_)) => {}
                    Err(e) => tracing::warn!(
                        sandbox = %id,
                        error = &e as &dyn std::error::Error,
                        "MCP session ended but its sandbox could not be killed; its timeout will end it"
                    ),
                }
            }
        });
    }
}
