//! The driver conformance suite without root: against [`FakeDriver`], and against the
//! per-template router [`ByTemplate`] over two fakes (every case's sandboxes start on the
//! template's driver, not the default one).

use std::collections::HashMap;
use std::sync::Arc;

use bulkhead_driver::conformance::Harness;
use bulkhead_driver::{ByTemplate, Driver, DriverHandle, FakeDriver, FakeHost, SandboxSpec};

fn spec(template_id: &str, memory_mb: u64, pids_max: u64) -> SandboxSpec {
    SandboxSpec {
        disk_mb: 0,
        template_id: template_id.into(),
        rootfs: "/nonexistent".into(),
        cpu_count: 1,
        memory_mb,
        pids_max,
        volumes: Vec::new(),
    }
}

fn assert_no_sandboxes(host: &FakeHost) {
    let alive = FakeDriver::on_host(host).alive.lock().unwrap().clone();
    assert!(alive.is_empty(), "fake sandboxes left running: {alive:?}");
}

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
        spec("base", memory_mb, pids_max)
    }

    fn kill_init(&self, handle: &DriverHandle) {
        FakeDriver::on_host(&self.host).crash(handle.pid);
    }

    fn assert_clean(&self) {
        assert_no_sandboxes(&self.host);
    }

    async fn write_file(&self, d: &FakeDriver, h: &DriverHandle, path: &str, content: &str) {
        d.write_file(h.pid, path, content);
    }

    fn in_background(&self, h: &DriverHandle) -> bool {
        self.driver().in_background(h.pid)
    }
}

/// The suite's sandboxes run on the driver of template `vm` (a fake named `fake-vm` on a host of
/// its own); the default driver (`fake`) runs every other template and must not be disturbed.
#[derive(Default)]
struct RouterHarness {
    default_host: FakeHost,
    vm_host: FakeHost,
}

const VM_DRIVER: &str = "fake-vm";

impl RouterHarness {
    fn fake_for(&self, h: &DriverHandle) -> FakeDriver {
        assert_eq!(h.driver, VM_DRIVER, "routed to the template's driver");
        FakeDriver::named(&self.vm_host, VM_DRIVER)
    }
}

impl Harness for RouterHarness {
    type Driver = ByTemplate;

    fn driver(&self) -> ByTemplate {
        let vm: Arc<dyn Driver> = Arc::new(FakeDriver::named(&self.vm_host, VM_DRIVER));
        ByTemplate::new(
            Arc::new(FakeDriver::on_host(&self.default_host)),
            HashMap::from([("vm".to_string(), vm)]),
        )
    }

    fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        spec("vm", memory_mb, pids_max)
    }

    fn kill_init(&self, handle: &DriverHandle) {
        self.fake_for(handle).crash(handle.pid);
    }

    fn assert_clean(&self) {
        assert_no_sandboxes(&self.vm_host);
        assert_no_sandboxes(&self.default_host);
    }

    async fn write_file(&self, _d: &ByTemplate, h: &DriverHandle, path: &str, content: &str) {
        self.fake_for(h).write_file(h.pid, path, content);
    }

    fn in_background(&self, h: &DriverHandle) -> bool {
        self.fake_for(h).in_background(h.pid)
    }
}

mod fake {
    use super::FakeHarness;
    bulkhead_driver::conformance_tests!(FakeHarness::default());
}

mod by_template {
    use super::RouterHarness;
    bulkhead_driver::conformance_tests!(RouterHarness::default());
}
