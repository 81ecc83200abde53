//! The driver conformance suite (feature `conformance`), in the manner of youki's
//! `tests/contest`: the cases are written once against the [`Driver`] trait and every driver
//! runs all of them: the fake and the per-template router ([`crate::ByTemplate`], over two
//! fakes) in this crate's tests (no root), the jail and the microvm driver in their own
//! integration tests (as root).
//!
//! A driver's test file implements [`Harness`] (how to make a driver instance on the test's
//! host, a runnable template, how to kill a sandbox behind the driver's back, write a file
//! inside one, tell whether one runs in the background) and expands
//! [`conformance_tests!`](crate::conformance_tests) to get one `#[tokio::test]` per case.
//! Optional capabilities are tested when the driver claims them and must answer
//! [`DriverError::Unsupported`] (or their documented default) when it does not: a case skips
//! only what [`Capabilities`](crate::Capabilities) says the driver lacks, never because the host
//! or the harness cannot do something.
//!
//! The template's agent must answer `GET /health` on the stream [`Driver::connect`] gives with
//! a 2xx status (the real agent does; the jail's test agent does too).

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::capability::{
    ChangeKind, ChangeSource, CheckpointOptions, FileChange, NetworkLink, Operation, RestoreOptions,
};
use crate::driver::Driver;
use crate::error::DriverError;
use crate::handle::{DRIVER_HANDLE_FORMAT, DriverHandle, SandboxSpec};

/// What a driver's test provides to the cases. One harness serves one case: it owns that
/// case's host state (state directory, uid range, cgroup parent, ...).
pub trait Harness {
    type Driver: Driver;

    /// A new driver instance on this harness's host and state. Called once per case and again
    /// to simulate a server restart: the new instance must be able to adopt the sandboxes the
    /// earlier ones started (which outlive them).
    fn driver(&self) -> Self::Driver;

    /// A runnable template whose agent answers `GET /health`, with these limits.
    fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec;

    /// Kill the sandbox's init behind the driver's back (a crash, the OOM killer).
    fn kill_init(&self, handle: &DriverHandle);

    /// Panic if anything of any sandbox is left on the host (processes, mounts, cgroups,
    /// directories). Called after every sandbox of a case has been stopped.
    fn assert_clean(&self);

    /// Write `content` to the file `path` inside the running sandbox `h`, as a process of the
    /// sandbox running as its root would (through the agent, or however the harness can).
    fn write_file(
        &self,
        d: &Self::Driver,
        h: &DriverHandle,
        path: &str,
        content: &str,
    ) -> impl Future<Output = ()>;

    /// Does the sandbox run at the background CPU priority of a warm start? Asked only of
    /// drivers that claim [`warm_start`](crate::Capabilities::warm_start).
    fn in_background(&self, h: &DriverHandle) -> bool;
}

/// The time a live agent gets to answer.
const ANSWER: Duration = Duration::from_secs(10);
/// How long a frozen agent must stay silent.
const SILENCE: Duration = Duration::from_millis(300);
/// The file the change-tracking cases write inside a sandbox (on its disk, not a tmpfs).
const CHANGED: &str = "/tmp/bulkhead-conformance.txt";
/// A second one, written after a snapshot.
const CHANGED_LATER: &str = "/tmp/bulkhead-conformance-later.txt";
const CONTENT: &str = "conformance\n";

/// A path for a case's checkpoint or export that nothing else uses (absent until written).
fn scratch(what: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "bulkhead-conformance-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    ))
}

/// `list`'s entry for `path`, which must be there.
fn entry<'a>(list: &'a [FileChange], path: &str) -> &'a FileChange {
    list.iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("{path} is not among the changes: {list:?}"))
}

fn assert_created_file(list: &[FileChange], path: &str, content: &str) {
    let c = entry(list, path);
    assert_eq!(
        (c.kind, c.file_type.as_str(), c.size),
        (ChangeKind::Created, "file", content.len() as u64),
        "{c:?}"
    );
    assert!(c.mtime.is_some(), "{c:?}");
    let mut sorted = list.to_vec();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(sorted, list, "changes are sorted by path");
}

