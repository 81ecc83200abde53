//! The `filesystem.Filesystem` service.
//!
//! Every operation runs with the requesting user's filesystem credentials (see
//! [`crate::creds`]), so the kernel applies that user's permissions and new files and
//! directories belong to the user.

pub mod entry;
pub mod watch;

use std::io;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bulkhead_envd::filesystem::{self as proto, EntryInfo, WatchDirResponse};
use bulkhead_envd::{Code, ConnectError};
use futures::StreamExt;
use tokio::sync::mpsc;

use self::watch::{WatchError, WatchSpec};
use crate::connect::{self, CallContext};
use crate::creds::{self, CredsError};
use crate::paths::{self, PathError};
use crate::state::SharedState;
use crate::users::{User, UserDb};

/// Capacity of a `WatchDir` stream's event queue; events beyond it are dropped (inotify itself
/// would overflow soon after).
const WATCH_QUEUE: usize = 8192;

/// Errors of the filesystem service.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Nothing at that path.
    #[error("Path '{}' does not exist", .0.display())]
    NotFound(PathBuf),
    /// Expected a directory.
    #[error("path is not a directory: {}", .0.display())]
    NotADirectory(PathBuf),
    /// `MakeDir` on an existing directory.
    #[error("directory already exists: {}", .0.display())]
    AlreadyExists(PathBuf),
    /// `MakeDir` on an existing non-directory.
    #[error("path already exists but it is not a directory: {}", .0.display())]
    ExistsNotDirectory(PathBuf),
    /// Symlink loop or too long a chain.
    #[error("cyclic symlink or chain of too many links at '{}'", .0.display())]
    SymlinkLoop(PathBuf),
    /// The user lacks permission.
    #[error("Permission denied: user '{user}' cannot {operation} '{}'", .path.display())]
    PermissionDenied {
        /// User name.
        user: String,
        /// What was attempted.
        operation: &'static str,
        /// Path.
        path: PathBuf,
    },
    /// Watching a network filesystem without `allow_network_mounts`.
    #[error("cannot watch path on network filesystem: '{}' (set allow_network_mounts to watch it anyway; remote changes are not reported)", .0.display())]
    NetworkMount(PathBuf),
    /// Bad path.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Credential switch failed.
    #[error(transparent)]
    Creds(#[from] CredsError),
    /// Watching failed.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// Other I/O failure.
    #[error("Could not {operation} '{}'", .path.display())]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

impl FsError {
    /// The Connect error sent to the client.
    pub fn to_connect(&self) -> ConnectError {
        let code = match self {
            FsError::NotFound(_) | FsError::Watch(WatchError::NotFound(_)) => Code::NotFound,
            FsError::NotADirectory(_)
            | FsError::ExistsNotDirectory(_)
            | FsError::NetworkMount(_)
            | FsError::Path(_) => Code::InvalidArgument,
            FsError::AlreadyExists(_) => Code::AlreadyExists,
            FsError::SymlinkLoop(_) => Code::FailedPrecondition,
            FsError::PermissionDenied { .. } => Code::PermissionDenied,
            FsError::Watch(WatchError::TooMany) => Code::ResourceExhausted,
            FsError::Creds(_) | FsError::Watch(WatchError::Notify { .. }) | FsError::Io { .. } => {
                Code::Internal
            }
        };
        ConnectError::new(code, crate::report::error_chain(self))
    }
}

impl From<FsError> for ConnectError {
    fn from(e: FsError) -> Self {
        e.to_connect()
    }
}

/// Maps an I/O error of `operation` on `path` to the error the client sees.
pub fn classify(user: &str, operation: &'static str, path: &Path, error: io::Error) -> FsError {
    match error.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => FsError::NotFound(path.to_owned()),
        Some(libc::ELOOP) => FsError::SymlinkLoop(path.to_owned()),
        Some(libc::ENAMETOOLONG) => FsError::Path(PathError::KernelTooLong),
        // EROFS: `/proc`, `/dev` and `/sys` take no writes (the sandbox's read-only mounts).
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => FsError::PermissionDenied {
            user: user.to_owned(),
            operation,
            path: path.to_owned(),
        },
        _ => FsError::Io {
            operation,
            path: path.to_owned(),
            source: error,
        },
    }
}

/// Runs `work` as `user` and flattens the result.
pub async fn as_user<T, F>(user: &User, work: F) -> Result<T, FsError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, FsError> + Send + 'static,
{
    creds::run_as(&user.identity(), work).await?
}

struct Request {
    user: User,
    users: UserDb,
    workdir: Option<PathBuf>,
}

impl Request {
    fn new(state: &SharedState, ctx: &CallContext) -> Result<Self, ConnectError> {
        let (user, users) = state.rpc_user(&ctx.headers)?;
        Ok(Self {
            user,
            users,
            workdir: state.settings().default_workdir,
        })
    }

    fn path(&self, path: &str) -> Result<PathBuf, FsError> {
        Ok(paths::resolve(
            path,
            &self.user.home,
            self.workdir.as_deref(),
        )?)
    }
}

