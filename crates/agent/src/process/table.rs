//! The registry of processes started through `Start`: running ones, with their event
//! subscribers, and recently exited ones, so a late `Connect` still gets the `end` event.
//!
//! Event delivery: each stream (`Start` or `Connect`) subscribes with a bounded channel. Output
//! pumps and the exit waiter `publish` to every subscriber and wait for room, so a slow client
//! slows the process down (pipe back-pressure) instead of growing memory, and a disconnected
//! client — whose receiver is dropped with the response body — is removed at once. No task
//! exists per stream: the response body itself polls the receiver.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bulkhead_envd::process::process_event::EndEvent;
use bulkhead_envd::process::{ProcessConfig, ProcessEvent, ProcessInfo};
use tokio::sync::{mpsc, watch};

use super::io::ProcessInput;

/// Capacity of each subscriber's event channel.
const SUBSCRIBER_BUFFER: usize = 64;
/// How many exited processes are remembered.
pub const EXIT_HISTORY_LEN: usize = 1000;
/// How long an exited process is remembered.
pub const EXIT_HISTORY_TTL: Duration = Duration::from_secs(600);

/// A process started through `Start` that has not ended yet (or is delivering its last output).
pub struct ProcessHandle {
    /// Process id (also its process group and session id).
    pub pid: u32,
    /// Start order, used to prefer the newest process when tags collide.
    pub seq: u64,
    /// What was started.
    pub config: ProcessConfig,
    /// Tag given at start.
    pub tag: Option<String>,
    /// Where input goes.
    pub input: ProcessInput,
    inner: Mutex<Inner>,
    reaped: watch::Sender<bool>,
}

struct Inner {
    subscribers: Vec<(u64, mpsc::Sender<ProcessEvent>)>,
    next_subscriber: u64,
    ended: Option<EndEvent>,
}

/// Result of [`ProcessHandle::subscribe`].
pub enum Subscribe {
    /// The process is live; events arrive on the subscription.
    Live(Subscription),
    /// The process already ended with this event.
    Ended(EndEvent),
}

/// A live event subscription; unsubscribes when dropped.
pub struct Subscription {
    /// Events: `data`… then `end`.
    pub events: mpsc::Receiver<ProcessEvent>,
    id: u64,
    handle: Arc<ProcessHandle>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.handle.unsubscribe(self.id);
    }
}

impl ProcessHandle {
    /// A handle for a freshly spawned process.
    pub fn new(
        pid: u32,
        seq: u64,
        config: ProcessConfig,
        tag: Option<String>,
        input: ProcessInput,
    ) -> Self {
        Self {
            pid,
            seq,
            config,
            tag,
            input,
            inner: Mutex::new(Inner {
                subscribers: Vec::new(),
                next_subscriber: 0,
                ended: None,
            }),
            reaped: watch::channel(false).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `ProcessInfo` for `List`.
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: Some(self.config.clone()),
            pid: self.pid,
            tag: self.tag.clone(),
        }
    }

    /// Subscribes to future events (output is not replayed).
    pub fn subscribe(self: &Arc<Self>) -> Subscribe {
        let mut inner = self.lock();
        if let Some(end) = &inner.ended {
            return Subscribe::Ended(end.clone());
        }
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let id = inner.next_subscriber;
        inner.next_subscriber += 1;
        inner.subscribers.push((id, tx));
        Subscribe::Live(Subscription {
            events: rx,
            id,
            handle: Arc::clone(self),
        })
    }

    fn unsubscribe(&self, id: u64) {
        self.lock().subscribers.retain(|(sid, _)| *sid != id);
    }

    /// Number of live subscribers.
    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// Delivers an event to every subscriber, waiting for room in each channel.
    pub async fn publish(&self, event: ProcessEvent) {
        let subscribers: Vec<_> = self.lock().subscribers.clone();
        for (id, tx) in subscribers {
            if tx.send(event.clone()).await.is_err() {
                self.unsubscribe(id);
            }
        }
    }

    /// Records the end and delivers it to every subscriber; later subscribers get it directly.
    pub async fn finish(&self, end: EndEvent) {
        let subscribers = {
            let mut inner = self.lock();
            inner.ended = Some(end.clone());
            std::mem::take(&mut inner.subscribers)
        };
        for (_, tx) in subscribers {
            let _ = tx.send(ProcessEvent::end(end.clone())).await;
        }
    }