/// `GET /health` over a fresh stream; the status code.
pub async fn health<D: Driver + ?Sized>(d: &D, h: &DriverHandle) -> Result<u16, DriverError> {
    let mut s = d.connect(h).await?;
    let io = |e| DriverError::io("Health request to the agent failed", e);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
        .await
        .map_err(io)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(io)?;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response from the agent: {text:?}"));
    Ok(status)
}

async fn assert_healthy<D: Driver + ?Sized>(d: &D, h: &DriverHandle) {
    let status = tokio::time::timeout(ANSWER, health(d, h))
        .await
        .expect("the agent answers in time")
        .expect("the agent answers");
    assert!(
        (200..300).contains(&status),
        "GET /health answered {status}"
    );
}

async fn assert_dead<D: Driver + ?Sized>(d: &D, h: &DriverHandle) {
    tokio::time::timeout(ANSWER, d.wait(h))
        .await
        .expect("wait resolves once the sandbox is gone");
    assert!(matches!(d.connect(h).await, Err(DriverError::NotRunning)));
    assert!(matches!(d.usage(h).await, Err(DriverError::NotRunning)));
}

fn assert_unsupported(r: Result<impl std::fmt::Debug, DriverError>, op: Operation) {
    match r {
        Err(DriverError::Unsupported { operation, .. }) => assert_eq!(operation, op),
        other => panic!("{op} must be Unsupported when not claimed, got {other:?}"),
    }
}

/// Start, connect, the agent answers HTTP; the handle names the driver in the current format.
pub async fn start_connect_and_health<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    // The driver's own name, or one of its parts' (a driver made of several).
    assert!(d.owns(&h), "{} does not own its handle {h:?}", d.name());
    assert_eq!(h.format, DRIVER_HANDLE_FORMAT);
    assert_healthy(&d, &h).await;
    // Several streams, one after another and at once.
    let (a, b) = tokio::join!(health(&d, &h), health(&d, &h));
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    d.stop(&h).await.expect("stop");
    t.assert_clean();
}

/// Stop is idempotent, and a stopped sandbox is not running.
pub async fn stop_is_idempotent<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    d.stop(&h).await.expect("stop");
    assert_dead(&d, &h).await;
    d.stop(&h).await.expect("stopping twice is fine");
    t.assert_clean();
}

/// `wait` stays pending while the sandbox runs and resolves when it is stopped or dies on its
/// own; on a sandbox that is already gone it returns at once.
pub async fn wait_resolves_on_stop_and_on_death<H: Harness>(t: &H) {
    let d = t.driver();
    let a = d.start(&t.spec(128, 64)).await.expect("start a");
    let b = d.start(&t.spec(128, 64)).await.expect("start b");
    assert!(
        tokio::time::timeout(SILENCE, d.wait(&a)).await.is_err(),
        "wait resolved on a running sandbox"
    );
    let (waited, stopped) = tokio::join!(tokio::time::timeout(ANSWER, d.wait(&a)), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        d.stop(&a).await
    });
    stopped.expect("stop a");
    waited.expect("wait resolves when the sandbox is stopped");

    t.kill_init(&b);
    assert_dead(&d, &b).await;
    assert_dead(&d, &a).await;
    d.stop(&b).await.expect("stop a dead sandbox");
    tokio::time::timeout(Duration::from_secs(1), d.wait(&b))
        .await
        .expect("wait on a stopped sandbox returns at once");
    t.assert_clean();
}

/// A restarted server (a fresh driver instance) adopts a live sandbox from its stored handle,
/// and refuses a handle with the wrong pid start time, from a newer format, or of a dead
/// sandbox.
pub async fn adopt_after_a_restart<H: Harness>(t: &H) {
    let h = {
        let d1 = t.driver();
        d1.start(&t.spec(128, 64)).await.expect("start")
    };
    // Stored and read back like the engine does.
    let stored = serde_json::to_string(&h).unwrap();
    let h: DriverHandle = serde_json::from_str(&stored).unwrap();

    let d2 = t.driver();
    let mut wrong = h.clone();
    wrong.pid_start_time += 1;
    assert!(!d2.adopt(&wrong).await, "a wrong pid start time is refused");
    let mut newer = h.clone();
    newer.format = DRIVER_HANDLE_FORMAT + 1;
    assert!(!d2.adopt(&newer).await, "a newer handle format is refused");
    let mut foreign = h.clone();
    foreign.driver = format!("not-{}", d2.name());
    assert!(
        !d2.adopt(&foreign).await,
        "another driver's handle is refused"
    );

    assert!(d2.adopt(&h).await, "a live sandbox is adopted");
    assert!(d2.adopt(&h).await, "adopting twice is harmless");
    assert_healthy(&d2, &h).await;
    assert!(d2.usage(&h).await.expect("usage").pids_current >= 1);

    d2.stop(&h).await.expect("stop");
    assert_dead(&d2, &h).await;
    assert!(!d2.adopt(&h).await, "a stopped sandbox cannot be adopted");
    let d3 = t.driver();
    assert!(!d3.adopt(&h).await, "nor by yet another server");
    t.assert_clean();
}

