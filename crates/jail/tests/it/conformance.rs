//! The driver conformance suite (`bulkhead_driver::conformance`) against real jail sandboxes,
//! as root: one private state dir, uid range and cgroup parent per case (see `common::Env`).
//! Jail-only behaviour (isolation, hardening, OOM, DNS and CA files) stays in `jail.rs`.

use crate::common::{Env, sh};
use bulkhead_driver::conformance::Harness;
use bulkhead_driver::{DriverHandle, SandboxSpec};
use bulkhead_jail::JailDriver;

struct JailHarness {
    env: Env,
}

impl Harness for JailHarness {
    type Driver = JailDriver;

    fn driver(&self) -> JailDriver {
        self.env.driver()
    }

    fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        self.env.spec(memory_mb, pids_max)
    }

    fn kill_init(&self, handle: &DriverHandle) {
        // SAFETY: killing the init of a sandbox this test started.
        unsafe { libc::kill(handle.pid, libc::SIGKILL) };
    }

    fn assert_clean(&self) {
        self.env.assert_clean();
    }

    async fn write_file(&self, d: &JailDriver, h: &DriverHandle, path: &str, content: &str) {
        // One line to the test agent: the content's newlines as printf escapes.
        let script = format!("printf '{}' > {path}", content.replace('\n', "\\n"));
        let (status, out) = sh(d, h, &script).await;
        assert_eq!(status, "exit 0", "{script}: {out}");
    }

    fn in_background(&self, h: &DriverHandle) -> bool {
        // The smallest CPU weight of the sandbox's cgroup (v1 `cpu.shares`, v2 `cpu.weight`).
        let name = h.data["cgroup"]
            .as_str()
            .expect("the handle names its cgroup");
        let weight = self
            .env
            .cgroups()
            .dirs(name)
            .iter()
            .find_map(|d| {
                ["cpu.shares", "cpu.weight"]
                    .iter()
                    .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
            })
            .unwrap_or_else(|| panic!("no CPU weight for cgroup {name}"));
        match weight.trim() {
            "2" | "1" => true,
            "1024" | "100" => false,
            other => panic!("unexpected CPU weight {other} of cgroup {name}"),
        }
    }
}

bulkhead_driver::conformance_tests!(
    JailHarness { env: Env::new() };
    #[bulkhead_testkit::requires(Root, Criu, "a host the jail driver supports")]
);