/// `Stat`.
pub async fn stat(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(&headers, body, |req: proto::StatRequest, ctx| async move {
        let r = Request::new(&state, &ctx)?;
        let path = r.path(&req.path)?;
        let name = r.user.name.clone();
        let entry = as_user(&r.user, move || {
            entry::entry_info(&path, &r.users).map_err(|e| classify(&name, "stat", &path, e))
        })
        .await?;
        Ok(proto::StatResponse { entry: Some(entry) })
    })
    .await
}

/// `MakeDir`: creates the directory and its missing parents as envd does: with the agent's
/// (sandbox root) credentials, each new directory handed to the user, so `/newtop/a/b` works
/// for the default user as on E2B. Whether it exists is asked as the user.
pub async fn make_dir(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::MakeDirRequest, ctx| async move {
            let r = Request::new(&state, &ctx)?;
            let path = r.path(&req.path)?;
            let name = r.user.name.clone();
            let (uid, gid) = (r.user.uid, r.user.gid);
            let (probe, probe_name) = (path.clone(), name.clone());
            as_user(&r.user, move || match std::fs::metadata(&probe) {
                Ok(meta) if meta.is_dir() => Err(FsError::AlreadyExists(probe)),
                Ok(_) => Err(FsError::ExistsNotDirectory(probe)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(classify(&probe_name, "inspect", &probe, e)),
            })
            .await?;
            let (made, made_name) = (path.clone(), name.clone());
            tokio::task::spawn_blocking(move || {
                paths::ensure_dirs_owned(&made, uid, gid)
                    .map_err(|e| classify(&made_name, "create directory", &made, e))
            })
            .await
            .map_err(|_| FsError::Creds(CredsError::Panicked))??;
            let entry = as_user(&r.user, move || {
                entry::entry_info(&path, &r.users).map_err(|e| classify(&name, "stat", &path, e))
            })
            .await?;
            Ok(proto::MakeDirResponse { entry: Some(entry) })
        },
    )
    .await
}

/// `Move`: renames, creating the destination's parents; falls back to copy-and-delete across
/// filesystems (e.g. from a tmpfs `/tmp` to the home directory).
pub async fn move_entry(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(&headers, body, |req: proto::MoveRequest, ctx| async move {
        let r = Request::new(&state, &ctx)?;
        let source = r.path(&req.source)?;
        let destination = r.path(&req.destination)?;
        let name = r.user.name.clone();
        let entry = as_user(&r.user, move || {
            std::fs::symlink_metadata(&source).map_err(|e| classify(&name, "move", &source, e))?;
            if let Some(parent) = destination.parent() {
                paths::create_dirs(parent)
                    .map_err(|e| classify(&name, "create directory", parent, e))?;
            }
            match std::fs::rename(&source, &destination) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    copy_recursive(&source, &destination)
                        .map_err(|e| classify(&name, "copy to", &destination, e))?;
                    remove_path(&source).map_err(|e| classify(&name, "remove", &source, e))?;
                }
                Err(e) => return Err(classify(&name, "move", &source, e)),
            }
            entry::entry_info(&destination, &r.users)
                .map_err(|e| classify(&name, "stat", &destination, e))
        })
        .await?;
        Ok(proto::MoveResponse { entry: Some(entry) })
    })
    .await
}

fn copy_recursive(source: &Path, destination: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(source)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(source)?, destination)
    } else if meta.is_dir() {
        std::fs::create_dir(destination)?;
        std::fs::set_permissions(destination, meta.permissions())?;
        for child in std::fs::read_dir(source)? {
            let child = child?;
            copy_recursive(&child.path(), &destination.join(child.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(source, destination).map(drop)
    }
}

fn remove_path(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path)?.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// `ListDir`: entries up to `depth` levels (0 means 1), parents before children, sorted by
/// name; symlinked directories are listed but not descended into.
pub async fn list_dir(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::ListDirRequest, ctx| async move {
            let r = Request::new(&state, &ctx)?;
            let path = r.path(&req.path)?;
            let depth = req.depth.max(1);
            let name = r.user.name.clone();
            let entries = as_user(&r.user, move || {
                let meta =
                    std::fs::metadata(&path).map_err(|e| classify(&name, "list", &path, e))?;
                if !meta.is_dir() {
                    return Err(FsError::NotADirectory(path));
                }
                let mut entries = Vec::new();
                let children = read_sorted(&path).map_err(|e| classify(&name, "list", &path, e))?;
                walk(&path, children, depth, &r.users, &mut entries);
                Ok(entries)
            })
            .await?;
            Ok(proto::ListDirResponse { entries })
        },
    )
    .await
}

fn read_sorted(dir: &Path) -> io::Result<Vec<std::fs::DirEntry>> {
    let mut children: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    children.sort_by_key(std::fs::DirEntry::file_name);
    Ok(children)
}

fn walk(
    dir: &Path,
    children: Vec<std::fs::DirEntry>,
    depth: u32,
    users: &UserDb,
    out: &mut Vec<EntryInfo>,
) {
    for child in children {
        let path = dir.join(child.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue; // Removed meanwhile.
        };
        out.push(entry::entry_from_metadata(&path, &meta, users));
        if depth > 1 && meta.is_dir() {
            // Unreadable subdirectories are listed but not descended into.
            if let Ok(grandchildren) = read_sorted(&path) {
                walk(&path, grandchildren, depth - 1, users, out);
            }
        }
    }
}

/// `Remove`: removes a file, symlink or directory tree; a missing path is not an error (as
/// with envd, whose removal is Go's `os.RemoveAll`).
pub async fn remove(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::RemoveRequest, ctx| async move {
            let r = Request::new(&state, &ctx)?;
            let path = r.path(&req.path)?;
            let name = r.user.name.clone();
            as_user(&r.user, move || match remove_path(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(classify(&name, "remove", &path, e)),
            })
            .await?;
            Ok(proto::RemoveResponse {})
        },
    )
    .await
}