/// After a restart, `reclaim_orphans` stops every sandbox not in `keep` (pool members and
/// sandboxes whose record was lost) and leaves the kept ones alone.
pub async fn reclaim_orphans_keeps_what_it_is_told<H: Harness>(t: &H) {
    let (a, b, c) = {
        let d1 = t.driver();
        let a = d1.start(&t.spec(128, 64)).await.expect("start a");
        let b = d1.start(&t.spec(128, 64)).await.expect("start b");
        let c = d1.start(&t.spec(128, 64)).await.expect("start c");
        (a, b, c)
    };
    let d2 = t.driver();
    assert!(d2.adopt(&a).await);
    assert_eq!(
        d2.reclaim_orphans(std::slice::from_ref(&a))
            .await
            .expect("reclaim"),
        2
    );
    assert_dead(&d2, &b).await;
    assert_dead(&d2, &c).await;
    assert_healthy(&d2, &a).await;
    assert_eq!(
        d2.reclaim_orphans(std::slice::from_ref(&a)).await.unwrap(),
        0,
        "nothing left to reclaim"
    );
    // Sandboxes of this run that the engine no longer wants go too.
    let d = d2.start(&t.spec(128, 64)).await.expect("start d");
    assert_eq!(d2.reclaim_orphans(&[]).await.unwrap(), 2);
    assert_dead(&d2, &a).await;
    assert_dead(&d2, &d).await;
    t.assert_clean();
}

/// The spec's limits are applied: usage reports the memory limit and live counters.
pub async fn limits_show_in_usage<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(96, 48)).await.expect("start");
    assert_healthy(&d, &h).await;
    let u = d.usage(&h).await.expect("usage");
    assert_eq!(u.mem_limit_bytes, 96 << 20, "{u:?}");
    assert!(u.pids_current >= 1 && u.pids_current <= 48, "{u:?}");
    assert!(u.mem_used_bytes > 0 && u.cpu_usage_ns > 0, "{u:?}");
    d.stop(&h).await.expect("stop");
    t.assert_clean();
}

/// The network link, when the driver offers one: opened on a running sandbox, refused on a
/// stopped one; `Unsupported` otherwise.
pub async fn network_link<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    if d.capabilities().network == NetworkLink::None {
        assert_unsupported(d.open_network(&h).await, Operation::OpenNetwork);
    } else {
        let link = d.open_network(&h).await.expect("open_network");
        assert_healthy(&d, &h).await;
        drop(link);
        d.stop(&h).await.expect("stop");
        assert!(matches!(
            d.open_network(&h).await,
            Err(DriverError::NotRunning)
        ));
    }
    d.stop(&h).await.expect("stop");
    t.assert_clean();
}

/// Freeze and thaw, when claimed: a frozen agent accepts a request but answers only once
/// thawed; both are idempotent; a frozen sandbox still reports usage and can be stopped.
pub async fn freeze_and_thaw<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    if !d.capabilities().freeze {
        assert_unsupported(d.freeze(&h).await, Operation::Freeze);
        assert_unsupported(d.thaw(&h).await, Operation::Thaw);
        d.stop(&h).await.expect("stop");
        t.assert_clean();
        return;
    }
    d.freeze(&h).await.expect("freeze");
    d.freeze(&h).await.expect("freezing twice is fine");
    let pending = health(&d, &h);
    tokio::pin!(pending);
    assert!(
        tokio::time::timeout(SILENCE, &mut pending).await.is_err(),
        "a frozen agent answered"
    );
    assert!(d.usage(&h).await.expect("usage while frozen").pids_current >= 1);
    assert!(
        tokio::time::timeout(SILENCE, d.wait(&h)).await.is_err(),
        "a frozen sandbox is not dead"
    );
    d.thaw(&h).await.expect("thaw");
    let status = tokio::time::timeout(ANSWER, pending)
        .await
        .expect("the request waiting in the frozen agent is answered after the thaw")
        .expect("health");
    assert!((200..300).contains(&status), "{status}");
    d.thaw(&h).await.expect("thawing a running sandbox is fine");
    assert_healthy(&d, &h).await;

    // A frozen sandbox can be stopped.
    d.freeze(&h).await.expect("freeze again");
    d.stop(&h).await.expect("stop a frozen sandbox");
    assert_dead(&d, &h).await;
    assert!(matches!(d.freeze(&h).await, Err(DriverError::NotRunning)));
    assert!(matches!(d.thaw(&h).await, Err(DriverError::NotRunning)));
    t.assert_clean();
}

