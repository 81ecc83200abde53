//! The driver conformance suite against [`FakeDriver`]: every case, no root needed.

use bulkhead_driver::conformance::Harness;
use bulkhead_driver::{DriverHandle, FakeDriver, FakeHost, SandboxSpec};

/// One fake host per case; every `driver()` is a new "server run" on it.
#[derive(Default)]
struct FakeHarness {
    host: FakeHost,
}

impl Harness for FakeHarness {
    type Driver = FakeDriver;

    fn driver(&self) -> FakeDriver {
        FakeDriver::on_host(&self.host)
    }

    fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        SandboxSpec {
            disk_mb: 0,
            template_id: "base".into(),
            rootfs: "/nonexistent".into(),
            cpu_count: 1,
            memory_mb,
            pids_max,
            volumes: Vec::new(),
        }
    }

    fn kill_init(&self, handle: &DriverHandle) {
        FakeDriver::on_host(&self.host).crash(handle.pid);
    }

    fn assert_clean(&self) {
        let alive = self.driver().alive.lock().unwrap().clone();
        assert!(alive.is_empty(), "fake sandboxes left running: {alive:?}");
    }
}

bulkhead_driver::conformance_tests!(FakeHarness::default());
