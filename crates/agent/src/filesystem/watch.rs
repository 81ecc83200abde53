//! Directory watching (`WatchDir` streams and `CreateWatcher` polling watchers) on inotify via
//! the `notify` crate.
//!
//! inotify events are mapped as Go's fsnotify (which envd uses) maps them: create and
//! moved-into → `CREATE`, modify → `WRITE`, attribute change → `CHMOD`, delete → `REMOVE`,
//! moved-away → `RENAME`. Recursive watches add a watch per directory, including directories
//! created later; what a new directory already contains when it is noticed is reported as
//! `CREATE` events, so `mkdir -p a/b && touch a/b/f` is seen in full (a file created in the short
//! window between that scan and the new watch can still be missed).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bulkhead_envd::filesystem::{EventType, FilesystemEvent};
use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use super::entry;
use crate::paths::relative_name;
use crate::users::UserDb;

/// Most polling watchers alive at once.
pub const MAX_WATCHERS: usize = 256;
/// Most entries reported for the contents of a directory that appears in a recursive watch.
const MAX_SYNTHETIC_EVENTS: usize = 10_000;
/// Most paths remembered as reported-created (beyond, the set is cleared and a rare duplicate
/// `CREATE` is possible).
const MAX_REMEMBERED: usize = 100_000;
/// How long after a new directory is noticed it is scanned again (its inotify watch is added
/// right after the event handler returns).
const RESCAN_DELAY: Duration = Duration::from_millis(30);

/// Most events a polling watcher buffers between polls (oldest are dropped).
pub const MAX_BUFFERED_EVENTS: usize = 10_000;

/// Errors of watching.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// Setting up inotify failed (e.g. `fs.inotify.max_user_watches` reached).
    #[error("Could not watch {}", .path.display())]
    Notify {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: notify::Error,
    },
    /// Too many polling watchers.
    #[error(
        "Too many watchers exist (limit {MAX_WATCHERS}): remove unused ones with `watcher.stop()` / RemoveWatcher"
    )]
    TooMany,
    /// Unknown watcher id.
    #[error("Watcher {0:?} not found (it may have been removed)")]
    NotFound(String),
}

/// Why a running watch stopped delivering events (inotify overflowed, a watch could not be
/// added for a new directory): what the `sink` of [`watch`] and [`WatcherRegistry::drain`]
/// report instead of an event.
#[derive(Debug, thiserror::Error)]
pub enum WatchEventError {
    /// inotify (through `notify`) reported an error.
    #[error("{0}")]
    Notify(#[source] notify::Error),
}

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Canonical directory.
    pub root: PathBuf,
    /// Include subdirectories.
    pub recursive: bool,
    /// Attach entry info to events.
    pub include_entry: bool,
}

/// Converts notify events to envd events.
#[derive(Clone)]
struct Converter {
    spec: WatchSpec,
    users: UserDb,
    last: Option<(String, EventType)>,
    /// Paths reported as created, shared with the rescan thread.
    created: Arc<Mutex<HashSet<PathBuf>>>,
}

impl Converter {
    /// Record `path` as reported-created; false if it already was.
    fn mark_created(&self, path: &Path) -> bool {
        let mut set = self
            .created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.len() >= MAX_REMEMBERED {
            set.clear();
        }
        set.insert(path.to_path_buf())
    }

    fn forget(&self, path: &Path) {
        let mut set = self
            .created
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        set.retain(|p| !p.starts_with(path));
    }