/// Checkpoint (the sandbox ends) and restore, when claimed; `Unsupported` otherwise.
pub async fn checkpoint_and_restore<H: Harness>(t: &H) {
    let d = t.driver();
    let spec = t.spec(128, 64);
    let h = d.start(&spec).await.expect("start");
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-conformance-{}-{}",
        std::process::id(),
        h.pid
    ));
    let opts = CheckpointOptions {
        leave_running: false,
        ..Default::default()
    };
    if !d.capabilities().checkpoint {
        assert_unsupported(d.checkpoint(&h, &dir, opts).await, Operation::Checkpoint);
        assert_unsupported(
            d.restore(&spec, &dir, RestoreOptions::default()).await,
            Operation::Restore,
        );
        d.stop(&h).await.expect("stop");
        t.assert_clean();
        return;
    }
    let info = d.checkpoint(&h, &dir, opts).await.expect("checkpoint");
    assert_eq!(
        info.driver, h.driver,
        "the sandbox's driver wrote the checkpoint"
    );
    assert_dead(&d, &h).await;
    d.stop(&h).await.expect("stop after a checkpoint");
    let r = d
        .restore(&spec, &dir, RestoreOptions::default())
        .await
        .expect("restore");
    assert_healthy(&d, &r).await;
    d.stop(&r).await.expect("stop the restored sandbox");
    let _ = std::fs::remove_dir_all(&dir);
    t.assert_clean();
}

/// Snapshot (checkpoint leaving the sandbox running) and restore as a second sandbox (fork),
/// when claimed; `Unsupported` otherwise.
pub async fn snapshot_and_fork<H: Harness>(t: &H) {
    let d = t.driver();
    let spec = t.spec(128, 64);
    let h = d.start(&spec).await.expect("start");
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-conformance-snap-{}-{}",
        std::process::id(),
        h.pid
    ));
    let opts = CheckpointOptions {
        leave_running: true,
        ..Default::default()
    };
    if !d.capabilities().snapshot {
        assert_unsupported(d.checkpoint(&h, &dir, opts).await, Operation::Snapshot);
        d.stop(&h).await.expect("stop");
        t.assert_clean();
        return;
    }
    d.checkpoint(&h, &dir, opts).await.expect("snapshot");
    assert_healthy(&d, &h).await;
    let fork = d
        .restore(&spec, &dir, RestoreOptions::default())
        .await
        .expect("fork");
    assert_ne!((fork.pid, fork.slot), (h.pid, h.slot));
    assert_healthy(&d, &fork).await;
    assert_healthy(&d, &h).await;
    d.stop(&fork).await.expect("stop the fork");
    d.stop(&h).await.expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
    t.assert_clean();
}

/// Warm start and claim: a warm sandbox is a working sandbox; with `warm_start` it runs in the
/// background until claimed (and a plain start never does), without it a warm start is a plain
/// start. Claiming is idempotent.
pub async fn warm_start_and_claim<H: Harness>(t: &H) {
    let d = t.driver();
    let warm = d.capabilities().warm_start;
    let spec = t.spec(128, 64);
    let h = d.start_warm(&spec).await.expect("warm start");
    assert!(d.owns(&h));
    assert_healthy(&d, &h).await;
    if warm {
        assert!(
            t.in_background(&h),
            "a warm sandbox waits in the background"
        );
    }
    d.claimed(&h).await.expect("claim");
    if warm {
        assert!(
            !t.in_background(&h),
            "a claimed sandbox runs in the foreground"
        );
    }
    d.claimed(&h).await.expect("claiming twice is fine");
    assert_healthy(&d, &h).await;
    assert!(d.usage(&h).await.expect("usage").pids_current >= 1);
    let plain = d.start(&spec).await.expect("start");
    if warm {
        assert!(
            !t.in_background(&plain),
            "a plain start is in the foreground"
        );
    }
    d.claimed(&plain)
        .await
        .expect("claiming a plain start changes nothing");
    d.stop(&plain).await.expect("stop");
    d.stop(&h).await.expect("stop");
    t.assert_clean();
}

