//! The driver conformance suite (`bulkhead_driver::conformance`) against real jail sandboxes,
//! as root: one private state dir, uid range and cgroup parent per case (see `common::Env`).
//! Jail-only behaviour (isolation, hardening, OOM, DNS and CA files) stays in `jail.rs`.

mod common;

use bulkhead_driver::conformance::Harness;
use bulkhead_driver::{DriverHandle, SandboxSpec};
use bulkhead_jail::JailDriver;
use common::Env;

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
}

bulkhead_driver::conformance_tests!(
    JailHarness { env: Env::new() };
    #[bulkhead_testkit::requires(Root, Criu, "a host the jail driver supports")]
);