    /// Converts one notify event; new directories of a recursive watch are pushed to `new_dirs`
    /// for a follow-up scan.
    fn convert(
        &mut self,
        event: notify::Event,
        new_dirs: &mut Vec<PathBuf>,
    ) -> Vec<FilesystemEvent> {
        let r#type = match event.kind {
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                EventType::Create
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => EventType::Rename,
            // `Both` repeats a From/To pair already reported; `Any` has no direction.
            EventKind::Modify(ModifyKind::Name(_)) => return Vec::new(),
            EventKind::Modify(ModifyKind::Metadata(_)) => EventType::Chmod,
            EventKind::Modify(_) => EventType::Write,
            EventKind::Remove(_) => EventType::Remove,
            EventKind::Access(_) | EventKind::Any | EventKind::Other => return Vec::new(),
        };
        let mut out = Vec::new();
        for path in event.paths {
            match r#type {
                EventType::Create if !self.mark_created(&path) => continue,
                EventType::Remove | EventType::Rename => self.forget(&path),
                _ => {}
            }
            let name = relative_name(&self.spec.root, &path);
            // A watched subdirectory that is deleted or moved is reported both by its parent and
            // by itself; report it once.
            let key = (name.clone(), r#type);
            if matches!(r#type, EventType::Remove | EventType::Rename)
                && self.last.as_ref() == Some(&key)
            {
                continue;
            }
            self.last = Some(key);
            let entry = (self.spec.include_entry
                && !matches!(r#type, EventType::Remove | EventType::Rename))
            .then(|| entry::entry_info(&path, &self.users).ok())
            .flatten();
            out.push(FilesystemEvent {
                name,
                r#type: r#type.into(),
                entry,
            });
            if r#type == EventType::Create && self.spec.recursive && path.is_dir() {
                self.report_contents(&path, &mut out);
                new_dirs.push(path);
            }
        }
        out
    }

    /// Reports what a directory that just appeared already contains. notify adds the watch for a
    /// new directory only after this handler returns, so anything created in it before then (a
    /// `mkdir -p a/b && touch a/b/f`, or an upload creating its parents) would otherwise go
    /// unreported.
    fn report_contents(&self, dir: &Path, out: &mut Vec<FilesystemEvent>) {
        let mut pending = vec![dir.to_path_buf()];
        let mut reported = 0;
        while let Some(current) = pending.pop() {
            let Ok(children) = std::fs::read_dir(&current) else {
                continue;
            };
            for child in children.filter_map(Result::ok) {
                if reported >= MAX_SYNTHETIC_EVENTS {
                    return;
                }
                let path = child.path();
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(path.clone());
                }
                if !self.mark_created(&path) {
                    continue;
                }
                let entry = self
                    .spec
                    .include_entry
                    .then(|| entry::entry_info(&path, &self.users).ok())
                    .flatten();
                out.push(FilesystemEvent {
                    name: relative_name(&self.spec.root, &path),
                    r#type: EventType::Create.into(),
                    entry,
                });
                reported += 1;
            }
        }
    }
}

