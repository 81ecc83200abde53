//! Freezing a sandbox's cgroup: every task stops where it is (the agent included) and goes on
//! when thawed; memory stays allocated. v1 writes `FROZEN`/`THAWED` to `freezer.state` and
//! reads it back until the kernel has finished (`FREEZING` in between); v2 writes 1/0 to
//! `cgroup.freeze` and waits for `frozen 1`/`frozen 0` in `cgroup.events`.
//!
//! A frozen task on v1 does not die of SIGKILL until it is thawed, so whoever kills a sandbox
//! thaws it right after sending the signal ([`thaw_now`]).

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The files that freeze one sandbox cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freezer {
    /// `<freezer hierarchy>/<parent>/<name>/freezer.state`.
    V1 { state: PathBuf },
    /// `<root>/<parent>/<name>/cgroup.freeze` and `cgroup.events`.
    V2 { freeze: PathBuf, events: PathBuf },
}

impl Freezer {
    /// The cgroup directory itself (CRIU's `--freeze-cgroup`).
    pub fn cgroup_dir(&self) -> PathBuf {
        let file = match self {
            Freezer::V1 { state } => state,
            Freezer::V2 { freeze, .. } => freeze,
        };
        file.parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default()
    }

    /// Ask the kernel to freeze (`true`) or thaw the cgroup, without waiting.
    pub fn request(&self, frozen: bool) -> io::Result<()> {
        let (path, value) = match self {
            Freezer::V1 { state } => (state, if frozen { "FROZEN" } else { "THAWED" }),
            Freezer::V2 { freeze, .. } => (freeze, if frozen { "1" } else { "0" }),
        };
        fs::write(path, value)
    }

    /// Has the kernel finished freezing (`Some(true)`) or thawing (`Some(false)`)? None while
    /// it is on its way.
    pub fn state(&self) -> io::Result<Option<bool>> {
        match self {
            Freezer::V1 { state } => Ok(match fs::read_to_string(state)?.trim() {
                "FROZEN" => Some(true),
                "THAWED" => Some(false),
                _ => None,
            }),
            Freezer::V2 { freeze, events } => {
                let want = fs::read_to_string(freeze)?.trim() == "1";
                let frozen = fs::read_to_string(events)?
                    .lines()
                    .find_map(|l| l.strip_prefix("frozen "))
                    .map(|v| v.trim() == "1");
                Ok(frozen.filter(|f| *f == want))
            }
        }
    }

    /// Freeze or thaw and wait (polling, a few ms at most in practice) until the kernel is
    /// done, for at most `budget`.
    pub fn set(&self, frozen: bool, budget: Duration) -> io::Result<()> {
        let deadline = Instant::now() + budget;
        let mut nap = Duration::from_micros(200);
        self.request(frozen)?;
        loop {
            if self.state()? == Some(frozen) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the cgroup was not {} within {budget:?}",
                        if frozen { "frozen" } else { "thawed" }
                    ),
                ));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(10));
            // v1 can stall in FREEZING when a task sits in an uninterruptible sleep; writing
            // the state again retries the freeze.
            self.request(frozen)?;
        }
    }
}

/// Thaw without waiting, ignoring errors: for teardown after SIGKILL.
pub fn thaw_now(freezer: Option<Freezer>) {
    if let Some(f) = freezer {
        let _ = f.request(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_freezes_and_thaws_through_freezer_state() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("freezer.state");
        fs::write(&state, "THAWED\n").unwrap();
        let f = Freezer::V1 {
            state: state.clone(),
        };
        assert_eq!(f.state().unwrap(), Some(false));
        // A plain file reads back what was written, like a kernel that freezes at once.
        f.set(true, Duration::from_millis(100)).unwrap();
        assert_eq!(fs::read_to_string(&state).unwrap(), "FROZEN");
        fs::write(&state, "FREEZING\n").unwrap();
        assert_eq!(f.state().unwrap(), None);
        f.set(false, Duration::from_millis(100)).unwrap();
        assert_eq!(fs::read_to_string(&state).unwrap(), "THAWED");
    }

    #[test]
    fn v2_waits_for_cgroup_events() {
        let t = tempfile::tempdir().unwrap();
        let f = Freezer::V2 {
            freeze: t.path().join("cgroup.freeze"),
            events: t.path().join("cgroup.events"),
        };
        fs::write(t.path().join("cgroup.freeze"), "0\n").unwrap();
        fs::write(t.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert_eq!(f.state().unwrap(), Some(false));
        // The kernel has not reported the freeze: the wait times out.
        let e = f.set(true, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            fs::read_to_string(t.path().join("cgroup.freeze")).unwrap(),
            "1"
        );
        fs::write(t.path().join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        f.set(true, Duration::from_millis(20)).unwrap();
        f.request(false).unwrap();
        assert_eq!(f.state().unwrap(), None, "thaw requested, not yet reported");
    }
}
