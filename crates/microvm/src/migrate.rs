//! The QMP migration sequences behind snapshots and checkpoints: the state goes to and comes
//! from a file descriptor handed over with `getfd` (QEMU's seccomp filter forbids `exec:` URIs,
//! QEMU 7.2 has no `file:` one, and QEMU never opens the files itself). Blocking: run them off
//! the async runtime.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::qmp;

/// QMP's name for the snapshot's state fd, in both directions.
pub const STATE_FD: &str = "bulkhead-snapshot";
/// Longest a save or a load of the device state may take.
pub const MIGRATION: Duration = Duration::from_secs(60);

/// Ignore-shared migration (`on`): the RAM stays in its file, only device state is written.
/// Set both ways: a clone keeps the capability its restore set, and a checkpoint of it must
/// carry its RAM.
fn ignore_shared(q: &mut qmp::Blocking, on: bool) -> std::io::Result<()> {
    q.execute(
        "migrate-set-capabilities",
        json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": on }] }),
    )
    .map(|_| ())
}

/// Stops the VM and writes its state to `state`: only the devices with `ignore_shared` (the
/// template VM, whose RAM is its shared file), RAM too otherwise (a checkpoint). The VM stays
/// stopped (`postmigrate`; `cont` resumes it).
pub fn save_state(qmp_socket: &Path, state: &Path, shared: bool) -> std::io::Result<()> {
    let mut q = qmp::Blocking::connect(qmp_socket, Duration::from_secs(10))?;
    ignore_shared(&mut q, shared)?;
    // QEMU's default throttle (128 MiB/s) would slow the save twentyfold.
    q.execute(
        "migrate-set-parameters",
        json!({ "max-bandwidth": 1u64 << 40 }),
    )?;
    q.execute("stop", serde_json::Value::Null)?;
    let f = std::fs::File::create(state)?;
    q.pass_fd(f.as_fd(), STATE_FD)?;
    drop(f);
    q.execute("migrate", json!({ "uri": format!("fd:{STATE_FD}") }))?;
    q.poll("query-migrate", MIGRATION, |v| {
        match v.get("status").and_then(|s| s.as_str()) {
            Some("completed") => Ok(true),
            Some("failed") | Some("cancelled") => Err(std::io::Error::other(format!(
                "the migration to the snapshot file failed: {v}"
            ))),
            _ => Ok(false),
        }
    })?;
    Ok(())
}

/// Feeds `state` to a VM started with `-incoming defer`, then starts its vCPUs.
pub fn load_state(qmp_socket: &Path, state: &std::fs::File, shared: bool) -> std::io::Result<()> {
    let mut q = qmp::Blocking::connect(qmp_socket, Duration::from_secs(10))?;
    ignore_shared(&mut q, shared)?;
    q.pass_fd(state.as_fd(), STATE_FD)?;
    q.execute(
        "migrate-incoming",
        json!({ "uri": format!("fd:{STATE_FD}") }),
    )?;
    // QEMU exits when the incoming migration fails: the poll then sees the socket close.
    q.poll("query-status", MIGRATION, |v| {
        Ok(v.get("status").and_then(|s| s.as_str()) != Some("inmigrate"))
    })?;
    q.execute("cont", serde_json::Value::Null)?;
    Ok(())
}