/// Checks that the user may watch `path` and returns the watch specification.
async fn watch_spec(
    r: &Request,
    path: &str,
    recursive: bool,
    include_entry: bool,
    allow_network: bool,
) -> Result<WatchSpec, FsError> {
    let path = r.path(path)?;
    let name = r.user.name.clone();
    let root = as_user(&r.user, move || {
        let meta = std::fs::metadata(&path).map_err(|e| classify(&name, "watch", &path, e))?;
        if !meta.is_dir() {
            return Err(FsError::NotADirectory(path));
        }
        // inotify needs read access; check it as the user before watching as root.
        std::fs::read_dir(&path).map_err(|e| classify(&name, "watch", &path, e))?;
        std::fs::canonicalize(&path).map_err(|e| classify(&name, "watch", &path, e))
    })
    .await?;
    if !allow_network && watch::is_network_mount(&root).unwrap_or(false) {
        return Err(FsError::NetworkMount(root));
    }
    Ok(WatchSpec {
        root,
        recursive,
        include_entry,
    })
}

/// `WatchDir`: a stream of `start`, then filesystem events, with keepalives.
pub async fn watch_dir(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    let req: proto::WatchDirRequest = match connect::read_stream_request(&headers, body).await {
        Ok(r) => r,
        Err(response) => return *response,
    };
    let result = async {
        let ctx = CallContext::from_headers(&headers)?;
        let r = Request::new(&state, &ctx)?;
        let spec = watch_spec(
            &r,
            &req.path,
            req.recursive,
            req.include_entry,
            req.allow_network_mounts,
        )
        .await?;
        let (tx, rx) = mpsc::channel(WATCH_QUEUE);
        let watcher = watch::watch(spec, move |event| {
            if tx.try_send(event).is_err() {
                tracing::warn!("watch event queue full, dropping an event");
            }
        })
        .map_err(FsError::from)?;
        let events = tokio_stream::wrappers::ReceiverStream::new(rx).map(move |event| {
            // The stream owns the watcher: dropping the response stops watching.
            let _watcher = &watcher;
            event
                .map(WatchDirResponse::filesystem)
                .map_err(|e| ConnectError::internal(format!("Watching stopped: {e}")))
        });
        Ok::<_, ConnectError>((ctx, events))
    }
    .await;
    match result {
        Ok((ctx, events)) => connect::server_stream(
            &ctx,
            vec![WatchDirResponse::start()],
            events.boxed(),
            WatchDirResponse::keepalive,
        ),
        Err(e) => connect::stream_error_response(&e),
    }
}

/// `CreateWatcher`.
pub async fn create_watcher(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::CreateWatcherRequest, ctx| async move {
            let r = Request::new(&state, &ctx)?;
            let spec = watch_spec(
                &r,
                &req.path,
                req.recursive,
                req.include_entry,
                req.allow_network_mounts,
            )
            .await?;
            let watcher_id = state.watchers.create(spec).map_err(FsError::from)?;
            Ok(proto::CreateWatcherResponse { watcher_id })
        },
    )
    .await
}

/// `GetWatcherEvents`: drains the events buffered since the last call.
pub async fn get_watcher_events(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::GetWatcherEventsRequest, _| async move {
            match state
                .watchers
                .drain(&req.watcher_id)
                .map_err(FsError::from)?
            {
                Ok(events) => Ok(proto::GetWatcherEventsResponse { events }),
                Err(e) => Err(ConnectError::internal(format!(
                    "Watcher {} failed: {e}",
                    req.watcher_id
                ))),
            }
        },
    )
    .await
}

/// `RemoveWatcher`.
pub async fn remove_watcher(state: SharedState, headers: HeaderMap, body: Body) -> Response {
    connect::unary(
        &headers,
        body,
        |req: proto::RemoveWatcherRequest, _| async move {
            state
                .watchers
                .remove(&req.watcher_id)
                .map_err(FsError::from)?;
            Ok(proto::RemoveWatcherResponse {})
        },
    )
    .await
}
