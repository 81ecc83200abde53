//! Shared harness for the microvm integration tests: a small template tree made of host tools
//! (`bulkhead_testkit::rootfs`), a private state dir and uid range per test, the real
//! `bulkhead-agent` in the guest, an HTTP client over `Driver::connect`, and leak checks. The
//! tests are gated with `#[requires(Root, Qemu, GuestKernel)]`; they run under TCG where the host
//! has no usable KVM.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bulkhead_driver::{Driver, DriverHandle, SandboxSpec};
use bulkhead_envd::connect::{
    CONTENT_TYPE_CONNECT_JSON, EnvelopeDecoder, StreamFrame, encode_message,
};
use bulkhead_envd::process::process_event::Event;
use bulkhead_envd::process::process_event::data_event::Output;
use bulkhead_envd::process::{ProcessConfig, StartRequest, StartResponse};
use bulkhead_images::{ImageCache, LogProgress, TemplateRecipe};
use bulkhead_microvm::{MicrovmConfig, MicrovmDriver};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

pub const MAX_SLOTS: u32 = 8;
static COUNTER: AtomicU32 = AtomicU32::new(0);

const TOOLS: [&str; 8] = ["sh", "cat", "ls", "id", "sleep", "echo", "mkdir", "head"];

/// `target/debug/bulkhead-agent` next to this test binary (`cargo build -p bulkhead-agent`).
pub fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let agent = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("bulkhead-agent"))
        .unwrap();
    assert!(
        agent.is_file(),
        "{} is missing: run `cargo build -p bulkhead-agent` first",
        agent.display()
    );
    agent
}

/// A minimal template tree: a few host tools, their libraries, users `root` and `user`.
pub fn build_rootfs(root: &Path) {
    bulkhead_testkit::rootfs::Rootfs {
        tools: &TOOLS,
        libs_of: &[],
        dirs: &["home/user", "root", "tmp", "proc", "dev", "sys", "run"],
    }
    .build(root);
    std::os::unix::fs::chown(root.join("home/user"), Some(1000), Some(1000)).unwrap();
    // Fixed times make the tree's fingerprint the same in every test and run, so the shared
    // image cache holds one test image, not one per test.
    let status = Command::new("find")
        .arg(root)
        .args(["-exec", "touch", "-h", "-d", "@1700000000", "{}", "+"])
        .status()
        .expect("run find");
    assert!(status.success());
}

/// The `base` template tree, built into the image cache when missing.
pub async fn base_tree() -> PathBuf {
    let cache = ImageCache::new(
        std::env::var_os("BULKHEAD_IMAGE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| bulkhead_images::DEFAULT_CACHE_ROOT.into()),
    );
    cache
        .build(&TemplateRecipe::base(), &LogProgress::new())
        .await
        .expect("the base template")
}

/// One test's private world.
pub struct Env {
    /// Everything of the test; deleted when the test ends.
    _tmp: tempfile::TempDir,
    pub rootfs: PathBuf,
    pub cfg: MicrovmConfig,
}

impl Env {
    pub fn new() -> Env {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let tmp = tempfile::Builder::new().prefix("bhvm").tempdir().unwrap();
        // QEMU runs as an unprivileged uid and must traverse to its slot.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let rootfs = tmp.path().join("rootfs");
        build_rootfs(&rootfs);
        let kernel = bulkhead_testkit::guest_kernel().expect("BULKHEAD_GUEST_KERNEL");
        let mut cfg = MicrovmConfig::new(
            tmp.path().join("vm"),
            // Shared images are cached across tests and runs, like the server's.
            std::env::var_os("BULKHEAD_CACHE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/var/cache/bulkhead".into()),
            kernel,
            agent_binary(),
        );
        // Disjoint uid ranges keep concurrently running tests apart.
        cfg.uid_base = 1_500_000_000 + (std::process::id() % 4096) * 4096 + n * MAX_SLOTS;
        cfg.max_slots = MAX_SLOTS;
        cfg.disk_mb = 256;
        cfg.start_timeout = Duration::from_secs(120);
        // Every test's template tree is new: its snapshots go with the test, not the cache.
        cfg.snapshot_dir = tmp.path().join("snap");
        Env {
            _tmp: tmp,
            rootfs,
            cfg,
        }
    }

    pub fn driver(&self) -> MicrovmDriver {
        MicrovmDriver::new(self.cfg.clone()).expect("create the microvm driver")
    }

    pub fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        self.spec_for(&self.rootfs, memory_mb, pids_max)
    }

    pub fn spec_for(&self, rootfs: &Path, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        SandboxSpec {
            disk_mb: 0,
            template_id: "test".into(),
            rootfs: rootfs.to_path_buf(),
            cpu_count: 1,
            memory_mb,
            pids_max,
            volumes: Vec::new(),
        }
    }

    /// Host processes whose real uid is in this test's range (QEMUs).
    pub fn processes(&self) -> Vec<i32> {
        let range = self.cfg.uid_base..self.cfg.uid_base + MAX_SLOTS;
        bulkhead_testkit::rootfs::processes_of(range)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect()
    }

    pub fn assert_clean(&self) {
        // A QEMU killed a moment ago is a zombie until the driver's reaper task has run: give
        // it a bounded moment; one that stays is a leak.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut procs = self.processes();
        while !procs.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            procs = self.processes();
        }
        assert!(procs.is_empty(), "QEMU processes left: {procs:?}");
        let slots: Vec<_> = fs::read_dir(self.cfg.state_dir.join("s"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(slots.is_empty(), "slot directories left: {slots:?}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: killing a leftover QEMU of this test's uid range.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// One HTTP request to the agent over `Driver::connect`; (status, body).
pub async fn call<D: Driver>(
    d: &D,
    h: &DriverHandle,
    req: Request<Full<Bytes>>,
) -> (StatusCode, Bytes) {
    let stream = d.connect(h).await.expect("connect to the agent");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = tokio::time::timeout(Duration::from_secs(60), sender.send_request(req))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    (status, body)
}

/// Runs `script` with `/bin/sh -c` through the agent's process API; (exit code, stdout, stderr).
pub async fn run<D: Driver>(d: &D, h: &DriverHandle, script: &str) -> (i32, String, String) {
    let request = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..ProcessConfig::default()
        }),
        stdin: Some(false),
        ..StartRequest::default()
    };
    let req = Request::post("/process.Process/Start")
        .header("content-type", CONTENT_TYPE_CONNECT_JSON)
        .header("connect-protocol-version", "1")
        .header("host", "sandbox")
        .body(Full::new(encode_message(&request).unwrap()))
        .unwrap();
    let (status, body) = call(d, h, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let mut dec = EnvelopeDecoder::new();
    dec.push(&body);
    let (mut code, mut out, mut err) = (None, String::new(), String::new());
    while let Some(frame) = dec.next_frame::<StartResponse>().expect("valid envelopes") {
        match frame {
            StreamFrame::Message(m) => match m.event.and_then(|e| e.event) {
                Some(Event::Data(d)) => match d.output {
                    Some(Output::Stdout(b)) => out.push_str(&String::from_utf8_lossy(&b)),
                    Some(Output::Stderr(b)) => err.push_str(&String::from_utf8_lossy(&b)),
                    _ => {}
                },
                Some(Event::End(e)) => code = Some(e.exit_code),
                _ => {}
            },
            StreamFrame::End(_) => break,
        }
    }
    (code.expect("an end event"), out, err)
}
