//! The bootstrap: [`Server::prepare`] (root check, data dir, store, first API key) and
//! [`Prepared::start`] (egress, jail driver, engine, templates, recovery, timers), then
//! [`Server::serve_http`] and [`Server::shutdown`]. Two steps so a front end can show the key
//! before a template build that may take minutes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_engine::{AgentPath, Engine, EngineConfig, Node, TemplateInfo};
use bulkhead_images::{ImageCache, TemplateRecipe};
use bulkhead_jail::JailDriver;
use bulkhead_store::Store;
use tokio::task::JoinHandle;

use crate::config::ServerConfig;
use crate::error::StartError;
use crate::network;

/// How often idmapped template views no sandbox uses are dropped.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1800);
/// How long in-flight requests get after a shutdown signal before streams are closed.
const DRAIN: Duration = Duration::from_secs(2);
/// Pending connections the kernel queues before accept (capped by `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;

/// What the first start did about API keys; the front end tells the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBootstrap {
    /// The configured key was added.
    Seeded,
    /// No key existed: this one was created (shown only once).
    Created(String),
    /// Nothing to do (the configured key or another active key already exists).
    Unchanged,
}

/// A template's root filesystem, built (or found in the cache) by the front end.
#[derive(Debug, Clone)]
pub struct BuiltTemplate {
    pub recipe: TemplateRecipe,
    pub rootfs: PathBuf,
}

/// A server with its store open and keys seeded, ready for its templates.
pub struct Prepared {
    config: ServerConfig,
    store: Store,
    /// What happened to the API keys.
    pub keys: KeyBootstrap,
}

/// A running server: the engine, its driver and the background timers.
pub struct Server {
    engine: Arc<Engine>,
    /// The jail driver, when it runs the sandboxes (its views and cgroups are tidied).
    jail: Option<Arc<JailDriver>>,
    pruner: JoinHandle<()>,
    /// Background work of its role (a cluster replica's node connector and health sweep).
    tasks: Vec<JoinHandle<()>>,
    listen: SocketAddr,
    connections: crate::ResolvedLimits,
    /// Sandboxes of the previous run that were re-adopted.
    pub readopted: usize,
    /// An API replica of a cluster: retired at a clean stop.
    replica: Option<crate::replica::Replica>,
}

impl Server {
    /// Validates the configuration, checks for root, opens the store and makes sure an API key
    /// exists (keys first, so a new user sees theirs even if a template build takes a while).
    pub async fn prepare(config: ServerConfig) -> Result<Prepared, StartError> {
        Self::prepare_as(config, true).await
    }

    /// As [`prepare`](Self::prepare), for a cluster node: no API key is seeded (nodes take
    /// no API calls; the replicas seed theirs).
    pub async fn prepare_node(config: ServerConfig) -> Result<Prepared, StartError> {
        Self::prepare_as(config, false).await
    }

