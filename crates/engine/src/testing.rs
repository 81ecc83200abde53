//! Test doubles for code built on the engine (enabled with the `testing` feature): the
//! in-memory [`FakeDriver`] (from `bulkhead-driver`), a recording egress proxy and a template,
//! so engine and API logic is tested without root.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The fake driver lives with the trait in `bulkhead-driver`; re-exported for engine and API
/// tests.
pub use bulkhead_driver::fake::{FakeDriver, FakeHost};

/// Records what the engine asks of the egress proxy.
#[derive(Default)]
pub struct RecordingEgress {
    /// sandbox id → current policy (present while attached).
    pub attached: Mutex<BTreeMap<String, bulkhead_egress::NetworkPolicy>>,
    /// Every call, in order: `attach <id>`, `set <id>`, `detach <id>`.
    pub calls: Mutex<Vec<String>>,
    /// The link fds, held like the proxy would (dropped on detach).
    links: Mutex<HashMap<String, std::os::fd::OwnedFd>>,
}

impl crate::node::network::EgressControl for RecordingEgress {
    fn attach(
        &self,
        sandbox_id: &str,
        tun: std::os::fd::OwnedFd,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), bulkhead_egress::EgressError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("attach {sandbox_id}"));
        self.links.lock().unwrap().insert(sandbox_id.into(), tun);
        self.attached
            .lock()
            .unwrap()
            .insert(sandbox_id.into(), policy);
        Ok(())
    }
    fn set_policy(
        &self,
        sandbox_id: &str,
        policy: bulkhead_egress::NetworkPolicy,
    ) -> Result<(), bulkhead_egress::EgressError> {
        self.calls.lock().unwrap().push(format!("set {sandbox_id}"));
        match self.attached.lock().unwrap().get_mut(sandbox_id) {
            Some(p) => {
                *p = policy;
                Ok(())
            }
            None => Err(bulkhead_egress::EgressError::NotAttached(sandbox_id.into())),
        }
    }
    fn detach(&self, sandbox_id: &str) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("detach {sandbox_id}"));
        self.attached.lock().unwrap().remove(sandbox_id);
        self.links.lock().unwrap().remove(sandbox_id);
    }
}

/// A `base` template (alias `debian`) for engine tests; the [`FakeDriver`] never reads its rootfs.
pub fn base_template() -> crate::TemplateInfo {
    crate::TemplateInfo {
        runtime: None,
        id: "base".into(),
        aliases: vec!["debian".into()],
        rootfs: std::path::PathBuf::from("/nonexistent"),
        content_hash: "h".into(),
        cpu_count: 2,
        memory_mb: 512,
        disk_size_mb: 1024,
        pids_max: 64,
    }
}

/// The caller of a fresh API key in `store`: the owner of what a test creates.
pub async fn owner(store: &bulkhead_store::Store) -> crate::Caller {
    crate::tenancy::keys::create(store, "t")
        .await
        .expect("create an API key")
        .0
        .caller()
}

/// Gives a test store a fresh secrets key (a server loads its key file at start).
pub async fn unlock_secrets(store: &bulkhead_store::Store) {
    let key = bulkhead_store::SecretsKey::generate().expect("generate a secrets key");
    store
        .unlock_secrets_with(&key, "test key")
        .await
        .expect("unlock the test store's secrets");
}

/// What engine tests start from: an engine over a fresh SQLite store in `dir` and a
/// [`FakeDriver`], `template` registered, and the owner of a fresh API key.
pub struct FakeEngine {
    pub store: bulkhead_store::Store,
    pub driver: std::sync::Arc<FakeDriver>,
    pub engine: std::sync::Arc<crate::Engine>,
    pub owner: crate::Caller,
}

/// Builds a [`FakeEngine`] (nothing started in the background).
pub async fn fake_engine(
    dir: &std::path::Path,
    cfg: crate::EngineConfig,
    template: crate::TemplateInfo,
) -> FakeEngine {
    let store = bulkhead_store::Store::open_sqlite_in(dir)
        .await
        .expect("open the test store");
    unlock_secrets(&store).await;
    let driver = std::sync::Arc::new(FakeDriver::default());
    let engine = crate::Engine::new(store.clone(), driver.clone(), cfg);
    engine
        .register_template(template)
        .await
        .expect("register the test template");
    let owner = owner(&store).await;
    FakeEngine {
        store,
        driver,
        engine,
        owner,
    }
}
