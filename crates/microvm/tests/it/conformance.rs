//! The driver conformance suite (`bulkhead_driver::conformance`) against real QEMU microVMs
//! running the real agent, as root; under TCG where the host has no hardware KVM.

use crate::common::{Env, run};
use bulkhead_driver::conformance::Harness;
use bulkhead_driver::{DriverHandle, SandboxSpec};
use bulkhead_microvm::MicrovmDriver;

struct VmHarness {
    env: Env,
}

impl Harness for VmHarness {
    type Driver = MicrovmDriver;

    fn driver(&self) -> MicrovmDriver {
        self.env.driver()
    }

    fn spec(&self, memory_mb: u64, pids_max: u64) -> SandboxSpec {
        self.env.spec(memory_mb, pids_max)
    }

    fn kill_init(&self, handle: &DriverHandle) {
        // The VM's "init" on the host is its QEMU process.
        // SAFETY: killing the QEMU of a sandbox this test started.
        unsafe { libc::kill(handle.pid, libc::SIGKILL) };
    }

    fn assert_clean(&self) {
        self.env.assert_clean();
    }

    async fn write_file(&self, d: &MicrovmDriver, h: &DriverHandle, path: &str, content: &str) {
        let script = format!("printf '{}' > {path}", content.replace('\n', "\\n"));
        let (code, _, err) = run(d, h, &script).await;
        assert_eq!(code, 0, "{script}: {err}");
    }

    fn in_background(&self, _h: &DriverHandle) -> bool {
        // QEMU's cgroup keeps the normal CPU weight (the driver does not claim `warm_start`).
        false
    }
}

bulkhead_driver::conformance_tests!(
    VmHarness { env: Env::new() };
    #[bulkhead_testkit::requires(Root, Qemu, GuestKernel)]
);