    async fn prepare_as(config: ServerConfig, seed: bool) -> Result<Prepared, StartError> {
        config.validate()?;
        if !is_root() {
            return Err(StartError::NotRoot);
        }
        raise_fd_limit();
        std::fs::create_dir_all(&config.data_dir).map_err(|source| StartError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let store = match &config.database_url {
            Some(url) => Store::open(url).await,
            None => Store::open_sqlite_in(&config.data_dir).await,
        }
        .map_err(StartError::Store)?;
        tracing::info!(backend = store.backend(), "store ready");
        // Before anything reads a secret: a wrong or lost key stops the start here.
        let secrets = store
            .unlock_secrets(&config.secrets_key_source())
            .await
            .map_err(StartError::Store)?;
        tracing::info!(
            key_file = %secrets.key_file.display(),
            generated = secrets.generated,
            sealed_now = secrets.sealed_now,
            "secrets key loaded"
        );
        let keys = if seed {
            seed_keys(&store, config.api_key.as_deref()).await?
        } else {
            KeyBootstrap::Unchanged
        };
        Ok(Prepared {
            config,
            store,
            keys,
        })
    }

    /// Background work that ends with the server.
    pub(crate) fn add_task(&mut self, task: JoinHandle<()>) {
        self.tasks.push(task);
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The E2B REST API over this server's engine.
    pub fn router(&self) -> axum::Router {
        bulkhead_api::router(self.engine.clone())
    }

    /// Binds the configured listen address, with a backlog deep enough that a burst of
    /// connects waits in the kernel rather than being dropped (the kernel caps it at
    /// `net.core.somaxconn`).
    pub async fn bind(&self) -> Result<tokio::net::TcpListener, StartError> {
        let listen = |addr: SocketAddr| {
            let socket = match addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(LISTEN_BACKLOG)
        };
        listen(self.listen).map_err(|source| StartError::Listen {
            addr: self.listen,
            source,
        })
    }

    /// Serves the REST API (and the sandbox proxy, which shares the listener) on `listener`
    /// until `signal` completes, within the configured connection limits; then gives
    /// in-flight requests a moment and closes the rest.
    pub async fn serve_http(
        &self,
        listener: tokio::net::TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        // Long-lived streams (a background command's output, a watch) would hold a graceful
        // shutdown open forever: in-flight requests get DRAIN, then the rest are closed.
        // Processes inside sandboxes keep running; clients reconnect after the restart.
        let vouch = Arc::new(EngineVouch(self.engine.clone()));
        crate::listener::serve(
            listener,
            self.router(),
            vouch,
            self.connections.clone(),
            signal,
            DRAIN,
        )
        .await
        .map_err(StartError::Serve)
    }

    /// Stops the timers, the engine's background work and warm pools, then drops unused
    /// template views and the cgroup parent. Running sandboxes keep running and are
    /// re-adopted on the next start.
    pub async fn shutdown(self) {
        self.pruner.abort();
        for t in &self.tasks {
            t.abort();
        }
        if let Some(replica) = &self.replica {
            replica.retire().await;
        }
        self.engine.shutdown().await;
        if let Some(jail) = &self.jail {
            if let Err(e) = jail.prune_lowers() {
                tracing::warn!(error = %e, "pruning idmapped template views failed");
            }
            jail.release_cgroup_parent();
        }
    }
}

impl Prepared {
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The recipes to build before [`start`](Self::start).
    pub fn recipes(&self) -> Vec<TemplateRecipe> {
        self.config
            .recipes()
            .expect("the configuration was validated")
    }

    /// The template image cache, installing missing build tools.
    pub fn image_cache(&self) -> ImageCache {
        ImageCache::new(self.config.image_cache_dir()).install_missing_tools(true)
    }

    /// Starts egress, the jail driver and the engine with `templates`, re-adopts the previous
    /// run's sandboxes and starts the background work.
    pub async fn start(self, templates: Vec<BuiltTemplate>) -> Result<Server, StartError> {
        let crate::node_side::NodeSide { node, jail, .. } =
            crate::node_side::build(&self.config, &self.store)?;
        self.start_on(templates, node.clone(), node, jail, Vec::new(), None)
            .await
    }

    /// The engine over `node` (this machine's, or a cluster's), with `templates`, recovery and
    /// the background work; `tasks` end with the server.
    pub(crate) async fn start_on(
        self,
        templates: Vec<BuiltTemplate>,
        node: Arc<dyn Node>,
        agents: Arc<dyn AgentPath>,
        jail: Option<Arc<JailDriver>>,
        tasks: Vec<JoinHandle<()>>,
        replica: Option<(String, crate::replica::Replica)>,
    ) -> Result<Server, StartError> {
        let Prepared { config, store, .. } = self;
        let engine = Engine::with_node(
            store,
            node,
            agents,
            EngineConfig {
                default_timeout: config.default_timeout,
                max_timeout: config.max_timeout,
                pools: config.pools.clone(),
                admission: config.admission,
                checkpoint_pools: config.pool_checkpoint.clone(),
                max_sandboxes: config.max_sandboxes,
                checkpoint_dir: config.data_dir.join("checkpoints"),
                template_dir: Some(config.data_dir.join("templates")),
                image_cache: config.image_cache_dir(),
                paused_retention: config.paused_retention,
                network_default_allow: config.network.default == crate::NetworkDefault::Allow,
                sandbox_env: network::sandbox_ca_env(),
                volume_max_bytes: config.volume_max_bytes,
                sandbox_disk_mb: config.sandbox_disk_mb,
                sandbox_domain: config.sandbox_domain.clone(),
                registry: config.registry.clone(),
                metering: config.metering,
                replica: replica.as_ref().map(|(id, _)| id.clone()),
                build_limits: bulkhead_engine::BuildLimits {
                    max_builds_per_team: config.max_builds_per_team,
                    ..Default::default()
                },
                ..EngineConfig::default()
            },
        );
        // Volumes: one loop-mounted ext4 image each (see `volume_storage`).
        engine.set_volume_storage(Arc::new(bulkhead_engine::volume_storage::LoopExt4::new(
            config.data_dir.join("volumes"),
        )));
        for t in templates {
            let size = config.size_of(&t.recipe.id);
            let info = TemplateInfo {
                id: t.recipe.id.clone(),
                aliases: Vec::new(),
                rootfs: t.rootfs,
                content_hash: t.recipe.content_hash(),
                cpu_count: size.cpu_count,
                memory_mb: size.memory_mb,
                disk_size_mb: config.sandbox_disk_mb,
                pids_max: 1024,
                runtime: None,
            };
            engine
                .register_template(info)
                .await
                .map_err(StartError::Template)?;
        }
        // Templates built through the Template API by earlier runs (their trees are cached).
        match engine.load_custom_templates().await {
            Ok(n) if n > 0 => tracing::info!(templates = n, "custom templates loaded"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "loading custom templates failed"),
        }
        let readopted = engine.recover().await.map_err(StartError::Recover)?;
        let connections = config
            .connections
            .resolve(open_files_limit(), u64::from(config.slots()));
        tracing::info!(
            max = connections.max,
            reserved = connections.reserved,
            per_address = connections.max_per_ip,
            header_timeout_s = connections.header_timeout.as_secs_f64(),
            idle_timeout_s = connections.idle_timeout.as_secs_f64(),
            "client connection limits"
        );
        engine.start_background();
        let mut tasks = tasks;
        let replica = replica.map(|(_, r)| {
            tasks.extend(r.start(engine.clone()));
            r
        });
        // The server owns its image cache; engines in tests share the default one and must
        // never collect it.
        engine.start_image_gc();
        // Idmapped template views are kept per slot for fast starts; drop the unused ones now
        // and then so replaced templates do not stay mounted.
        let pruned = jail.clone();
        let pruner = tokio::spawn(async move {
            let Some(pruned) = pruned else { return };
            let mut tick = tokio::time::interval(PRUNE_INTERVAL);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = pruned.prune_lowers() {
                    tracing::warn!(error = %e, "pruning idmapped template views failed");
                }
            }
        });
        Ok(Server {
            engine,
            jail,
            pruner,
            tasks,
            listen: config.listen,
            connections,
            readopted,
            replica,
        })
    }
}

/// Seeds the configured key, or creates the first one when no active key exists.
async fn seed_keys(store: &Store, api_key: Option<&str>) -> Result<KeyBootstrap, StartError> {
    use bulkhead_engine::keys;
    if let Some(key) = api_key {
        let added = keys::seed(store, key.trim(), "BULKHEAD_API_KEY")
            .await
            .map_err(StartError::Key)?;
        return Ok(if added {
            KeyBootstrap::Seeded
        } else {
            KeyBootstrap::Unchanged
        });
    }
    if store
        .count_active_api_keys()
        .await
        .map_err(StartError::Store)?
        == 0
    {
        let (_, key) = keys::create(store, "default")
            .await
            .map_err(StartError::Key)?;
        return Ok(KeyBootstrap::Created(key));
    }
    Ok(KeyBootstrap::Unchanged)
}

/// Beyond this the soft limit is not raised: sandboxes inherit it, and programs that walk
/// every possible descriptor (old `close_fds` loops) crawl at millions.
const FD_LIMIT_CEILING: libc::rlim_t = 1 << 20;

/// Raise the soft limit on open files to the hard one (up to [`FD_LIMIT_CEILING`]): each
/// sandbox holds a few descriptors (pidfd, agent connections, its network link) and each client
/// connection one; the connection cap is computed from what this leaves.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        let old = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max.min(FD_LIMIT_CEILING);
        if lim.rlim_cur <= old {
            return;
        }
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            tracing::debug!(from = old, to = lim.rlim_cur, "raised the open-files limit");
        } else {
            tracing::warn!(
                limit = old,
                "could not raise the open-files limit; many concurrent sandboxes may fail: raise it (ulimit -n)"
            );
        }
    }
}

/// The soft limit on open files now.
fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// The engine vouches for connections in the reserve: active API keys, running sandboxes.
struct EngineVouch(Arc<Engine>);

impl crate::Vouch for EngineVouch {
    fn api_key<'a>(
        &'a self,
        key: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move { matches!(self.0.authenticate(key).await, Ok(Some(_))) })
    }

    fn live_sandbox(&self, id: &str) -> bool {
        self.0.is_live(id)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