/// Change tracking, when claimed: a fresh sandbox changed nothing, a file it writes is listed as
/// created; with `snapshot` as well, a snapshot's changes are listed from the checkpoint, and a
/// listing since the snapshot shows only what came after it. `Unsupported` otherwise.
pub async fn changes_list_what_the_sandbox_wrote<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    let running = ChangeSource::Running(h.clone());
    if !d.capabilities().changes {
        assert_unsupported(d.changes(&running, None).await, Operation::Changes);
        d.stop(&h).await.expect("stop");
        t.assert_clean();
        return;
    }
    assert_eq!(
        d.changes(&running, None).await.expect("changes"),
        vec![],
        "a fresh sandbox changed nothing"
    );
    t.write_file(&d, &h, CHANGED, CONTENT).await;
    let list = d.changes(&running, None).await.expect("changes");
    assert_created_file(&list, CHANGED, CONTENT);

    if d.capabilities().snapshot {
        let dir = scratch("changes");
        let opts = CheckpointOptions {
            leave_running: true,
            ..Default::default()
        };
        d.checkpoint(&h, &dir, opts).await.expect("snapshot");
        let of_snapshot = d
            .changes(&ChangeSource::Checkpoint(dir.clone()), None)
            .await
            .expect("changes of the snapshot");
        assert_created_file(&of_snapshot, CHANGED, CONTENT);
        assert_eq!(
            d.changes(&running, Some(&dir))
                .await
                .expect("changes since"),
            vec![],
            "nothing changed since the snapshot"
        );
        t.write_file(&d, &h, CHANGED_LATER, CONTENT).await;
        let since = d
            .changes(&running, Some(&dir))
            .await
            .expect("changes since");
        assert_created_file(&since, CHANGED_LATER, CONTENT);
        assert_eq!(
            since.len(),
            1,
            "only what came after the snapshot: {since:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    d.stop(&h).await.expect("stop");
    assert!(matches!(
        d.changes(&running, None).await,
        Err(DriverError::NotRunning)
    ));
    t.assert_clean();
}

/// Export, when claimed: the sandbox ends and its changes are at the destination as an overlay
/// layer; a destination that exists is refused. `Unsupported` otherwise.
pub async fn export_changes_ends_the_sandbox<H: Harness>(t: &H) {
    let d = t.driver();
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    let dest = scratch("export");
    if !d.capabilities().export_changes {
        assert_unsupported(d.export_changes(&h, &dest).await, Operation::ExportChanges);
        assert!(!dest.exists(), "an unsupported export writes nothing");
        d.stop(&h).await.expect("stop");
        t.assert_clean();
        return;
    }
    t.write_file(&d, &h, CHANGED, CONTENT).await;
    std::fs::create_dir_all(&dest).expect("create a directory in the way");
    assert!(
        d.export_changes(&h, &dest).await.is_err(),
        "an existing destination is refused"
    );
    std::fs::remove_dir(&dest).expect("remove it");
    assert_healthy(&d, &h).await;
    d.export_changes(&h, &dest).await.expect("export");
    assert_dead(&d, &h).await;
    let exported = dest.join(CHANGED.trim_start_matches('/'));
    assert_eq!(
        std::fs::read_to_string(&exported).expect("the exported file"),
        CONTENT
    );
    d.stop(&h).await.expect("stop after an export");
    let _ = std::fs::remove_dir_all(&dest);
    t.assert_clean();
}

/// `checkpoint_info` knows a complete checkpoint of this driver (from a fresh instance too, as
/// after a crash) and nothing else; `checkpoint_key`, when claimed, names the same thing in
/// every instance. Without `checkpoint`, no directory is a checkpoint; without
/// `checkpoint_key`, the key is `None`.
pub async fn checkpoint_info_and_key<H: Harness>(t: &H) {
    let d = t.driver();
    let caps = d.capabilities();
    match d.checkpoint_key() {
        Some(key) if caps.checkpoint_key => {
            assert!(!key.is_empty(), "an empty checkpoint key");
            assert_eq!(t.driver().checkpoint_key(), Some(key), "a stable key");
        }
        key => assert_eq!(
            (caps.checkpoint_key, key.is_some()),
            (false, false),
            "checkpoint_key answers Some exactly when the capability is claimed"
        ),
    }
    let dir = scratch("info");
    assert_eq!(d.checkpoint_info(&dir), None, "a missing directory");
    std::fs::create_dir_all(&dir).expect("create an empty directory");
    std::fs::write(dir.join("checkpoint.json"), "{}").expect("write a stray file");
    assert_eq!(
        d.checkpoint_info(&dir),
        None,
        "a directory of something else"
    );
    std::fs::remove_dir_all(&dir).expect("remove it");
    if !caps.checkpoint {
        return;
    }
    let h = d.start(&t.spec(128, 64)).await.expect("start");
    let opts = CheckpointOptions {
        leave_running: false,
        ..Default::default()
    };
    let info = d.checkpoint(&h, &dir, opts).await.expect("checkpoint");
    assert!(info.memory, "{info:?}");
    assert_eq!(info.dir, dir);
    let found = t
        .driver()
        .checkpoint_info(&dir)
        .expect("a fresh instance recognises the complete checkpoint");
    assert_eq!(
        (&found.driver, found.format, &found.dir, found.memory),
        (&info.driver, info.format, &info.dir, info.memory)
    );
    d.stop(&h).await.expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
    t.assert_clean();
}

/// A handle survives the store: it round-trips through JSON, and one stored by a server
/// before handles had a format (no `format` field) still adopts.
pub async fn handle_format_round_trips<H: Harness>(t: &H) {
    let h = t.driver().start(&t.spec(128, 64)).await.expect("start");
    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json["format"], DRIVER_HANDLE_FORMAT);
    assert_eq!(
        serde_json::from_value::<DriverHandle>(json.clone()).unwrap(),
        h
    );

    let mut old = json;
    old.as_object_mut().unwrap().remove("format");
    let old: DriverHandle = serde_json::from_value(old).unwrap();
    assert_eq!(old.format, 1);
    let d = t.driver();
    // Format 1 is what old servers wrote; while it is current, they are adopted as they are.
    assert_eq!(
        d.adopt(&old).await,
        DRIVER_HANDLE_FORMAT == 1,
        "adopting a handle without a format"
    );
    d.stop(&h).await.expect("stop");
    t.assert_clean();
}

