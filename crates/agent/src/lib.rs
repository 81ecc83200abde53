//! `bulkhead-agent`: the process that runs inside each sandbox and serves the envd API the
//! E2B SDKs speak (Connect JSON `process.Process` and `filesystem.Filesystem`, plus `/files`,
//! `/health`, `/init`, `/envs`, `/metrics`).
//!
//! The host reaches it over a Unix socket (jail driver) or another byte stream, forwarding the
//! SDK's HTTP/1.1 requests unchanged. Module map:
//!
//! - [`init`]: pid-1 duties (session, reaping orphans) before the runtime starts;
//! - [`guest`]: guest mode in a microVM (root file system set-up, the virtio-serial bridge);
//! - [`server`]: routing by sandbox port, envd routes, access-token check;
//! - [`connect`]: Connect protocol server glue (unary, server and client streams);
//! - [`process`]: processes, PTYs, output streaming, exit history;
//! - [`filesystem`]: filesystem RPCs and inotify watches;
//! - [`files`]: streaming upload/download with signed URLs;
//! - [`control`]: `/health`, `/init`, `/envs`, `/metrics` and the host-only agent info route;
//! - [`interpreter`]: the code-interpreter API on port 49999 (Jupyter kernels);
//! - [`creds`], [`users`], [`paths`]: acting as the requesting user;
//! - [`state`]: the hub every handler shares (settings, process table, watchers, CPU sampler).
//!
//! Leaves, which import nothing from the crate and may be used by any module: [`http`] (error
//! body, constant-time compare), [`metrics`] (the `/metrics` figures and CPU sampler),
//! [`report`] (error chains), [`users`], and [`paths`] (path resolution, directory creation).
//! The hub [`state`] imports only leaves and the state-owning modules `process::table` and
//! `filesystem::watch`, which never import the hub back.
//! `cargo xtask module-cycles` (run by `scripts/test.sh`) checks that no module imports another
//! in a loop.

pub mod cli;
pub mod connect;
pub mod control;
pub mod creds;
pub mod files;
pub mod filesystem;
pub mod guest;
pub mod guest_ca;
pub mod guest_limits;
pub mod guest_net;
pub mod http;
pub mod init;
pub mod interpreter;
pub mod metrics;
pub mod paths;
pub mod port_forward;
pub mod process;
pub mod report;
pub mod reseed;
pub mod server;
pub mod state;
pub mod users;

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use axum::serve::ListenerExt;

pub use cli::{Args, ListenAddr};
pub use report::error_chain;
pub use state::{AppState, Config, SharedState};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Something other than a socket is in the way.
    #[error("{0} exists and is not a socket; remove it or choose another --listen path")]
    NotASocket(std::path::PathBuf),
    /// Binding failed.
    #[error("Could not listen on {addr}")]
    Bind {
        /// Address.
        addr: ListenAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Serving failed.
    #[error("The HTTP server failed")]
    Serve(#[source] io::Error),
}

/// Serves until SIGTERM or SIGINT.
pub async fn run(args: &Args) -> Result<(), ServeError> {
    let config = Config {
        default_user: args.default_user.clone(),
        max_background_processes: usize::try_from(args.max_background_processes)
            .unwrap_or(usize::MAX),
    };
    let state = AppState::new(&config);
    let interpreter = match interpreter::manifest::Manifest::load(&args.interpreter_manifest) {
        Ok(Some(manifest)) => {
            let interpreter = interpreter::Interpreter::new(
                manifest,
                interpreter::InterpreterConfig::default(),
                state.clone(),
            );
            Some(interpreter)
        }
        Ok(None) => None,
        Err(e) => {
            // The envd API must work even when the template's interpreter is broken.
            tracing::error!(error = %report::error_chain(&e), "code interpreter disabled");
            None
        }
    };
    // Kernels start only once the listener is bound: binding briefly narrows the process umask,
    // which a kernel spawned meanwhile would inherit (its ~/.ipython then comes out 0600).
    let start_kernels = {
        let interpreter = interpreter.clone();
        let loopback = args.interpreter_listen.clone();
        move || {
            if let Some(i) = &interpreter {
                i.start_default_contexts();
                interpreter::local::serve(i, &loopback);
            }
        }
    };
    let app = server::app_with_interpreter(state, interpreter);
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("shutting down");
    };
    let bind_err = |source| ServeError::Bind {
        addr: args.listen.clone(),
        source,
    };
    match &args.listen {
        ListenAddr::Unix(path) => {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_socket() => {
                    std::fs::remove_file(path).map_err(bind_err)?
                }
                Ok(_) => return Err(ServeError::NotASocket(path.clone())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(bind_err(e)),
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(bind_err)?;
            }
            // Create the socket as 0600 from the start (no window with a wider mode); no other
            // thread creates files yet, so changing the process umask briefly is safe.
            // SAFETY: umask has no preconditions.
            let previous = unsafe { libc::umask(0o177) };
            let bound = tokio::net::UnixListener::bind(path);
            // SAFETY: as above.
            unsafe { libc::umask(previous) };
            let listener = bound.map_err(bind_err)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(bind_err)?;
            tracing::info!(listen = %args.listen, "agent listening");
            start_kernels();
            if let Some(port) = &args.guest_port {
                tokio::spawn(guest::bridge(port.clone(), path.clone()));
            }
            // Streams (process output, watches) never end by themselves, so shutdown does not wait
            // for connections to finish: the sandbox is going away.
            tokio::select! {
                r = axum::serve(listener, app) => r.map_err(ServeError::Serve)?,
                () = shutdown => {}
            }
        }
        ListenAddr::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(bind_err)?
                .tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
            tracing::info!(listen = %args.listen, "agent listening");
            start_kernels();
            tokio::select! {
                r = axum::serve(listener, app) => r.map_err(ServeError::Serve)?,
                () = shutdown => {}
            }
        }
    }
    Ok(())
}