    /// Marks the process as reaped (its pid may be reused from now on).
    pub fn mark_reaped(&self) {
        self.reaped.send_replace(true);
    }

    /// Whether the process has been reaped.
    pub fn is_reaped(&self) -> bool {
        *self.reaped.borrow()
    }

    /// Resolves once the process has been reaped.
    pub async fn wait_reaped(&self) {
        let mut rx = self.reaped.subscribe();
        let _ = rx.wait_for(|reaped| *reaped).await;
    }

    /// Sends `signal` to the process group (the process is its group leader), falling back to
    /// the process itself. Does nothing once the process has been reaped, so a reused pid is
    /// never signalled.
    pub fn signal_group(&self, signal: i32) -> std::io::Result<()> {
        if self.is_reaped() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.pid)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: killpg has no memory-safety preconditions.
        if unsafe { libc::killpg(pid, signal) } == 0 {
            return Ok(());
        }
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(pid, signal) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// A process that ended recently.
#[derive(Debug, Clone)]
pub struct ExitRecord {
    /// Process id it had.
    pub pid: u32,
    /// Tag it had.
    pub tag: Option<String>,
    /// How it ended.
    pub end: EndEvent,
    at: Instant,
}

/// What a selector found.
pub enum Found {
    /// A running process.
    Running(Arc<ProcessHandle>),
    /// A recently exited process.
    Exited(ExitRecord),
}

/// Errors of the table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The concurrency cap is reached.
    #[error(
        "Too many processes are running in this sandbox (limit: {limit}). Wait for some of them to \
         finish or kill them (e.g. `sandbox.commands.kill(pid)`; list them with \
         `sandbox.commands.list()`) before starting new ones"
    )]
    Full {
        /// The cap.
        limit: usize,
    },
}

struct TableInner {
    running: HashMap<u32, Arc<ProcessHandle>>,
    starting: usize,
    exited: VecDeque<ExitRecord>,
}

/// The registry.
pub struct ProcessTable {
    inner: Mutex<TableInner>,
    limit: usize,
    seq: AtomicU64,
}

/// A reserved slot for a process being started; released on drop unless committed.
pub struct Reservation<'a> {
    table: &'a ProcessTable,
    active: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.active {
            self.table.lock().starting -= 1;
        }
    }
}

impl Reservation<'_> {
    /// Registers the started process, converting the reservation.
    pub fn commit(mut self, handle: Arc<ProcessHandle>) {
        let mut inner = self.table.lock();
        inner.starting -= 1;
        self.active = false;
        inner.running.insert(handle.pid, handle);
    }
}

impl ProcessTable {
    /// A table allowing `limit` concurrently running processes.
    pub fn new(limit: usize) -> Self {
        Self {
            inner: Mutex::new(TableInner {
                running: HashMap::new(),
                starting: 0,
                exited: VecDeque::new(),
            }),
            limit: limit.max(1),
            seq: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TableInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next start sequence number.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Reserves a slot for a new process, or fails when the cap is reached.
    pub fn reserve(&self) -> Result<Reservation<'_>, TableError> {
        let mut inner = self.lock();
        if inner.running.len() + inner.starting >= self.limit {
            return Err(TableError::Full { limit: self.limit });
        }
        inner.starting += 1;
        Ok(Reservation {
            table: self,
            active: true,
        })
    }

    /// Moves a finished process to the exit history.
    pub fn record_exit(&self, handle: &ProcessHandle, end: EndEvent) {
        let mut inner = self.lock();
        if inner
            .running
            .get(&handle.pid)
            .is_some_and(|h| h.seq == handle.seq)
        {
            inner.running.remove(&handle.pid);
        }
        inner.exited.push_back(ExitRecord {
            pid: handle.pid,
            tag: handle.tag.clone(),
            end,
            at: Instant::now(),
        });
        Self::prune(&mut inner);
    }

    fn prune(inner: &mut TableInner) {
        while inner.exited.len() > EXIT_HISTORY_LEN {
            inner.exited.pop_front();
        }
        while inner
            .exited
            .front()
            .is_some_and(|r| r.at.elapsed() > EXIT_HISTORY_TTL)
        {
            inner.exited.pop_front();
        }
    }

    /// Finds a process by pid: running first, then the most recent exit.
    pub fn by_pid(&self, pid: u32) -> Option<Found> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        if let Some(h) = inner.running.get(&pid) {
            return Some(Found::Running(Arc::clone(h)));
        }
        inner
            .exited
            .iter()
            .rev()
            .find(|r| r.pid == pid)
            .cloned()
            .map(Found::Exited)
    }

