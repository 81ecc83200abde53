//! Shared harness for the jail integration tests: a tiny template root filesystem made of host
//! binaries (`bulkhead_testkit::rootfs`), a private state dir / uid range / cgroup parent per
//! test, leak checks, and a failure naming the problem when the host cannot run jail sandboxes
//! (the tests are gated with `#[requires(Root, ...)]`, so plain `cargo test` reports them as
//! ignored).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bulkhead_driver::{Driver, DriverHandle, SandboxSpec};
use bulkhead_jail::cgroup::{self, CgroupBackend};
use bulkhead_jail::{JailConfig, JailDriver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const AGENT: &str = env!("CARGO_BIN_EXE_bulkhead-jail-test-agent");
pub const LAUNCHER: &str = env!("CARGO_BIN_EXE_bulkhead-jail-launcher");
pub const MAX_SLOTS: u32 = 8;
/// The uids of one test's slots.
const TEST_UIDS: u32 = MAX_SLOTS * bulkhead_jail::IDS_PER_SLOT;
/// Tests of one process (the `it` binary) before their uid ranges repeat.
const TESTS_PER_PROCESS: u32 = 128;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// One test's private world. Dropping it kills leftovers and unmounts/deletes everything.
pub struct Env {
    tmp: tempfile::TempDir,
    pub rootfs: PathBuf,
    pub cfg: JailConfig,
}

const TOOLS: [&str; 16] = [
    "sh", "cat", "ls", "id", "sleep", "touch", "mkdir", "rm", "stat", "head", "chown", "echo",
    "wc", "dd", "ln", "md5sum",
];

/// A minimal template: a few host tools plus the libraries they and the test agent need, and
/// the usual top-level directories. Owned by host root, like a real template.
pub fn build_rootfs(root: &Path) {
    bulkhead_testkit::rootfs::Rootfs {
        tools: &TOOLS,
        libs_of: &[Path::new(AGENT)],
        dirs: &[
            "home",
            "root",
            "tmp",
            "var",
            "usr/local",
            "proc",
            "dev",
            "sys",
            "run",
            "mnt",
        ],
    }
    .build(root);
    fs::write(root.join("etc/hostname"), "template\n").unwrap();
}

impl Env {
    /// Fails the test when the host cannot run jail sandboxes (see [`JailDriver::probe`]).
    pub fn new() -> Env {
        bulkhead_testkit::require_host(
            "a host the jail driver supports",
            &JailDriver::probe().problems,
            "run as root on Linux >= 5.19 with user namespaces, overlayfs, seccomp and a \
             writable cgroup hierarchy",
        );
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let tmp = tempfile::Builder::new().prefix("bhj").tempdir().unwrap();
        // Sandbox uids must be able to traverse to their slot and to the template view.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let rootfs = tmp.path().join("rootfs");
        build_rootfs(&rootfs);
        // Disjoint uid ranges and cgroup parents keep concurrently running tests apart, in this
        // process and in up to 32 others.
        let uid_base = 2_000_000_000
            + (std::process::id() % 32) * TESTS_PER_PROCESS * TEST_UIDS
            + (n % TESTS_PER_PROCESS) * TEST_UIDS;
        let cfg = JailConfig {
            state_dir: tmp.path().join("j"),
            agent_binary: AGENT.into(),
            launcher: vec![LAUNCHER.into()],
            agent_args: Vec::new(),
            uid_base,
            max_slots: MAX_SLOTS,
            cgroup_parent: format!("bulkhead-test-{}-{n}", std::process::id()),
            start_timeout: Duration::from_secs(30),
            sandbox_ca_pem: None,
            nameserver: None,
            criu: Some(bulkhead_testkit::criu_binary()),
        };
        Env { tmp, rootfs, cfg }
    }

    pub fn driver(&self) -> JailDriver {
        JailDriver::new(self.cfg.clone()).expect("create the jail driver")
    }

    pub fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        SandboxSpec {
            disk_mb: 0,
            template_id: "test".into(),
            rootfs: self.rootfs.clone(),
            cpu_count: 1,
            memory_mb,
            pids_max,
            volumes: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    pub fn uid_range(&self) -> std::ops::Range<u32> {
        self.cfg.uid_base..self.cfg.uid_base + TEST_UIDS
    }

    pub fn cgroups(&self) -> Box<dyn CgroupBackend> {
        cgroup::detect(&self.cfg.cgroup_parent).unwrap()
    }

    /// Host processes whose real uid is in this test's range.
    pub fn processes(&self) -> Vec<(i32, u32)> {
        bulkhead_testkit::rootfs::processes_of(self.uid_range())
    }

    /// Mount points under this test's directory (host mount namespace).
    pub fn mounts(&self) -> Vec<PathBuf> {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        info.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(self.tmp.path()))
            .collect()
    }

    /// Nothing of any sandbox is left: no processes in our uid range, no mounts but the
    /// reusable idmapped lowers, no cgroups, no slot directories.
    pub fn assert_clean(&self) {
        let procs = self.processes();
        assert!(procs.is_empty(), "sandbox processes left behind: {procs:?}");
        let lowers = self.cfg.state_dir.join("l");
        let stray: Vec<_> = self
            .mounts()
            .into_iter()
            .filter(|m| !m.starts_with(&lowers))
            .collect();
        assert!(stray.is_empty(), "mounts left behind: {stray:?}");
        let cgs = self.cgroups().list().unwrap();
        assert!(cgs.is_empty(), "cgroups left behind: {cgs:?}");
        let slots: Vec<_> = fs::read_dir(self.cfg.state_dir.join("s"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(slots.is_empty(), "slot directories left behind: {slots:?}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Safety net for failed tests: kill what runs in our cgroups and uid range, drop the
        // cgroups, unmount the idmapped lowers, then let TempDir delete the files.
        if let Ok(be) = cgroup::detect(&self.cfg.cgroup_parent) {
            for name in be.list().unwrap_or_default() {
                let _ = be.kill_all(&name);
                let _ = cgroup::remove_with_retry(be.as_ref(), &name, Duration::from_secs(5));
            }
            for d in be.dirs("x") {
                if let Some(parent) = d.parent() {
                    let _ = fs::remove_dir(parent);
                }
            }
        }
        for (pid, _) in self.processes() {
            // SAFETY: killing a leftover sandbox process of this test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let mut mounts = self.mounts();
        mounts.sort();
        for m in mounts.iter().rev() {
            let _ = bulkhead_jail::sys::umount_detach(m);
        }
    }
}

/// Send one request to the test agent and read its whole reply.
pub async fn ask(driver: &JailDriver, h: &DriverHandle, req: &str) -> String {
    let mut s = driver.connect(h).await.expect("connect to the agent");
    s.write_all(format!("{req}\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Run a shell script in the sandbox: (first line, rest).
pub async fn sh(driver: &JailDriver, h: &DriverHandle, script: &str) -> (String, String) {
    let out = ask(driver, h, &format!("sh {script}")).await;
    let (head, body) = out.split_once('\n').unwrap_or((&out, ""));
    (head.to_string(), body.to_string())
}

pub fn stats(label: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{label}: n={} median {:.1} ms, min {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        v.len(),
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() * 9 / 10]),
        ms(v[v.len() - 1])
    )
}

/// An error and its causes, joined by `: ` (driver errors keep their causes in `source()`).
pub use bulkhead_common::error_chain as chain;