/// One `#[tokio::test]` per conformance case. `$harness` makes a fresh [`Harness`] for each
/// case; attributes given after it go on every case, above `#[tokio::test]` (e.g. the capability
/// gate `#[bulkhead_testkit::requires(Root)]`, which reports the cases as ignored where the host
/// cannot run them and fails them when they are run anyway).
///
/// ```text
/// bulkhead_driver::conformance_tests!(FakeHarness::new());
/// bulkhead_driver::conformance_tests!(JailHarness::new(); #[requires(Root)]);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr $(; $(#[$attr:meta])*)?) => {
        $crate::conformance_tests!(@cases $harness; [$($(#[$attr])*)?];
            start_connect_and_health,
            stop_is_idempotent,
            wait_resolves_on_stop_and_on_death,
            adopt_after_a_restart,
            reclaim_orphans_keeps_what_it_is_told,
            limits_show_in_usage,
            network_link,
            freeze_and_thaw,
            checkpoint_and_restore,
            snapshot_and_fork,
            warm_start_and_claim,
            changes_list_what_the_sandbox_wrote,
            export_changes_ends_the_sandbox,
            checkpoint_info_and_key,
            handle_format_round_trips,
        );
    };
    (@cases $harness:expr; $attrs:tt; $($case:ident),* $(,)?) => {
        $(
            $crate::conformance_tests!(@case $harness; $attrs; $case);
        )*
    };
    (@case $harness:expr; [$(#[$attr:meta])*]; $case:ident) => {
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let harness = $harness;
            $crate::conformance::$case(&harness).await;
        }
    };
}