    /// Finds a process by tag: the newest running one, then the most recent exit.
    pub fn by_tag(&self, tag: &str) -> Option<Found> {
        let mut inner = self.lock();
        Self::prune(&mut inner);
        if let Some(h) = inner
            .running
            .values()
            .filter(|h| h.tag.as_deref() == Some(tag))
            .max_by_key(|h| h.seq)
        {
            return Some(Found::Running(Arc::clone(h)));
        }
        inner
            .exited
            .iter()
            .rev()
            .find(|r| r.tag.as_deref() == Some(tag))
            .cloned()
            .map(Found::Exited)
    }

    /// Running processes, oldest first.
    pub fn running(&self) -> Vec<Arc<ProcessHandle>> {
        let mut list: Vec<_> = self.lock().running.values().cloned().collect();
        list.sort_by_key(|h| h.seq);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(table: &ProcessTable, pid: u32, tag: Option<&str>) -> Arc<ProcessHandle> {
        Arc::new(ProcessHandle::new(
            pid,
            table.next_seq(),
            ProcessConfig::default(),
            tag.map(str::to_owned),
            ProcessInput::None,
        ))
    }

    fn end(code: i32) -> EndEvent {
        EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        }
    }

    #[test]
    fn cap_counts_running_and_starting() {
        let table = ProcessTable::new(2);
        let a = table.reserve().unwrap();
        let b = table.reserve().unwrap();
        assert!(matches!(
            table.reserve(),
            Err(TableError::Full { limit: 2 })
        ));
        drop(b);
        let h = handle(&table, 10, None);
        a.commit(Arc::clone(&h));
        let c = table.reserve().unwrap();
        assert!(table.reserve().is_err());
        drop(c);
        table.record_exit(&h, end(0));
        assert!(table.reserve().is_ok());
    }

    #[test]
    fn lookups_prefer_running_then_latest_exit() {
        let table = ProcessTable::new(10);
        let old = handle(&table, 5, Some("t"));
        table.reserve().unwrap().commit(Arc::clone(&old));
        table.record_exit(&old, end(1));
        let new = handle(&table, 6, Some("t"));
        table.reserve().unwrap().commit(Arc::clone(&new));
        assert!(matches!(table.by_tag("t"), Some(Found::Running(h)) if h.pid == 6));
        assert!(matches!(table.by_pid(5), Some(Found::Exited(r)) if r.end.exit_code == 1));
        assert!(table.by_pid(7).is_none());
        table.record_exit(&new, end(2));
        assert!(matches!(table.by_tag("t"), Some(Found::Exited(r)) if r.pid == 6));
        assert!(table.running().is_empty());
    }

    #[tokio::test]
    async fn subscribers_get_output_then_end_and_late_ones_get_end() {
        let table = ProcessTable::new(10);
        let h = handle(&table, 9, None);
        let Subscribe::Live(mut sub) = h.subscribe() else {
            panic!("should be live")
        };
        h.publish(ProcessEvent::keepalive()).await;
        h.finish(end(0)).await;
        assert_eq!(sub.events.recv().await, Some(ProcessEvent::keepalive()));
        assert_eq!(sub.events.recv().await, Some(ProcessEvent::end(end(0))));
        assert_eq!(sub.events.recv().await, None);
        assert!(matches!(h.subscribe(), Subscribe::Ended(e) if e == end(0)));
    }

    #[tokio::test]
    async fn dropped_subscription_is_removed() {
        let table = ProcessTable::new(10);
        let h = handle(&table, 9, None);
        let sub = h.subscribe();
        assert_eq!(h.subscriber_count(), 1);
        drop(sub);
        assert_eq!(h.subscriber_count(), 0);
        // Publishing with nobody listening does not block.
        h.publish(ProcessEvent::keepalive()).await;
    }
}