/// Starts watching; `sink` receives each event (or the watcher's error) on notify's thread.
/// Watching stops when the returned watcher is dropped.
pub fn watch<F>(spec: WatchSpec, sink: F) -> Result<RecommendedWatcher, WatchError>
where
    F: FnMut(Result<FilesystemEvent, WatchEventError>) + Send + 'static,
{
    let root = spec.root.clone();
    let mode = if spec.recursive {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    let mut converter = Converter {
        spec,
        users: UserDb::load().unwrap_or_default(),
        last: None,
        created: Arc::new(Mutex::new(HashSet::new())),
    };
    let sink = Arc::new(Mutex::new(sink));
    // Follow-up scans of new directories run on their own thread, after the handler has
    // returned and notify has added the new watch. It ends when the watcher (and so the
    // handler holding the sender) is dropped.
    let (rescan_tx, rescan_rx) = mpsc::channel::<(PathBuf, Instant)>();
    {
        let scanner = converter.clone();
        let sink = Arc::clone(&sink);
        std::thread::Builder::new()
            .name("watch-rescan".into())
            .spawn(move || {
                while let Ok((dir, due)) = rescan_rx.recv() {
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    let mut out = Vec::new();
                    scanner.report_contents(&dir, &mut out);
                    let mut sink = sink
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    for ev in out {
                        sink(Ok(ev));
                    }
                }
            })
            .map_err(|e| WatchError::Notify {
                path: root.clone(),
                source: notify::Error::io(e),
            })?;
    }
    let handler = move |event: notify::Result<notify::Event>| {
        let mut new_dirs = Vec::new();
        let events = event.map(|e| converter.convert(e, &mut new_dirs));
        {
            let mut sink = sink
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match events {
                Ok(events) => events.into_iter().for_each(|ev| sink(Ok(ev))),
                Err(e) => sink(Err(WatchEventError::Notify(e))),
            }
        }
        for d in new_dirs {
            let _ = rescan_tx.send((d, Instant::now() + RESCAN_DELAY));
        }
    };
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher =
        RecommendedWatcher::new(handler, config).map_err(|source| WatchError::Notify {
            path: root.clone(),
            source,
        })?;
    watcher
        .watch(&root, mode)
        .map_err(|source| WatchError::Notify {
            path: root.clone(),
            source,
        })?;
    Ok(watcher)
}

struct PollingWatcher {
    _watcher: RecommendedWatcher,
    buffer: Arc<Mutex<Buffer>>,
}

#[derive(Default)]
struct Buffer {
    events: VecDeque<FilesystemEvent>,
    error: Option<WatchEventError>,
}

/// Polling watchers by id.
#[derive(Default)]
pub struct WatcherRegistry {
    watchers: Mutex<HashMap<String, PollingWatcher>>,
}

fn random_id() -> String {
    let mut bytes = [0_u8; 16];
    // SAFETY: the buffer is valid for writes of its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if usize::try_from(n).ok() != Some(bytes.len()) {
        // getrandom cannot fail for 16 bytes once the pool is initialised; fall back to time.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = nanos.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl WatcherRegistry {
    /// Creates a polling watcher and returns its id.
    pub fn create(&self, spec: WatchSpec) -> Result<String, WatchError> {
        if self.lock().len() >= MAX_WATCHERS {
            return Err(WatchError::TooMany);
        }
        let buffer = Arc::new(Mutex::new(Buffer::default()));
        let sink_buffer = Arc::clone(&buffer);
        let watcher = watch(spec, move |event| {
            let mut buf = sink_buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match event {
                Ok(event) => {
                    if buf.events.len() >= MAX_BUFFERED_EVENTS {
                        buf.events.pop_front();
                    }
                    buf.events.push_back(event);
                }
                Err(e) => buf.error = Some(e),
            }
        })?;
        let id = random_id();
        self.lock().insert(
            id.clone(),
            PollingWatcher {
                _watcher: watcher,
                buffer,
            },
        );
        Ok(id)
    }

    /// Drains the buffered events of a watcher; a watcher error is returned once.
    pub fn drain(
        &self,
        id: &str,
    ) -> Result<Result<Vec<FilesystemEvent>, WatchEventError>, WatchError> {
        let watchers = self.lock();
        let watcher = watchers
            .get(id)
            .ok_or_else(|| WatchError::NotFound(id.to_owned()))?;
        let mut buf = watcher
            .buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(error) = buf.error.take() {
            return Ok(Err(error));
        }
        Ok(Ok(buf.events.drain(..).collect()))
    }

    /// Removes a watcher.
    pub fn remove(&self, id: &str) -> Result<(), WatchError> {
        self.lock()
            .remove(id)
            .map(drop)
            .ok_or_else(|| WatchError::NotFound(id.to_owned()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PollingWatcher>> {
        self.watchers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `path` is on a network or FUSE filesystem (NFS, CIFS/SMB, FUSE), where inotify
/// misses remote changes.
pub fn is_network_mount(path: &Path) -> std::io::Result<bool> {
    const NFS: i64 = 0x6969;
    const CIFS: i64 = 0xFF53_4D42;
    const SMB: i64 = 0x517B;
    const SMB2: i64 = 0xFE53_4D42;
    const FUSE: i64 = 0x6573_5546;
    let stat = nix::sys::statfs::statfs(path)?;
    let kind = stat.filesystem_type().0;
    Ok(matches!(kind, NFS | CIFS | SMB | SMB2 | FUSE))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn polling_watcher_buffers_and_drains() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let registry = WatcherRegistry::default();
        let id = registry
            .create(WatchSpec {
                root: root.clone(),
                recursive: false,
                include_entry: true,
            })
            .unwrap();
        std::fs::write(root.join("a.txt"), "x").unwrap();
        let mut events = Vec::new();
        for _ in 0..100 {
            events.extend(registry.drain(&id).unwrap().unwrap());
            if events
                .iter()
                .any(|e| e.name == "a.txt" && e.r#type() == EventType::Create)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let create = events
            .iter()
            .find(|e| e.r#type() == EventType::Create)
            .expect("create event");
        assert_eq!(
            create.entry.as_ref().unwrap().r#type(),
            bulkhead_envd::filesystem::FileType::File
        );
        registry.remove(&id).unwrap();
        assert!(matches!(registry.drain(&id), Err(WatchError::NotFound(_))));
        assert!(matches!(registry.remove(&id), Err(WatchError::NotFound(_))));
    }

    #[test]
    fn a_watch_error_reads_as_notify_wrote_it() {
        let e = notify::Error::generic("queue overflow").add_path(PathBuf::from("/d"));
        let text = e.to_string();
        assert_eq!(WatchEventError::Notify(e).to_string(), text);
    }

    #[test]
    fn local_tempdir_is_not_a_network_mount() {
        assert!(!is_network_mount(&std::env::temp_dir()).unwrap());
    }
}
