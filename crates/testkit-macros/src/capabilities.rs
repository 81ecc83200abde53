// Every host capability a test can require: the name of its `bulkhead_testkit::Capability`
// variant and what the test's `#[ignore]` reason says it needs. One table, `include!`d by the
// macro (for the reason) and by bulkhead-testkit (for its messages), so the two cannot drift.
// (Plain comments: an `include!`d fragment cannot carry inner `//!` docs.)

/// `(variant, needs)`: `needs` reads after "requires ".
const CAPABILITIES: &[(&str, &str)] = &[
    ("Root", "root (namespaces, mounts, cgroups)"),
    ("Tun", "/dev/net/tun"),
    (
        "KernelVenv",
        "Jupyter kernels in a venv (BULKHEAD_TEST_KERNEL_VENV)",
    ),
    ("Postgres", "PostgreSQL (BULKHEAD_TEST_POSTGRES_URL)"),
    (
        "ExtraCaBundle",
        "a PEM bundle to trust (BULKHEAD_TEST_EXTRA_CA)",
    ),
    ("Criu", "CRIU 4.2+ (`$BULKHEAD_CRIU` or `criu`)"),
    (
        "Qemu",
        "QEMU (`qemu-system-x86_64`; KVM when the host has it, TCG otherwise)",
    ),
    (
        "GuestKernel",
        "the microvm guest kernel (BULKHEAD_GUEST_KERNEL, from scripts/guest-kernel.sh)",
    ),
];
